-- Recorded effects (schema version 2 and up). ``record_key`` is the JSON text of the key
-- and ``detail`` JSON text (or NULL), both kept exactly as given; ``outcome`` is NULL
-- until settled, ``reconciled_at`` until reconciled.
CREATE TABLE IF NOT EXISTS fencing_effects (
 idempotency_key TEXT PRIMARY KEY, scope TEXT NOT NULL, record_key TEXT NOT NULL,
 intent_id TEXT NOT NULL, transition TEXT NOT NULL, name TEXT NOT NULL,
 status TEXT NOT NULL, detail TEXT, outcome TEXT, reconciled_at DOUBLE PRECISION,
 recorded_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL);

CREATE INDEX IF NOT EXISTS fencing_effects_intent ON fencing_effects (scope, intent_id);

-- the effects that need reconciling, in listing order
CREATE INDEX IF NOT EXISTS fencing_effects_open ON fencing_effects
 (recorded_at, idempotency_key) WHERE outcome IS NOT NULL AND reconciled_at IS NULL;
