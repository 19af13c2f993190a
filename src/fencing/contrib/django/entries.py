"""Two models without a table, so that the admin lists fencing's recorded effects and
outbox under the ``fencing`` app, with Django's permissions (``fencing.view_effect``,
``fencing.change_effect``, ``fencing.view_outboxrow``, ``fencing.change_outboxrow``,
``fencing.delete_outboxrow``). Nothing ever queries them: the admin pages read and
change fencing's tables through the store's own API (``store().effects_to_reconcile()``,
``store().outbox.dead()``, ...), see :mod:`fencing.contrib.django.admin`."""

from __future__ import annotations

from django.db import models

__all__ = ["Effect", "OutboxRow"]


class Effect(models.Model):  # type: ignore[misc]
    """The admin's entry for fencing's recorded effects (no table: never queried)."""

    class Meta:
        managed = False
        db_table = "fencing_admin_no_table_effect"
        verbose_name = "recorded effect"
        default_permissions = ("view", "change")


class OutboxRow(models.Model):  # type: ignore[misc]
    """The admin's entry for fencing's outbox (no table: never queried)."""

    class Meta:
        managed = False
        db_table = "fencing_admin_no_table_outbox"
        verbose_name = "outbox row"
        default_permissions = ("view", "change", "delete")
