-- fencing's own tables on SQLite (schema version 5). Keys have no declared type, so a
-- string key and an integer key are stored as what they are.
CREATE TABLE IF NOT EXISTS fencing_schema (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_records (
    collection TEXT NOT NULL,
    key NOT NULL,
    version INTEGER NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (collection, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_applied (
    scope TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    key NOT NULL,
    applied_at REAL NOT NULL,
    PRIMARY KEY (scope, intent_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fencing_applied_at ON fencing_applied (applied_at);
CREATE TABLE IF NOT EXISTS fencing_fences (
    scope TEXT NOT NULL,
    key NOT NULL,
    fence INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_leases (
    name TEXT PRIMARY KEY,
    owner TEXT,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_tombstones (
    collection TEXT NOT NULL,
    key NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (collection, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencing_effects (
    idempotency_key TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    record_key TEXT NOT NULL,
    intent_id TEXT NOT NULL,
    transition TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    detail TEXT,
    outcome TEXT,
    reconciled_at REAL,
    recorded_at REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fencing_effects_intent ON fencing_effects (scope, intent_id);
CREATE INDEX IF NOT EXISTS fencing_effects_open ON fencing_effects (recorded_at)
    WHERE outcome IS NOT NULL AND reconciled_at IS NULL;
CREATE TABLE IF NOT EXISTS fencing_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    task TEXT NOT NULL,
    queue TEXT,
    payload TEXT NOT NULL,
    options TEXT NOT NULL,
    okey TEXT NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    claim_token INTEGER,
    claimed_by TEXT,
    claimed_until REAL,
    sent_at REAL,
    strikes INTEGER NOT NULL DEFAULT 0,
    dead_at REAL,
    superseded_at REAL,
    due_at REAL,
    burst_at REAL
);
CREATE INDEX IF NOT EXISTS fencing_outbox_unsent ON fencing_outbox (kind, id)
    WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS fencing_outbox_key ON fencing_outbox (okey, id)
    WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS fencing_outbox_sent ON fencing_outbox (sent_at)
    WHERE sent_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS fencing_outbox_claims (
    token INTEGER PRIMARY KEY AUTOINCREMENT,
    relay TEXT NOT NULL,
    claimed_at REAL NOT NULL
);
