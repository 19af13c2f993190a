"""Column values beyond JSON: what a guarded table's columns and a table intent's guard
take besides strings, numbers, booleans and None, and how an intent carries them. No I/O.

The types (``EXTENDED``): ``Decimal`` (finite), ``datetime`` (naive or aware), ``date``,
``time``, ``timedelta`` (what PyMySQL reads from a ``TIME`` column), ``UUID`` and
``bytes``; a ``bytearray`` or ``memoryview`` is taken as the ``bytes`` it holds, and an
``enum.Enum`` member as its ``.value`` (which must itself be a value a column takes).
Each backend binds them as its driver does, or refuses one it cannot hold (see
docs/types.md).

In an intent's JSON (format 2) a guard value of one of these types is a tagged object:
``{"$decimal": "9.50"}``, ``{"$datetime": "2026-12-03T10:00:00+00:00"}``, ``{"$date":
...}``, ``{"$time": ...}``, ``{"$timedelta": <microseconds>}``, ``{"$uuid": ...}``,
``{"$bytes": <base64>}``; lossless, and unambiguous, because a guard value is never a
JSON object otherwise (guards hold scalars only), so no plain value needs escaping. Each
tag's text is the one canonical spelling this module writes; any other spelling is
refused, so one value has one encoding.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import enum
import json
import math
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from ._errors import InvalidState

__all__ = [
    "EXTENDED",
    "as_carried",
    "column_value",
    "decimal_chars",
    "decode_tagged",
    "encode_tagged",
    "has_extended",
    "loosely_equal",
    "state_size",
    "type_name",
]

#: The column value types beyond JSON scalars (``datetime`` is a ``date``: test it first).
EXTENDED: Final = (Decimal, dt.datetime, dt.date, dt.time, dt.timedelta, uuid.UUID, bytes)
_PLAIN: Final = frozenset({str, int, float, bool, type(None)})
#: The widest a ``Decimal`` fencing takes may be written out positionally (``format(d,
#: "f")``, as SQLite binds it; a driver may expand it so too): a tiny text such as
#: ``"1E+999999999"`` would otherwise become a gigabyte the moment it is bound. Wider
#: than any SQL column holds (PostgreSQL's ``numeric``: 131072 digits before the point,
#: 16383 after); a state's Decimals count this width in its size bound too.
MAX_DECIMAL_CHARS: Final = 131_072 + 16_383 + 2


def decimal_chars(value: Decimal) -> int:
    """At least the length of ``format(value, "f")``, in constant time (never made)."""
    _, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # NaN, infinity: not a column value anyway
        return len(str(value))
    return len(digits) + abs(exponent) + 2


def type_name(value: object) -> str:
    return type(value).__name__


def column_value(value: object, what: str) -> Any:
    """``value`` as a column (or table guard) takes it: an ``EXTENDED`` value checked,
    a ``bytearray``/``memoryview`` as ``bytes``, an enum member as its checked value.
    Anything else raises ``InvalidState`` naming ``what`` (e.g. ``column 'total'``)."""
    if isinstance(value, enum.Enum):
        inner = value.value
        if isinstance(inner, enum.Enum):
            raise InvalidState(f"{what}: the enum {value!r} has an enum as its value")
        if type(inner) in _PLAIN:
            return _plain(inner, what)
        return column_value(inner, what)
    kind = type(value)
    if kind is Decimal:
        assert isinstance(value, Decimal)
        if not value.is_finite():
            raise InvalidState(f"{what} must be a finite Decimal, not {value}")
        if decimal_chars(value) > MAX_DECIMAL_CHARS:
            raise InvalidState(
                f"{what}: Decimal {value} is too wide: written out it takes more than"
                f" {MAX_DECIMAL_CHARS} characters (no SQL column holds it)"
            )
        return value
    if kind in (dt.datetime, dt.date, dt.time, dt.timedelta, uuid.UUID, bytes):
        return value
    if kind is bytearray or kind is memoryview:
        assert isinstance(value, bytearray | memoryview)
        return bytes(value)
    if isinstance(value, EXTENDED):
        # a subclass (pendulum's DateTime, a str-like UUID...): taken as its base type,
        # so the store and the intent never see a type they might not know
        return _as_base(value)
    raise InvalidState(
        f"{what} takes a string, number, boolean, None, Decimal, datetime, date, time,"
        f" timedelta, UUID or bytes (or an enum of those), not {kind.__name__}"
    )


def _plain(value: Any, what: str) -> Any:
    if type(value) is float and not math.isfinite(value):
        raise InvalidState(f"{what} must be finite")
    if type(value) is int and not -(2**63) <= value < 2**63:
        raise InvalidState(f"{what} takes integers within 64 bits")
    return value


def _as_base(value: Any) -> Any:
    if isinstance(value, Decimal):
        return column_value(Decimal(value), "a Decimal")
    if isinstance(value, dt.datetime):
        return dt.datetime(
            value.year,
            value.month,
            value.day,
            value.hour,
            value.minute,
            value.second,
            value.microsecond,
            value.tzinfo,
            fold=value.fold,
        )
    if isinstance(value, dt.date):
        return dt.date(value.year, value.month, value.day)
    if isinstance(value, dt.time):
        return dt.time(
            value.hour, value.minute, value.second, value.microsecond, value.tzinfo, fold=value.fold
        )
    if isinstance(value, dt.timedelta):
        return dt.timedelta(value.days, value.seconds, value.microseconds)
    if isinstance(value, uuid.UUID):
        return uuid.UUID(int=value.int)
    return bytes(value)


def _text(value: Any) -> Any:
    tag = _TAG_OF.get(type(value))
    if tag is None:
        raise TypeError(f"{type_name(value)} is not a column value")
    return _TAGS[tag][1](value)


def state_size(state: Mapping[str, Any]) -> int:
    """The bytes of a table state's JSON, a value beyond JSON counted as its tag's text,
    a ``Decimal`` as its positional text (what SQLite binds: never shorter)."""
    text = json.dumps(state, separators=(",", ":"), ensure_ascii=False, default=_text)
    wider = sum(decimal_chars(v) - len(str(v)) for v in state.values() if type(v) is Decimal)
    return len(text.encode("utf-8", "surrogatepass")) + max(wider, 0)


def as_carried(value: Any) -> Any:
    """A guard value as an intent carries it: a ``datetime`` or ``time`` with its UTC
    offset as a fixed offset and ``fold`` 0 (a zone's name and ``fold`` do not travel;
    the instant does), so an intent equals itself read back from its JSON."""
    kind = type(value)
    if kind is dt.datetime or kind is dt.time:
        return kind.fromisoformat(value.isoformat())
    return value


def has_extended(values: Mapping[str, Any]) -> bool:
    """True if any value is not a JSON scalar (so it travels tagged)."""
    return any(type(v) not in _PLAIN for v in values.values())


def loosely_equal(stored: Any, wanted: Any) -> bool:
    """Whether a row's value may equal a guard value of another type, as a store
    comparing its own column would see them: a ``UUID`` and its text, a ``Decimal`` and
    a float or its text, a ``datetime``/``date``/``time`` and its ISO text, a ``time``
    and the ``timedelta`` PyMySQL reads from ``TIME``, bytes and a buffer. Used where a
    probe is judged in Python: it may say yes where the store says no (the commit is the
    store's word), never no where the store says yes."""
    for a, b in ((stored, wanted), (wanted, stored)):
        if isinstance(b, str) and type(a) in _FROM_TEXT:
            try:
                if _FROM_TEXT[type(a)](b) == a:
                    return True
            except (ValueError, TypeError, ArithmeticError):
                pass
        if type(a) is Decimal and type(b) in (int, float):
            return bool(a == Decimal(repr(b)))
        if type(a) is dt.time and type(b) is dt.timedelta and a.tzinfo is None:
            return (
                bool(dt.timedelta(0) <= b < dt.timedelta(days=1))
                and a == (dt.datetime.min + b).time()
            )
        if isinstance(a, bytes | bytearray | memoryview) and isinstance(
            b, bytes | bytearray | memoryview
        ):
            return bytes(a) == bytes(b)
    return False


def _loose_datetime(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _loose_decimal(text: str) -> Decimal:
    return Decimal(text.strip())


_FROM_TEXT: Final[dict[type, Callable[[str], Any]]] = {
    Decimal: _loose_decimal,
    dt.datetime: _loose_datetime,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
    uuid.UUID: uuid.UUID,
}


# -- the tagged encoding ---------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _micros(value: dt.timedelta) -> str:
    return str((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds)


def _unmicros(text: str) -> dt.timedelta:
    if not text.lstrip("-").isdigit() or not text.isascii():
        raise ValueError("not an integer")
    return dt.timedelta(microseconds=int(text))


def _decimal(text: str) -> Decimal:
    value = Decimal(text)
    if not value.is_finite():
        raise ValueError("not finite")
    return value


# tag -> (type, to text, from text); every from-text is the exact inverse of its to-text
_TAGS: Final[dict[str, tuple[type, Callable[[Any], str], Callable[[str], Any]]]] = {
    "$decimal": (Decimal, str, _decimal),
    "$datetime": (dt.datetime, dt.datetime.isoformat, dt.datetime.fromisoformat),
    "$date": (dt.date, dt.date.isoformat, dt.date.fromisoformat),
    "$time": (dt.time, dt.time.isoformat, dt.time.fromisoformat),
    "$timedelta": (dt.timedelta, _micros, _unmicros),
    "$uuid": (uuid.UUID, str, uuid.UUID),
    "$bytes": (bytes, _b64, _unb64),
}
_TAG_OF: Final = {kind: tag for tag, (kind, _, _) in _TAGS.items()}


def encode_tagged(value: Any) -> Any:
    """A guard value as JSON: a scalar as is, an ``EXTENDED`` value as its tag object."""
    tag = _TAG_OF.get(type(value))
    if tag is None:
        return value
    return {tag: _TAGS[tag][1](value)}


def decode_tagged(value: Any, field: str) -> Any:
    """The inverse of ``encode_tagged``: a tag object decoded, anything else as is.

    ``ValueError`` (with the field named) for an object that is not exactly one known
    tag holding its canonical text.
    """
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"guard value for {field!r} is an object, not one tag ({_known()})")
    ((tag, text),) = value.items()
    spec = _TAGS.get(tag)
    if spec is None:
        raise ValueError(f"guard value for {field!r} has an unknown tag {tag!r} ({_known()})")
    if not isinstance(text, str):
        raise ValueError(f"guard value for {field!r}: {tag} takes a string")
    _, to_text, from_text = spec
    try:
        decoded = from_text(text)
    except (
        ValueError,
        TypeError,
        OverflowError,
        InvalidOperation,
        binascii.Error,
        UnicodeEncodeError,
    ):
        decoded = None
    if decoded is None or to_text(decoded) != text:
        raise ValueError(f"guard value for {field!r}: {text!r} is not a canonical {tag} value")
    return decoded


def _known() -> str:
    return "one of " + ", ".join(_TAGS)
