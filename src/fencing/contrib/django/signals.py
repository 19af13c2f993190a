"""``fenced_commit``: sent for each commit fencing makes on a Django model's table."""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["fenced_commit"]

#: Sent after fencing committed a new state to a row of a model's table through a store
#: of :func:`fencing.contrib.django.store` (or a view of it on Django's connection):
#: ``sender`` the model, ``pk`` the row's key, ``version`` its new version,
#: ``intent_id`` the committed intent's id, ``using`` the database alias. Sent at once,
#: like ``post_save``: inside your transaction when the commit was made in one (use
#: ``transaction.on_commit`` in a receiver for anything that must wait for the commit).
#: Only committed outcomes are sent (not Stale, Duplicate, ...). What a receiver raises
#: is logged on the ``fencing`` logger; it does not undo the commit.
fenced_commit = Signal()
