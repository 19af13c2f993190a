"""The checks of the public calls' arguments that are not values of their own (those are
in ``_validate`` and ``_values``): a table's declared columns, a lease's owner and wait,
the effect queries. Each raises a typed ``InvalidInput`` before anything is written."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._effects import Effect, EffectQuery, check_effect_key, check_limit
from ._errors import (
    InvalidIdentifier,
    InvalidInput,
    InvalidLeaseRequest,
    InvalidState,
    RecordNotFound,
    SchemaError,
)
from ._request import Target
from ._rules import check_ttl
from ._validate import check_column, check_name, check_table, is_unicode

__all__ = [
    "GUARD_MODES",
    "GUARD_PREFIX",
    "GUARD_REFUSAL",
    "GUARD_STRICT_REFUSAL",
    "MAX_OWNER_CHARS",
    "bind_mapped",
    "check_declared",
    "check_lease_args",
    "check_owner",
    "check_unique_key",
    "check_wait",
    "effect_ref",
    "found_effect",
    "guard_name",
    "guard_refusal",
    "guard_strict_refusal",
    "guard_target",
    "is_guard_refusal",
    "key_query",
    "mapped_binders",
    "pending_query",
    "reconcile_query",
    "row_key",
]

MAX_OWNER_CHARS = 200

#: A guard trigger's name is this prefix and the table's (``fencing_guard_orders``).
GUARD_PREFIX = "fencing_guard_"
# PostgreSQL keeps 63 bytes of a name, MySQL 64: the trigger's name must fit whole.


#: What every guard trigger's refusal says (``errors.translate`` of each SQL backend
#: tells a ``GuardRefused`` by it).
GUARD_REFUSAL = "refused by fencing: a version never moves backwards"

#: What a strict guard trigger's refusal of an UPDATE that leaves the version unchanged
#: says (a blind writer: ``store.guard_table(name, mode="strict")``).
GUARD_STRICT_REFUSAL = "refused by fencing (strict): the version must move"

#: The guard trigger's modes: ``bump`` moves an unchanged version on, ``strict`` refuses
#: the UPDATE (both refuse a version set lower).
GUARD_MODES = ("bump", "strict")


def guard_name(target: Target) -> tuple[str | None, str]:
    """The schema a guard trigger lives in (None: the table's, as found) and its name:
    ``fencing_guard_<table>``, ``shop.orders``'s in ``shop``; it never depends on the
    version column, so removing finds it whatever column it guards."""
    schema, dot, table = target.name.rpartition(".")
    return (schema if dot else None), GUARD_PREFIX + table


def guard_refusal(target: Target) -> str:
    """The text of the database error a guard trigger raises: no quote in it (the names
    are checked identifiers), at most 124 characters (MySQL's SIGNAL keeps 128), naming
    the trigger (``fencing_guard_orders``; ``shop.orders``'s too: no schema)."""
    return f"{guard_name(target)[1]}: UPDATE {GUARD_REFUSAL}"


def guard_strict_refusal(target: Target) -> str:
    """The text of a strict guard trigger's refusal of a blind UPDATE (one that leaves
    the version unchanged): as :func:`guard_refusal`, at most 124 characters, naming the
    trigger and so the table (``fencing_guard_orders``)."""
    return f"{guard_name(target)[1]}: UPDATE {GUARD_STRICT_REFUSAL}"


def is_guard_refusal(text: str) -> bool:
    """Whether a database error's text is a guard trigger's refusal (either kind)."""
    return GUARD_REFUSAL in text or GUARD_STRICT_REFUSAL in text


def guard_target(name: object, key: object, version: object, mode: object = "bump") -> Target:
    """The table of ``store.guard_table()`` / ``unguard_table()``: checked identifiers
    (the table's plain or ``schema.table``), a name short enough for its trigger's
    (``fencing_guard_<table>``) to fit, and the guard's mode (``"bump"`` or
    ``"strict"``)."""
    if not isinstance(mode, str) or mode not in GUARD_MODES:
        raise InvalidInput(
            f"guard mode must be one of {', '.join(map(repr, GUARD_MODES))}, not {mode!r}"
        )
    target = Target(
        "table",
        check_table(name),
        check_column(key, "key column"),
        check_column(version, "version column"),
        mode,
    )
    _, trigger = guard_name(target)
    if len(trigger) > 63:
        raise InvalidIdentifier(
            f"table name {target.name!r} is too long to guard: its trigger's name"
            f" {trigger!r} must fit in 63 characters"
        )
    return target


def check_unique_key(target: Target, columns: frozenset[str], unique: frozenset[str]) -> None:
    """Refuse a table whose key column is not unique on its own (``unique``: the columns
    that are a one-column primary key or carry a one-column unique index, with no
    predicate): a commit by a shared key would rewrite every row that has it. A key
    column the table lacks is left to the caller (it says "has no column")."""
    key = target.key_column
    if key in columns and key not in unique:
        raise SchemaError(
            f"key column {key!r} of table {target.name!r} must be unique"
            " (a primary key or a unique index on that column alone)"
        )


def check_declared(target: Target, columns: object) -> frozenset[str] | None:
    """The ``columns=`` of ``store.table()``: column names, none of them managed."""
    if columns is None:
        return None
    if isinstance(columns, str | bytes) or not isinstance(columns, Iterable):
        raise InvalidInput(f"columns must be a list of column names, not {type(columns).__name__}")
    names = frozenset(check_column(c) for c in columns)
    if not names:
        raise InvalidInput("columns must name at least one column")
    for col in (target.key_column, target.version_column):
        if col in names:
            raise InvalidInput(
                f"column {col!r} is managed by fencing (the key or version column):"
                " leave it out of columns"
            )
    return names


def found_effect(effect: Effect | None, key: str) -> Effect:
    if effect is None:
        raise RecordNotFound(f"no effect {key} in this store")
    return effect


def reconcile_query(limit: object) -> EffectQuery:
    return EffectQuery(limit=check_limit(limit))


def pending_query(older_than: object, limit: object) -> EffectQuery:
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, int | float)
        or not math.isfinite(older_than)
        or older_than < 0
    ):
        raise InvalidInput(
            f"older_than must be a non-negative number of seconds, not {older_than!r}"
        )
    return EffectQuery(limit=check_limit(limit), pending_for=float(older_than))


def key_query(key: object) -> EffectQuery:
    return EffectQuery(idempotency_key=check_effect_key(key), limit=1)


def effect_ref(effect: object) -> str:
    """The idempotency key of an ``Effect``, or a key given as text."""
    if isinstance(effect, Effect):
        return effect.idempotency_key
    return check_effect_key(effect)


def check_owner(owner: object) -> str:
    if not isinstance(owner, str) or not 0 < len(owner) <= MAX_OWNER_CHARS or not is_unicode(owner):
        raise InvalidLeaseRequest(f"lease owner must be a string of 1 to {MAX_OWNER_CHARS} chars")
    return owner


def check_wait(wait: object) -> float | None:
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
        raise InvalidLeaseRequest(f"wait must be a finite number of seconds or None, not {wait!r}")
    if wait < 0:
        raise InvalidLeaseRequest("wait must not be negative")
    return float(wait)


def check_lease_args(name: object, owner: object, ttl: object) -> tuple[str, str, float]:
    return check_name(name, "lease"), check_owner(owner), check_ttl(ttl)


def row_key(row: object, target: Target) -> tuple[object, object | None]:
    """The key of the row ``row`` stands for in table ``target``, and the SQLAlchemy
    session it belongs to (None if it is not a mapped object, or its session is not in
    a transaction): a mapped object (flushed first if it is pending, so a new row has
    its key), a mapping or SQLAlchemy ``Row`` holding the key column, or any object with
    the key column as an attribute."""
    column = target.key_column
    if target.kind != "table" or column is None:
        raise InvalidInput("intent_for() is for tables: a collection's intent takes its key")
    if hasattr(type(row), "__mapper__"):
        return _mapped_key(row, target, column)
    mapping = getattr(row, "_mapping", row)  # a SQLAlchemy Row's mapping view
    if isinstance(mapping, Mapping):
        if column not in mapping:
            raise InvalidInput(f"the row given to intent_for() has no column {column!r}")
        return mapping[column], None
    if not hasattr(row, column):
        raise InvalidInput(
            f"intent_for() takes a mapped object, a row or a mapping with column {column!r};"
            f" {type(row).__name__} has no attribute {column!r}"
        )
    return getattr(row, column), None


Binder = Callable[[Any], Any]


def mapped_binders(obj: object) -> dict[str, Binder]:
    """For a SQLAlchemy mapped class or ``Table``: per ``Enum`` column, what it binds, as
    SQLAlchemy's own bind processing does (on no particular dialect: the driver's part
    is fencing's): a member, or the text the ORM takes, as its name (or its
    ``values_callable``'s value). Any other column is bound as fencing binds values: a
    ``TypeDecorator``'s ``process_bind_param`` is not applied, because a state read back
    holds what the row holds, and binding that again would encode it twice."""
    table: Any = getattr(obj, "__table__", obj)
    if not type(table).__module__.startswith("sqlalchemy."):
        return {}
    sqlalchemy: Any = importlib.import_module("sqlalchemy")
    dialect = importlib.import_module("sqlalchemy.engine.default").DefaultDialect()
    binders: dict[str, Binder] = {}
    for column in table.columns:
        kind = column.type
        if isinstance(kind, sqlalchemy.Enum):
            process = kind.bind_processor(dialect)
            if process is not None:
                binders[column.name] = _binder(column.name, process)
    return binders


def _binder(column: str, process: Binder) -> Binder:
    def bind(value: Any) -> Any:
        try:
            return process(value)
        except Exception as exc:  # the column type's refusal (an Enum's LookupError...)
            raise InvalidState(f"column {column!r}: {exc}") from None

    return bind


def bind_mapped(binders: Mapping[str, Binder], values: Mapping[str, Any]) -> Mapping[str, Any]:
    """``values`` with each column that has a binder bound by it (``values`` itself if
    none has)."""
    if not binders or binders.keys().isdisjoint(values):
        return values
    return {k: binders[k](v) if k in binders else v for k, v in values.items()}


def _mapped_key(row: object, target: Target, column: str) -> tuple[object, object | None]:
    state: Any = importlib.import_module("sqlalchemy").inspect(row)
    mapper = state.mapper
    table = mapper.local_table
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    if name != target.name and table.name != target.name:
        raise InvalidInput(
            f"intent_for(): a {type(row).__name__} is a row of {name!r}, not {target.name!r}"
        )
    session = state.session
    if state.pending:
        if session is None:  # pragma: no cover - pending means added to a session
            raise InvalidInput("intent_for(): the object is pending without a session")
        try:
            session.flush()
        except Exception as exc:  # an AsyncSession's object: not flushed from here
            if type(exc).__name__ != "MissingGreenlet":
                raise
            raise InvalidInput(
                "intent_for(): flush the new object first (await session.flush())"
            ) from None
    for prop in mapper.column_attrs:
        if any(getattr(c, "name", None) == column for c in prop.columns):
            key = getattr(row, prop.key)
            break
    else:
        raise InvalidInput(f"intent_for(): {type(row).__name__} maps no column {column!r}")
    if state.transient or key is None:
        raise InvalidInput(f"intent_for(): the {type(row).__name__} is not in the table yet")
    active = session is not None and session.in_transaction()
    return key, session if active else None
