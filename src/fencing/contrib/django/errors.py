"""The error a stale ``save()`` raises."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

from fencing import FencingError

__all__ = ["StaleSave"]


class StaleSave(FencingError, DatabaseError):  # type: ignore[misc]
    """A ``save()`` (or ``bulk_update``, or ``intent()``) of an instance whose row moved on
    since the instance was loaded: nothing was written.

    ``instance``: the stale instance (its ``version`` is the one it was loaded at);
    ``version``: that version; ``current``: the row as it is now, a fresh instance of
    the model, or None if the row was deleted; ``current_version``: its version (None if
    deleted). A ``DatabaseError`` too, as Django's own "Forced update did not affect any
    rows" is; the transaction it was raised in is still usable (nothing failed in it).
    """

    def __init__(
        self, instance: Any, version: int | None, current: Any, current_version: int | None
    ):
        self.instance = instance
        self.version = version
        self.current = current
        self.current_version = current_version
        now = "was deleted" if current is None else f"is at version {current_version}"
        super().__init__(
            f"{type(instance).__name__} {instance.pk!r} was loaded at version {version} and"
            f" {now} now: reload it and decide again (nothing was written)"
        )
