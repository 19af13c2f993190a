"""fencing's tables (records, applied intents, leases, outbox, ...)"""

from alembic import op

from fencing.contrib.alembic import downgrade_fencing, upgrade_fencing

revision = "0002_fencing"
down_revision = "0001_shop"


def upgrade() -> None:
    upgrade_fencing(op)  # what `fencing migrate URL` runs, on the migration's connection


def downgrade() -> None:
    downgrade_fencing(op)
