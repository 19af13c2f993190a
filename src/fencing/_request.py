"""The values a store and its backend exchange: where records live, one commit's
request, and the backends' answers (with the public outcome each answer means).

Below the policy and the backends, which both import it; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._errors import SchemaError
from ._rules import LeaseRef, LeaseRow, Status
from ._validate import compact_json
from ._values import (
    Committed,
    Duplicate,
    Fenced,
    FenceReason,
    Intent,
    Kind,
    Missing,
    Outcome,
    Record,
    Stale,
)

__all__ = [
    "CommitRequest",
    "CommitResult",
    "LeaseAnswer",
    "Target",
    "outcome_for",
    "table_version",
]


def table_version(value: Any, target: Target, key: object) -> int:
    """A guarded table row's version as read: ``SchemaError`` if it is NULL (or not an
    integer), which a guarded table's version column must never hold."""
    if value is None or isinstance(value, bool):
        raise SchemaError(
            f"table {target.name!r} row {key!r} has NULL in its version column"
            f" {target.version_column!r}: a guarded table's version column must be an"
            " integer, NOT NULL (fencing migrate URL --guard-table adds the guard)"
        )
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SchemaError(
            f"table {target.name!r} row {key!r} has a non-integer version in column"
            f" {target.version_column!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class Target:
    """Where records live: a library-managed collection, or a table the user owns."""

    kind: Kind
    name: str
    key_column: str = "key"
    version_column: str | None = "version"

    @property
    def scope(self) -> str:
        """The namespace of applied intents and fences: ``c:name`` or ``t:name``."""
        return ("c:" if self.kind == "collection" else "t:") + self.name


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One conditional write: apply ``state`` if ``intent`` still holds (and ``lease``).

    ``state`` was validated before any I/O. ``json_text`` is its canonical JSON when
    the front made it (a collection's state); a table's state is flat column values
    that most backends bind one by one, so its JSON is made only if a backend asks
    for ``state_json``.
    """

    target: Target
    intent: Intent
    state: Mapping[str, Any]
    json_text: str | None
    lease: LeaseRef | None = None

    @property
    def state_json(self) -> str:
        """The canonical JSON of ``state`` (made once, on first use, for a table)."""
        text = self.json_text
        if text is None:
            text = compact_json(dict(self.state))
            object.__setattr__(self, "json_text", text)
        return text

    @property
    def claim_id(self) -> str:
        """The id under which the store records the intent as applied: its root id.

        A ``Recompute`` commits a derived intent (``<root>~<n>``) in place of the
        original; every derivation of one root shares one claim, so the work of one
        intent is applied at most once, however it is redelivered or recomputed.
        """
        return self.intent.root_id


class CommitResult(NamedTuple):
    """What the store did: the status and the record (new if applied, else current).

    A named tuple rather than a frozen dataclass: one is made per commit, and a tuple
    is made five times faster.
    """

    status: Status
    record: Record | None


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """A lease operation's answer: the row after it, and whether it was granted.

    ``now`` is the store's clock at that moment, so callers can tell how long is left
    without trusting their own clock.
    """

    granted: bool
    row: LeaseRow | None
    now: float


def outcome_for(result: CommitResult, intent: Intent) -> Outcome:
    """The public outcome for a backend's answer."""
    status, record = result
    if status is Status.APPLIED and record is not None:
        return Committed(record, intent)
    if status is Status.MISSING or record is None:
        return Missing(intent)
    if status is Status.STALE:
        return Stale(record, intent)
    if status is Status.DUPLICATE:
        return Duplicate(record, intent)
    if status is Status.FENCED_NEWER:
        return Fenced(record, FenceReason.NEWER_OWNER, intent)
    if status is Status.FENCED_EXPIRED:
        return Fenced(record, FenceReason.EXPIRED, intent)
    raise AssertionError(f"unexpected status {status}")  # pragma: no cover
