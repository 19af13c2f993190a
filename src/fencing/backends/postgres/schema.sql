-- fencing's own tables on PostgreSQL (schema version 3), each statement idempotent;
-- ``schema.py`` runs them in one migration transaction, in the store's schema.
-- Collection keys are TEXT; keys in fencing_applied / fencing_fences are the JSON text
-- of the key ('"7"' and '7' differ), so a table's int and str keys cannot collide.
CREATE TABLE IF NOT EXISTS fencing_schema (
 component TEXT PRIMARY KEY, version INTEGER NOT NULL);

CREATE TABLE IF NOT EXISTS fencing_records (
 collection TEXT NOT NULL, key TEXT NOT NULL, version BIGINT NOT NULL,
 fence BIGINT NOT NULL DEFAULT 0, state JSONB NOT NULL,
 updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (collection, key));

CREATE TABLE IF NOT EXISTS fencing_applied (
 scope TEXT NOT NULL, intent_id TEXT NOT NULL, key TEXT NOT NULL,
 applied_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (scope, intent_id, key));

CREATE INDEX IF NOT EXISTS fencing_applied_at ON fencing_applied (applied_at);

CREATE TABLE IF NOT EXISTS fencing_fences (
 scope TEXT NOT NULL, key TEXT NOT NULL, fence BIGINT NOT NULL,
 PRIMARY KEY (scope, key));

CREATE TABLE IF NOT EXISTS fencing_leases (
 name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL,
 expires_at DOUBLE PRECISION NOT NULL);

-- the last version of a deleted record: a re-created record continues after it
CREATE TABLE IF NOT EXISTS fencing_tombstones (
 collection TEXT NOT NULL, key TEXT NOT NULL, version BIGINT NOT NULL,
 PRIMARY KEY (collection, key));
