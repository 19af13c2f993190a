"""Immutable values: records, intents and commit outcomes. No I/O."""

from __future__ import annotations

import copy
import enum
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, NoReturn

from ._errors import InvalidIdentifier, InvalidIntent, InvalidState
from ._observe import HUB
from ._types import decode_tagged, encode_tagged, has_extended
from ._validate import check_guard, check_key, check_name

__all__ = [
    "SKIP",
    "Committed",
    "Contended",
    "Duplicate",
    "FenceReason",
    "Fenced",
    "Intent",
    "Missing",
    "Outcome",
    "OutcomeBase",
    "Record",
    "SkipType",
    "Skipped",
    "Stale",
    "slot_setters",
]

Kind = Literal["collection", "table"]
#: The newest intent format: 2 adds tagged guard values (``_types``), 3 the optional
#: ``trace`` (a W3C traceparent: docs/observability.md). An intent is written in the oldest
#: format that holds it (1 unless its guard has a tagged value, 3 only with a trace);
#: 1, 2 and 3 read.
INTENT_FORMAT: Final = 3
INTENT_FORMATS: Final = (1, 2, 3)
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
MAX_INTENT_BYTES: Final = 64 * 1024
MAX_VERSION: Final = 2**63 - 1
_INTENT_ID = re.compile(r"[A-Za-z0-9_.:~\-]{1,128}")
_FIELDS: Final = frozenset(
    {
        "v",
        "id",
        "kind",
        "collection",
        "key",
        "expected_version",
        "transition",
        "guard",
        "decided_at",
        "trace",
    }
)


class SkipType(enum.Enum):
    """The type of :data:`SKIP`: annotate a decide function ``-> dict[str, Any] | SkipType``."""

    SKIP = "SKIP"

    def __repr__(self) -> str:
        return "fencing.SKIP"


#: Returned by a ``decide`` function to commit nothing; the outcome is ``Skipped``.
SKIP: Final = SkipType.SKIP


class FrozenState(dict[str, Any]):
    """A record's state: a ``dict`` that refuses every change. Being a dict, it is
    what the docs call it, a JSON object: ``json.dumps(record.state)`` writes it, ``==``
    compares it with a plain dict, ``dict(record.state)`` is a copy to change. Only its
    top level is frozen (as a ``MappingProxyType`` was, and no dearer to make): a list in
    it is a plain value, never the store's."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            "a record's state is read-only: change a copy, {**record.state, ...} or"
            " dict(record.state)"
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenState, (dict(self),))  # (a dict's own pickling would set items)

    def __copy__(self) -> FrozenState:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenState:
        return FrozenState(copy.deepcopy(dict(self), memo))


def slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    """The ``__set__`` of each of a slotted class's slots, in ``__slots__`` order: what a
    frozen dataclass's ``__init__`` does (``object.__setattr__(self, name, value)``)
    without looking the name up on every call. For the values made once per commit,
    whose ``__init__`` is written out (``init=False``) with these."""
    return tuple(cls.__dict__[name].__set__ for name in cls.__dict__["__slots__"])


@dataclass(frozen=True, slots=True, init=False)
class Record:
    """A versioned piece of state as the store holds it.

    ``version`` grows by one on every guarded write and is never reused; ``fence``
    is the highest lease token that wrote the record (0 if none).
    """

    collection: str
    key: str | int
    version: int
    fence: int
    state: Mapping[str, Any]
    kind: Kind = "collection"

    def __init__(
        self,
        collection: str,
        key: str | int,
        version: int,
        fence: int,
        state: Mapping[str, Any],
        kind: Kind = "collection",
    ) -> None:
        # What the dataclass would generate, without its per-field lookups: one
        # Record is made per commit.
        _record_collection(self, collection)
        _record_key(self, key)
        _record_version(self, version)
        _record_fence(self, fence)
        _record_state(self, state if type(state) is FrozenState else FrozenState(state))
        _record_kind(self, kind)

    def __hash__(self) -> int:
        # The state is a read-only mapping (not hashable): hash what names the record's
        # version. Equal records share these fields, so equal records hash alike.
        return hash((self.kind, self.collection, self.key, self.version, self.fence))

    def intent(self, transition: str, *, guard: Mapping[str, Any] | None = None) -> Intent:
        """An intent to apply ``transition`` to this record as it is now."""
        return Intent.new(
            self.collection, self.key, self.version, transition, guard=guard, kind=self.kind
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "kind": self.kind,
            "key": self.key,
            "version": self.version,
            "fence": self.fence,
            "state": dict(self.state),
        }


(
    _record_collection,
    _record_key,
    _record_version,
    _record_fence,
    _record_state,
    _record_kind,
) = slot_setters(Record)


def new_intent_id() -> str:
    """A fresh intent id: 32 hex digits, the first 12 the time in milliseconds.

    Ids made later sort later (as UUIDv7's do), so the applied-intent index every store
    keeps grows at its right edge instead of dirtying a random page per commit; the
    80 random bits that follow keep ids made in the same millisecond apart.
    """
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def _fail(problem: str) -> InvalidIntent:
    return InvalidIntent(f"invalid intent: {problem}")


@dataclass(frozen=True, slots=True)
class Intent:
    """What a task decided against: captured when the work is created, carried with it.

    Immutable and JSON round-trippable (:meth:`to_json`, :meth:`from_json`).
    ``expected_version`` is the record's version at the moment of the decision;
    ``guard``, when given, names field values the record must still hold.
    """

    id: str
    collection: str
    key: str | int
    expected_version: int | None
    transition: str
    guard: Mapping[str, Any] | None = None
    kind: Kind = "collection"
    decided_at: float = 0.0
    #: the W3C traceparent of the span that decided it (``fencing.contrib.otel``), or None
    trace: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Validate on every construction path, so no invalid intent ever exists.
        try:
            if not isinstance(self.id, str) or _INTENT_ID.fullmatch(self.id) is None:
                raise _fail(f"id {self.id!r} must be 1-128 of letters, digits and '_ . : ~ -'")
            if self.kind not in ("collection", "table"):
                raise _fail(f"kind {self.kind!r} must be 'collection' or 'table'")
            check_name(self.collection, self.kind)
            check_key(self.key)
            check_name(self.transition, "transition")
            v = self.expected_version
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_VERSION
            ):
                raise _fail(f"expected_version {v!r} must be an integer from 0 to 2**63-1")
            guard = check_guard(self.guard, table=self.kind == "table")
            if v is None and guard is None:
                raise _fail("an intent needs an expected_version, a guard, or both")
            d = self.decided_at
            if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d):
                raise _fail(f"decided_at {d!r} must be a finite number")
            t = self.trace
            if t is not None and (not isinstance(t, str) or _TRACEPARENT.fullmatch(t) is None):
                raise _fail("trace must be a W3C traceparent ('00-<32 hex>-<16 hex>-<2 hex>')")
        except (InvalidIdentifier, InvalidState) as exc:
            raise _fail(str(exc)) from exc
        if guard is not None:
            object.__setattr__(self, "guard", MappingProxyType(guard))

    def __hash__(self) -> int:
        # The guard is a read-only mapping (not hashable); the id names the intent.
        return hash((self.id, self.kind, self.collection, self.key, self.expected_version))

    @classmethod
    def new(
        cls,
        collection: str,
        key: str | int,
        expected_version: int | None,
        transition: str,
        *,
        guard: Mapping[str, Any] | None = None,
        kind: Kind = "collection",
    ) -> Intent:
        """A fresh intent with a new unique id."""
        return cls(
            id=new_intent_id(),
            collection=collection,
            key=key,
            expected_version=expected_version,
            transition=transition,
            guard=guard,
            kind=kind,
            decided_at=time.time(),
            trace=None if HUB.trace is None else HUB.trace(),
        )

    def derive(
        self,
        expected_version: int | None,
        attempt: int,
        *,
        guard: Mapping[str, Any] | None = None,
    ) -> Intent:
        """The intent a ``Recompute`` attempt commits: same work, decided anew.

        ``decide`` has judged the current record, so the derived intent expects that
        record's version (and, for a table without a version column, ``guard``: the
        guarded fields' current values) instead of the original guard. The id is
        derived deterministically (``<root id>~<attempt>``), so a redelivered task
        that recomputes again is recognised as a ``Duplicate``.
        """
        return Intent(
            id=f"{self.root_id}~{attempt}",
            collection=self.collection,
            key=self.key,
            expected_version=expected_version,
            transition=self.transition,
            guard=guard,
            kind=self.kind,
            decided_at=self.decided_at,
            trace=self.trace,
        )

    @property
    def root_id(self) -> str:
        """The id of the original intent this one was derived from (itself if not derived)."""
        cut = self.id.find("~")
        return self.id if cut < 0 else self.id[:cut]

    def to_dict(self) -> dict[str, Any]:
        """The intent as JSON values: format 1, or 2 when a guard value is tagged (a
        ``Decimal``, ``datetime``, ``date``, ``time``, ``UUID`` or ``bytes``), or 3 when
        it carries a ``trace``."""
        guard = self.guard
        tagged = guard is not None and has_extended(guard)
        data: dict[str, Any] = {
            "v": 3 if self.trace is not None else 2 if tagged else 1,
            "id": self.id,
            "kind": self.kind,
            "collection": self.collection,
            "key": self.key,
            "expected_version": self.expected_version,
            "transition": self.transition,
            "guard": (
                None
                if guard is None
                else {f: encode_tagged(v) for f, v in guard.items()}
                if tagged
                else dict(guard)
            ),
            "decided_at": self.decided_at,
        }
        if self.trace is not None:
            data["trace"] = self.trace
        return data

    def to_json(self) -> str:
        """Compact, canonical JSON (sorted keys), safe to put in a task message."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: object) -> Intent:
        if not isinstance(data, dict):
            raise _fail(f"expected a JSON object, got {type(data).__name__}")
        unknown = set(data) - _FIELDS
        if unknown:
            raise _fail(f"unknown field(s) {sorted(unknown)}")
        missing = {"v", "id", "collection", "key", "expected_version", "transition"} - set(data)
        if missing:
            raise _fail(f"missing field(s) {sorted(missing)}")
        if type(data["v"]) is not int or data["v"] not in INTENT_FORMATS:
            raise _fail(
                f"format version {data['v']!r} is not supported (this reads 1 to {INTENT_FORMAT})"
            )
        if "trace" in data and data["v"] < 3:
            raise _fail(f"field 'trace' needs format 3, not {data['v']}")
        guard = data.get("guard")
        if data["v"] >= 2 and isinstance(guard, dict):
            try:
                guard = {f: decode_tagged(v, str(f)) for f, v in guard.items()}
            except ValueError as exc:
                raise _fail(str(exc)) from None
        return cls(
            id=data["id"],
            collection=data["collection"],
            key=data["key"],
            expected_version=data["expected_version"],
            transition=data["transition"],
            guard=guard,
            kind=data.get("kind", "collection"),
            decided_at=data.get("decided_at", 0.0),
            trace=data.get("trace"),
        )

    @classmethod
    def from_json(cls, payload: str | bytes) -> Intent:
        """Parse and validate an intent; anything malformed raises :class:`InvalidIntent`."""
        if not isinstance(payload, str | bytes):
            raise _fail(f"payload must be str or bytes, not {type(payload).__name__}")
        if len(payload) > MAX_INTENT_BYTES:
            raise _fail(f"payload is {len(payload)} bytes, above {MAX_INTENT_BYTES}")
        try:
            data = json.loads(payload, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _fail(f"not valid JSON ({exc})") from exc
        except RecursionError:
            raise _fail("JSON nested too deeply") from None
        return cls.from_dict(data)


def _no_constant(name: str) -> Any:
    raise _fail(f"{name} is not allowed")


class FenceReason(enum.StrEnum):
    """Why a fenced commit was refused: one of the two, never both.

    A fenced commit's ``reason`` is ``FenceReason.NEWER_OWNER`` or
    ``FenceReason.EXPIRED``; compare with ``is`` or ``match`` on it.
    """

    NEWER_OWNER = "newer_owner"  #: a newer lease token took over the lease or wrote the record
    EXPIRED = "expired"  #: the lease ran out by the store's clock; nobody took over (yet)


class OutcomeBase:
    """Base class of every commit outcome. ``outcome.committed`` is True only for ``Committed``.

    Annotate with :data:`Outcome` (the closed union of the seven outcomes), so that a
    ``match`` ending in ``assert_never`` is checked for exhaustiveness.
    """

    __slots__ = ()
    committed: ClassVar[bool] = False
    kind: ClassVar[str]

    @property
    def current(self) -> Record | None:
        """The record as the store holds it after this outcome (None when missing)."""
        return None


@dataclass(frozen=True, slots=True, init=False)
class Committed(OutcomeBase):
    """Applied: ``record`` is the record at its new version."""

    record: Record
    intent: Intent | None = field(default=None, compare=False)
    committed: ClassVar[bool] = True
    kind: ClassVar[str] = "committed"
    __match_args__ = ("record",)

    def __init__(self, record: Record, intent: Intent | None = None) -> None:
        # the dataclass's own, without its per-field lookups: one is made per commit
        _committed_record(self, record)
        _committed_intent(self, intent)

    @property
    def current(self) -> Record:
        return self.record


_committed_record, _committed_intent = slot_setters(Committed)


@dataclass(frozen=True, slots=True)
class Stale(OutcomeBase):
    """The record moved on since the intent was decided; nothing was written."""

    current: Record
    intent: Intent | None = field(default=None, compare=False)
    kind: ClassVar[str] = "stale"
    __match_args__ = ("current",)


@dataclass(frozen=True, slots=True)
class Duplicate(OutcomeBase):
    """This very intent was committed before (a redelivery or a retry): safe to acknowledge."""

    record: Record
    intent: Intent | None = field(default=None, compare=False)
    kind: ClassVar[str] = "duplicate"
    __match_args__ = ("record",)

    @property
    def current(self) -> Record:
        return self.record


@dataclass(frozen=True, slots=True)
class Fenced(OutcomeBase):
    """The lease that guarded the write lost to a newer owner, or expired; nothing written."""

    current: Record
    reason: FenceReason = FenceReason.NEWER_OWNER
    intent: Intent | None = field(default=None, compare=False)
    kind: ClassVar[str] = "fenced"
    __match_args__ = ("current", "reason")


@dataclass(frozen=True, slots=True)
class Missing(OutcomeBase):
    """The record does not exist (it was deleted, or never created)."""

    intent: Intent | None = field(default=None, compare=False)
    kind: ClassVar[str] = "missing"
    __match_args__ = ()


@dataclass(frozen=True, slots=True)
class Skipped(OutcomeBase):
    """The decide function returned ``SKIP``; nothing was written."""

    current: Record | None = None
    intent: Intent | None = field(default=None, compare=False)
    kind: ClassVar[str] = "skipped"
    __match_args__ = ("current",)


@dataclass(frozen=True, slots=True)
class Contended(OutcomeBase):
    """A ``Recompute`` policy ran out of attempts; ``current`` is the last record seen."""

    current: Record
    attempts: int = 0
    intent: Intent | None = field(default=None, compare=False)
    kind: ClassVar[str] = "contended"
    __match_args__ = ("current", "attempts")


#: Every commit outcome: a closed union, so ``match`` + ``assert_never`` type-checks.
#: ``isinstance(x, Outcome)`` works at run time too.
Outcome = Committed | Stale | Duplicate | Fenced | Missing | Skipped | Contended
