"""What SQLite binds for a column value beyond its own types (``_types.EXTENDED``).

sqlite3 binds ``str``, ``int``, ``float``, ``bytes`` and ``None`` itself; fencing binds
the rest explicitly (not through sqlite3's adapters, deprecated since Python 3.12), as
text SQLite's own functions and most SQLite users read:

* ``Decimal``: positional text (``format(d, "f")``: ``"9.50"``, never ``"1E+2"``); a
  column of NUMERIC affinity (``NUMERIC``, ``DECIMAL(10,2)``) converts it to a number as
  SQLite does any numeric text, a ``TEXT`` column keeps it exactly;
* ``datetime``: ``isoformat(" ")``: ``"2026-12-03 10:00:00"``, with ``".ffffff"`` when
  there are microseconds and ``"+00:00"`` when aware (what ``datetime()`` and sqlite3's
  former adapter write, and what Django stores);
* ``date``, ``time``: ``isoformat()``: ``"2026-12-03"``, ``"10:00:00"``;
* ``UUID``: its 32 hex digits (``u.hex``), as SQLAlchemy's ``Uuid`` and Django's
  ``UUIDField`` store it in a ``CHAR(32)`` column;
* ``bytes``: a BLOB, as is;
* ``timedelta``: refused (``InvalidState``): SQLite has no interval, and no spelling of
  one is common enough to choose; store ``td.total_seconds()`` or text yourself.

A row reads back as the driver gives it (text, a number, bytes): fencing registers no
converter. A guard binds the same text as a write, and SQLite compares it (``IS ?``) with
the column's affinity, so a guard holds on a row written with the same value.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any, Final

from ..._errors import InvalidState

__all__ = ["bind", "bound"]

_NATIVE: Final = frozenset({str, int, float, bytes, bool, type(None)})


def bind(value: Any) -> Any:
    """The parameter SQLite is given for a (checked) column value."""
    kind = type(value)
    if kind in _NATIVE:
        return value
    if kind is Decimal:
        return format(value, "f")
    if kind is dt.datetime:
        return value.isoformat(" ")
    if kind is dt.date or kind is dt.time:
        return value.isoformat()
    if kind is uuid.UUID:
        return value.hex
    raise InvalidState(
        f"sqlite: a column cannot hold a {kind.__name__} (SQLite has no such type: store"
        " a number or text of your choice, e.g. td.total_seconds())"
    )


def bound(values: Any) -> list[Any]:
    """``bind`` over values, as a list (a plain copy when all are SQLite's own)."""
    out = list(values)
    for value in out:
        if type(value) not in _NATIVE:
            return [bind(v) for v in out]
    return out
