"""Pure validation of names, states and guards. No I/O."""

from __future__ import annotations

import enum
import json
import json.encoder as json_encoder
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ._errors import InvalidIdentifier, InvalidState
from ._types import as_carried, column_value, decimal_chars, type_name

__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "check_column",
    "check_guard",
    "check_key",
    "check_name",
    "check_table",
    "compact_json",
    "dump_state",
    "mapped_table",
]

DEFAULT_MAX_STATE_BYTES = 1 << 20  # 1 MiB of JSON per record
MAX_KEY_CHARS = 512
#: A guard travels in an intent (at most 64 KiB): its Decimals, written out as a store
#: binds them, take at most as much (one ``_types.MAX_DECIMAL_CHARS`` each, at most).
MAX_GUARD_DECIMAL_CHARS = 64 * 1024

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.:/]{0,127}")
# Plain SQL identifiers, the subset every dialect we support accepts unquoted.
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_RESERVED_PREFIX = "fencing_"


def check_name(name: object, what: str = "collection") -> str:
    """A collection or lease name: 1-128 of letters, digits and ``_ - . : /``."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidIdentifier(
            f"{what} name {name!r} is not allowed: use 1 to 128 letters, digits and"
            " '_ - . : /', starting with a letter or digit"
        )
    return name


def check_column(name: object, what: str = "column") -> str:
    """A table or column name: a plain SQL identifier (quoted anyway when used)."""
    if not isinstance(name, str) or _COLUMN.fullmatch(name) is None:
        raise InvalidIdentifier(
            f"{what} name {name!r} is not allowed: use a plain SQL identifier"
            " (a letter or '_', then letters, digits or '_', at most 63)"
            + (", or schema.table" if what == "table" else "")
        )
    if what == "table" and name.lower().startswith(_RESERVED_PREFIX):
        raise InvalidIdentifier(f"table name {name!r} is reserved for fencing's own tables")
    return name


def check_table(name: object) -> str:
    """A table name, plain (``orders``) or qualified by its schema (``shop.orders``: a
    PostgreSQL schema, a MySQL database, an SQLite database such as ``main``)."""
    if isinstance(name, str) and name.count(".") == 1:
        schema, _, table = name.partition(".")
        if _COLUMN.fullmatch(schema) is not None and _COLUMN.fullmatch(table) is not None:
            check_column(table, "table")
            return name
    return check_column(name, "table")


def mapped_table(obj: object, version: str | None) -> tuple[str, str, str | None]:
    """``(name, key column, version column)`` of a SQLAlchemy mapped class or ``Table``,
    read duck-typed (SQLAlchemy is not imported): the table's name with its schema, its
    one-column primary key, the mapper's ``version_id_col`` or else ``version``.
    A Django model (read through its ``_meta``; Django is not imported either): its
    ``db_table``, its primary key's column and, when it has one, the column of its
    version field (a field with ``fencing_version = True``, such as
    ``fencing.contrib.django.VersionField``)."""
    meta: Any = getattr(obj, "_meta", None)
    if isinstance(obj, type) and isinstance(getattr(meta, "db_table", None), str):
        return _django_table(meta, version)
    table: Any = getattr(obj, "__table__", obj)
    name, schema = getattr(table, "name", None), getattr(table, "schema", None)
    primary = getattr(getattr(table, "primary_key", None), "columns", None)
    if not isinstance(name, str) or primary is None:
        raise InvalidIdentifier(
            f"a table is a name, a SQLAlchemy mapped class or Table; not {type_name(obj)}"
        )
    keys = [column.name for column in primary]
    if len(keys) != 1:
        raise InvalidIdentifier(
            f"table {name!r} has {len(keys)} primary key columns: fencing guards tables with"
            " a one-column key (give the table's name and key= a unique column)"
        )
    mapped = getattr(getattr(obj, "__mapper__", None), "version_id_col", None)
    if mapped is not None:
        version = mapped.name
    return (f"{schema}.{name}" if schema else name), keys[0], version


def _django_table(meta: Any, version: str | None) -> tuple[str, str, str | None]:
    if meta.proxy:
        meta = meta.concrete_model._meta
    pk = meta.pk
    if pk is None or getattr(pk, "column", None) is None:
        raise InvalidIdentifier(
            f"Django model {meta.label} has no one-column primary key: fencing guards"
            " tables with a one-column key"
        )
    for field in meta.local_concrete_fields:
        if getattr(field, "fencing_version", False):
            version = field.column
    return meta.db_table, pk.column, version


def check_key(key: object) -> str | int:
    """A record key: a non-empty string of at most 512 characters, or an integer."""
    if isinstance(key, bool):
        raise InvalidIdentifier(f"record key {key!r} must be a string or an integer")
    if isinstance(key, int):
        if -(2**63) <= key < 2**63:
            return key
        raise InvalidIdentifier(f"record key {key!r} is outside the 64-bit range")
    if (
        isinstance(key, str)
        and 0 < len(key) <= MAX_KEY_CHARS
        and "\x00" not in key
        and is_unicode(key)
    ):
        return key
    raise InvalidIdentifier(
        f"record key {key!r} must be a non-empty string of at most {MAX_KEY_CHARS}"
        " characters without NUL or lone surrogates, or an integer"
    )


def is_unicode(text: str) -> bool:
    """False if ``text`` holds a lone surrogate, which no store can encode as UTF-8."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _reject(value: Any) -> Any:
    raise InvalidState(f"state value {value!r} of type {type(value).__name__} is not JSON")


_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_reject
)

#: ``_ENCODER``'s C encoder, made once and without circular-reference markers, so that
#: it holds no state between calls (``JSONEncoder.encode`` makes one per call, with a
#: fresh markers dict). A cycle then ends in ``RecursionError``: every failure is
#: encoded again by ``_ENCODER`` (``_checked_json``), whose error is the one raised.
#: None where ``json`` has no C accelerator.
_C_MAKE_ENCODER: Any = getattr(json_encoder, "c_make_encoder", None)
_FAST_ENCODE: Any = (
    None
    if _C_MAKE_ENCODER is None
    else _C_MAKE_ENCODER(
        None,  # markers: no circular check (see above)
        _reject,
        json_encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )
)


def compact_json(value: object) -> str:
    """JSON text of an already validated value (``dump_state``'s encoding, without its
    checks)."""
    if _FAST_ENCODE is not None:
        try:
            return "".join(_FAST_ENCODE(value, 0))
        except Exception:  # encoded again below, for its own error
            pass
    return _ENCODER.encode(value)


def dump_state(state: object, max_bytes: int = DEFAULT_MAX_STATE_BYTES) -> str:
    """Validate a state and return its canonical compact JSON text.

    A state is a JSON object with string keys whose values are JSON values
    (no NaN or infinity, no tuples or sets or bytes).
    """
    if type(state) is not dict or _FAST_ENCODE is None:
        return _dump_checked(state, max_bytes)
    # A plain dict (a state as a caller builds it): one pass over its items checks the
    # keys and finds the nested values; the C encoder made once encodes it. Any failure
    # is judged by ``_dump_checked``, which raises what it always raised.
    nested = None
    for key, value in state.items():
        if type(key) is not str:
            return _dump_checked(state, max_bytes)
        if type(value) in _SCALARS:
            continue
        if nested is None:
            nested = [value]
        else:
            nested.append(value)
    try:
        text = "".join(_FAST_ENCODE(state, 0))
    except Exception:  # judged again by the checked path
        return _dump_checked(state, max_bytes)
    if nested is not None:
        _check_nested(nested)
    if text.isascii() and len(text) <= max_bytes:
        return text
    return _checked_size(text, max_bytes)


def _dump_checked(state: object, max_bytes: int) -> str:
    """``dump_state`` for any input: every check in turn, each with its own error."""
    if not isinstance(state, dict):
        if not isinstance(state, Mapping):
            raise InvalidState(f"state must be a JSON object (a dict), not {type(state).__name__}")
        state = dict(state)
    for key in state:
        if not isinstance(key, str):
            raise InvalidState(f"state keys must be strings, not {key!r}")
    text = _checked_json(state)
    _check_nested_keys(state)
    return _checked_size(text, max_bytes)


def _checked_json(state: dict[str, Any]) -> str:
    try:
        return _ENCODER.encode(state)
    except InvalidState as exc:
        where = _non_json_field(state)
        if where is None:
            raise
        value = where[1]
        raise InvalidState(
            f"field {where[0]!r} holds {_short(value)} of type {type(value).__name__}, which"
            " JSON cannot hold (a collection's state is a JSON document)"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"state is not JSON: {exc}") from exc
    except RecursionError:
        raise InvalidState("state is nested too deeply") from None


def _checked_size(text: str, max_bytes: int) -> str:
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:
            raise InvalidState(f"state holds a lone surrogate ({exc.reason})") from None
    if size > max_bytes:
        raise InvalidState(f"state is {size} bytes of JSON, above {max_bytes}")
    return text


#: The types of JSON's scalar values, exactly (a subclass is looked at as a container).
_SCALARS = frozenset({str, int, float, bool, type(None)})


_CONTAINERS = (dict, list, tuple)


def _check_nested_keys(state: Mapping[str, Any]) -> None:
    _check_nested([v for v in state.values() if isinstance(v, _CONTAINERS)])


def _check_nested(values: list[Any]) -> None:
    """Check the values nested in a state (its values that are not JSON scalars).

    json would turn a nested 1, None or True key into "1", "null", "true" silently.
    Runs after encoding succeeded, so the structure is known to be acyclic.
    A tuple is refused: JSON would store it as a list, while the caller's Committed
    record would still hold the tuple, so the two would disagree."""
    stack = [v for v in values if isinstance(v, _CONTAINERS)]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple):
            raise InvalidState(
                f"state holds a tuple {_short(value)}: use a list (JSON has no tuples,"
                " and the record would read back a list)"
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InvalidState(f"state keys must be strings, not {key!r}")
                if isinstance(item, _CONTAINERS):
                    stack.append(item)
        else:
            stack.extend(item for item in value if isinstance(item, _CONTAINERS))


_JSON_SCALARS = (str, int, float, bool, type(None))


def _non_json_field(state: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The path (``items[2].price``) and value of the first value JSON cannot hold."""
    stack: list[tuple[str, Any]] = [(k, v) for k, v in reversed(list(state.items()))]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{path}.{k}", v) for k, v in reversed(list(value.items()))]
        elif isinstance(value, list | tuple):
            stack += [(f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
        elif not isinstance(value, _JSON_SCALARS):
            return path, value
    return None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_guard(guard: object, *, table: bool = False) -> dict[str, Any] | None:
    """A state guard: required field values, scalars only, keyed by plain field names.

    An enum member stands for its value. A table's guard (``table=True``) may also hold
    the column types beyond JSON (``_types.EXTENDED``); a collection holds JSON, so its
    guard may not.
    """
    if guard is None:
        return None
    if not isinstance(guard, Mapping) or not guard:
        raise InvalidState("a guard must be a non-empty mapping of field names to values")
    out: dict[str, Any] = {}
    wide = 0  # the guard's Decimals written out (as a store binds them), in all
    for field, value in guard.items():
        check_column(field, "guard field")
        if isinstance(value, enum.Enum):
            value = value.value
        if value is not None and not isinstance(value, str | int | float | bool):
            if not table or isinstance(value, enum.Enum):
                raise InvalidState(
                    f"guard value for {field!r} must be a string, number, boolean or None"
                    + ("" if table else f" (a collection holds JSON), not {type_name(value)}")
                )
            value = as_carried(column_value(value, f"guard value for {field!r}"))
            if type(value) is Decimal:
                wide += decimal_chars(value)
                if wide > MAX_GUARD_DECIMAL_CHARS:
                    raise InvalidState(
                        f"guard value for {field!r}: the guard's Decimals, written out, take"
                        f" more than {MAX_GUARD_DECIMAL_CHARS} characters"
                    )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidState(f"guard value for {field!r} must be finite")
        if type(value) is int and not -(2**63) <= value < 2**63:
            # compared by the store itself (an SQL parameter, a Lua number): 64 bits at most
            raise InvalidState(f"guard value for {field!r} is outside the 64-bit range")
        if isinstance(value, str) and not is_unicode(value):
            raise InvalidState(f"guard value for {field!r} holds a lone surrogate")
        out[field] = value
    return out
