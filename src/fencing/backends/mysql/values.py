"""What MySQL/MariaDB is given for a column value beyond JSON (``_types.EXTENDED``).

PyMySQL and aiomysql render ``Decimal``, ``date``, naive ``datetime`` and ``time``,
``timedelta`` and ``bytes`` themselves, and read a ``TIME`` column as a ``timedelta``.
fencing gives them the rest:

* ``UUID``: its text, ``"0f8fad5b-d9cb-469f-a165-70867728950e"`` (MariaDB's ``UUID``
  type, or a ``CHAR(36)`` column; aiomysql would not render a ``UUID`` at all);
* an aware ``datetime`` or ``time``: refused (``InvalidState``): a ``DATETIME``, ``TIME``
  or ``TIMESTAMP`` literal holds no zone, and the drivers would drop the offset
  silently; write a naive value (in UTC, as the store's session ``time_zone`` is
  ``+00:00``: ``value.astimezone(timezone.utc).replace(tzinfo=None)``).

A guard binds the same, compared by the server (``<=>``) as the UPDATE compares it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from typing import Any, Final

from ..._errors import InvalidState

__all__ = ["bind", "bound"]

_NATIVE: Final = frozenset({str, int, float, bytes, bool, type(None)})


def bind(value: Any) -> Any:
    """The parameter the driver is given for a (checked) column value."""
    kind = type(value)
    if kind is uuid.UUID:
        return str(value)
    if (kind is dt.datetime or kind is dt.time) and value.tzinfo is not None:
        raise InvalidState(
            f"mysql: a column cannot hold an aware {kind.__name__} ({value.isoformat()}):"
            " a DATETIME, TIME or TIMESTAMP literal has no time zone, which the driver"
            " would drop; write it naive, e.g. in UTC:"
            " value.astimezone(timezone.utc).replace(tzinfo=None)"
        )
    return value


def bound(values: Iterable[Any]) -> list[Any]:
    """``bind`` over values, as a list (a plain copy when all are the driver's own)."""
    out = list(values)
    for value in out:
        if type(value) not in _NATIVE:
            return [bind(v) for v in out]
    return out
