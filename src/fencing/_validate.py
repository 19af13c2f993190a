"""Pure validation of names, states and guards. No I/O."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ._errors import InvalidIdentifier, InvalidState

__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "check_column",
    "check_guard",
    "check_key",
    "check_name",
    "dump_state",
]

DEFAULT_MAX_STATE_BYTES = 1 << 20  # 1 MiB of JSON per record
MAX_KEY_CHARS = 512

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
        )
    if what == "table" and name.lower().startswith(_RESERVED_PREFIX):
        raise InvalidIdentifier(f"table name {name!r} is reserved for fencing's own tables")
    return name


def check_key(key: object) -> str | int:
    """A record key: a non-empty string of at most 512 characters, or an integer."""
    if isinstance(key, bool):
        raise InvalidIdentifier(f"record key {key!r} must be a string or an integer")
    if isinstance(key, int):
        if -(2**63) <= key < 2**63:
            return key
        raise InvalidIdentifier(f"record key {key!r} is outside the 64-bit range")
    if isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS and "\x00" not in key:
        return key
    raise InvalidIdentifier(
        f"record key {key!r} must be a non-empty string of at most {MAX_KEY_CHARS}"
        " characters without NUL, or an integer"
    )


def _reject(value: Any) -> Any:
    raise InvalidState(f"state value {value!r} of type {type(value).__name__} is not JSON")


_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_reject
)


def dump_state(state: object, max_bytes: int = DEFAULT_MAX_STATE_BYTES) -> str:
    """Validate a state and return its canonical compact JSON text.

    A state is a JSON object with string keys whose values are JSON values
    (no NaN or infinity, no tuples or sets or bytes).
    """
    if not isinstance(state, dict):
        if not isinstance(state, Mapping):
            raise InvalidState(f"state must be a JSON object (a dict), not {type(state).__name__}")
        state = dict(state)
    for key in state:
        if not isinstance(key, str):
            raise InvalidState(f"state keys must be strings, not {key!r}")
    try:
        text = _ENCODER.encode(state)
    except InvalidState:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"state is not JSON: {exc}") from exc
    if len(text) > max_bytes // 4 and len(text.encode()) > max_bytes:
        raise InvalidState(f"state is {len(text.encode())} bytes of JSON, above {max_bytes}")
    return text


def check_guard(guard: object) -> dict[str, Any] | None:
    """A state guard: required field values, scalars only, keyed by plain field names."""
    if guard is None:
        return None
    if not isinstance(guard, Mapping) or not guard:
        raise InvalidState("a guard must be a non-empty mapping of field names to values")
    out: dict[str, Any] = {}
    for field, value in guard.items():
        check_column(field, "guard field")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise InvalidState(
                f"guard value for {field!r} must be a string, number, boolean or None"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidState(f"guard value for {field!r} must be finite")
        out[field] = value
    return out
