-- fencing's own tables on MySQL / MariaDB (InnoDB). Each statement is sent as one line:
-- its lines, stripped, joined by a space (comment lines are left out).
-- Names and ids are ASCII by validation: CHARACTER SET ascii COLLATE ascii_bin.

CREATE TABLE IF NOT EXISTS fencing_schema (
  component VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  version INT NOT NULL) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS fencing_records (
  collection VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  `key` VARBINARY(2048) NOT NULL,
  version BIGINT NOT NULL,
  fence BIGINT NOT NULL DEFAULT 0,
  state LONGTEXT NOT NULL,
  updated_at DECIMAL(20,6) NOT NULL,
  PRIMARY KEY (collection, `key`)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS fencing_applied (
  scope VARCHAR(130) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  intent_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  key_text VARBINARY(2050) NOT NULL,
  applied_at DECIMAL(20,6) NOT NULL,
  PRIMARY KEY (scope, intent_id, key_text),
  KEY fencing_applied_at (applied_at)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS fencing_fences (
  scope VARCHAR(130) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  key_text VARBINARY(2050) NOT NULL,
  fence BIGINT NOT NULL,
  PRIMARY KEY (scope, key_text)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS fencing_leases (
  name VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  owner VARCHAR(200) NULL,
  token BIGINT NOT NULL,
  expires_at DECIMAL(20,6) NOT NULL) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- the last version of a deleted record: a re-created record continues after it
CREATE TABLE IF NOT EXISTS fencing_tombstones (
  collection VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  `key` VARBINARY(2048) NOT NULL,
  version BIGINT NOT NULL,
  PRIMARY KEY (collection, `key`)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- recorded effects (fencing._effects): the columns of EFFECT_COLUMNS, then
-- open_since, recorded_at of an effect that needs reconciling (else NULL): its
-- index stands in for a partial index (neither server has one), so the effects to
-- reconcile are read in order from the index, never by scanning the settled ones
CREATE TABLE IF NOT EXISTS fencing_effects (
  idempotency_key CHAR(43) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
  scope VARCHAR(130) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  record_key TEXT NOT NULL,
  intent_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  transition VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  name VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  status VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  detail LONGTEXT NULL,
  outcome VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL,
  reconciled_at DOUBLE NULL,
  recorded_at DOUBLE NOT NULL,
  updated_at DOUBLE NOT NULL,
  open_since DOUBLE GENERATED ALWAYS AS
  (IF(outcome IS NOT NULL AND reconciled_at IS NULL, recorded_at, NULL)) STORED,
  KEY fencing_effects_intent (scope, intent_id, recorded_at),
  KEY fencing_effects_open (open_since)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- the transactional outbox (schema version 4 and up; fencing._outbox): the columns of
-- OUTBOX_COLUMNS, then two stored columns that stand in for partial indexes: a row's
-- kind and key while it is pending: unsent and not dead (else NULL), so a claim and the
-- stats read pending rows from their indexes, never the sent history nor the dead rows;
-- the indexes cover what a claim's key check (claimed_until) and the stats (created_at)
-- read (schema version 5), so neither looks a row up: a big backlog made the optimizer
-- scan the table instead. Schema version 6 added strikes and dead_at (schema.py's
-- _DEAD_ROWS upgrades a table of version 4 or 5); schema version 7 added superseded_at,
-- due_at and burst_at (superseded and debounced rows; a superseded row has sent_at too,
-- so it leaves the pending columns) and due_at and kind to the key's index (_SUPERSEDED_ROWS)
CREATE TABLE IF NOT EXISTS fencing_outbox (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  kind VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  task VARCHAR(512) NOT NULL,
  queue VARCHAR(255) NULL,
  payload LONGTEXT NOT NULL,
  options LONGTEXT NOT NULL,
  okey VARCHAR(512) NOT NULL,
  created_at DOUBLE NOT NULL,
  attempts INT NOT NULL DEFAULT 0,
  last_error TEXT NULL,
  claim_token BIGINT NULL,
  claimed_by VARCHAR(255) NULL,
  claimed_until DOUBLE NULL,
  sent_at DOUBLE NULL,
  strikes INT NOT NULL DEFAULT 0,
  dead_at DOUBLE NULL,
  superseded_at DOUBLE NULL,
  due_at DOUBLE NULL,
  burst_at DOUBLE NULL,
  unsent_kind VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin
  GENERATED ALWAYS AS (IF(sent_at IS NULL AND dead_at IS NULL, kind, NULL)) STORED,
  unsent_key VARCHAR(512)
  GENERATED ALWAYS AS (IF(sent_at IS NULL AND dead_at IS NULL, okey, NULL)) STORED,
  KEY fencing_outbox_unsent (unsent_kind, id, created_at),
  KEY fencing_outbox_key (unsent_key, id, claimed_until, due_at, kind),
  KEY fencing_outbox_sent (sent_at),
  KEY fencing_outbox_dead (dead_at),
  KEY fencing_outbox_superseded (superseded_at, kind)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- claim tokens: AUTO_INCREMENT, so a token is never handed out twice (InnoDB keeps
-- the counter across restarts on MariaDB 10.2.4+ / MySQL 8)
CREATE TABLE IF NOT EXISTS fencing_outbox_claims (
  token BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  relay VARCHAR(255) NOT NULL,
  claimed_at DOUBLE NOT NULL,
  KEY fencing_outbox_claims_at (claimed_at)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
