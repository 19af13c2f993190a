"""The transactional outbox: values and rules, free of I/O.

A fenced task sent through the outbox (``store.using(conn).outbox.send(task, intent)``)
is one row written in the caller's transaction: rolled back, there is no row and
nothing is sent; committed, a relay (``fencing relay``, ``fencing.contrib.relay``)
publishes it through the queue's own client, at least once, then marks it sent. A
relay that crashed between the publish and the mark publishes again; the worker then
answers ``Duplicate``, so the effect is applied once.

Relays *claim* rows before publishing: a claim has a token from a counter that only
grows, and a deadline (``claimed_until``). Rows are claimed in the order they were
written, and a row of a key only with every older unsettled row of that key (unsent,
not dead): never while another claim on a row of the key is live, nor past an older
row of another queue kind or one not yet due; so the rows of one key are published
in order. Marking a row sent, or giving it back after a failed publish, names the
claim's token: a relay that paused past its claim's deadline, whose rows a newer claim
took, marks and gives back nothing.

A row whose publish keeps failing while the broker takes other rows (a *poison* row: a
payload the broker refuses, a queue that does not exist) can be given up as *dead*
(``Relay(dead_after=N)``): it stays in the outbox with its payload, attempts, last error
and ``dead_at``, and no longer holds its key back. ``outbox.dead()`` lists dead rows,
``outbox.retry(ids)`` puts them back to pending, ``outbox.drop(ids)`` deletes them.

A send with ``supersede=True`` *supersedes*, in its own transaction, every older row of
the same key, queue kind and task that is still waiting (unsent, not dead, under no
live claim): a superseded row is settled without being published (``sent_at`` and
``superseded_at`` are the store's clock then), so it is never claimed and no longer holds
its key back; a row under a live claim is on its way and is published, the newer one
after it. ``debounce=S`` (with ``max_wait=M``) makes the row *due* only ``S`` seconds
after it was written, and never later than ``M`` seconds after the first send of the
burst it superseded (``due_at``, ``burst_at``; schema version 6 on SQLite and
PostgreSQL, 7 on MySQL/MariaDB): a claim takes no row of a key from its first row that
is not yet due (per-key order holds), and other keys are not held back.

Every backend stores the same row (``OUTBOX_COLUMNS``) and answers with
:class:`OutboxRow` values built by :func:`outbox_row`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ._errors import InvalidInput, OutboxRowNotDead, UnknownOutboxRow
from ._validate import check_name

__all__ = [
    "MAX_OPTIONS_BYTES",
    "MAX_PAYLOAD_BYTES",
    "OUTBOX_COLUMNS",
    "QUEUE_KINDS",
    "STORED_COLUMNS",
    "OutboxClaim",
    "OutboxMessage",
    "OutboxRow",
    "OutboxStats",
    "check_claim",
    "check_dead",
    "check_ids",
    "check_message",
    "check_supersede",
    "claimable",
    "due_times",
    "message_from",
    "outbox_row",
    "supersedes",
]

#: The task queues a relay publishes to.
QUEUE_KINDS: Final = ("celery", "rq", "dramatiq", "arq")
MAX_PAYLOAD_BYTES: Final = 256 * 1024
MAX_OPTIONS_BYTES: Final = 16 * 1024
MAX_TASK_CHARS: Final = 512
MAX_CLAIM: Final = 10_000
#: The columns ``outbox_add`` writes from a message (``OutboxMessage.stored()``).
STORED_COLUMNS: Final = ("kind", "task", "queue", "payload", "options", "okey")
#: The stored row, in this order, on every backend (``options`` is a JSON object; the
#: claim's columns are NULL until a relay claims the row, ``sent_at`` until it is sent;
#: ``strikes``: failed publishes that count toward a relay's ``dead_after``, ``dead_at``:
#: when a relay gave the row up as dead, NULL while it is not; schema version 5;
#: ``superseded_at``: when a newer send superseded the row (then ``sent_at`` is the
#: same: the row is settled, never published), ``due_at``: not claimed before (a
#: debounced send), ``burst_at``: when the first send of the burst a superseding send
#: ended was written; schema version 6, 7 on MySQL/MariaDB).
OUTBOX_COLUMNS: Final = (
    "id",
    "kind",
    "task",
    "queue",
    "payload",
    "options",
    "okey",
    "created_at",
    "attempts",
    "last_error",
    "claim_token",
    "claimed_by",
    "claimed_until",
    "sent_at",
    "strikes",
    "dead_at",
    "superseded_at",
    "due_at",
    "burst_at",
)
#: The longest ``debounce`` or ``max_wait`` of a send: one day (seconds).
MAX_DEBOUNCE: Final = 86400.0


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """What ``outbox.send`` writes: a task of a queue (``kind``) by its ``task`` name (RQ:
    its import path), the ``queue`` it goes to (None: the task's default), its
    ``payload`` (the intent's JSON, or its signed token), the queue's send options, and
    ``key``: the record the intent is about, so a relay keeps that record's order."""

    kind: str
    task: str
    payload: str
    key: str
    queue: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: supersede the older waiting rows of the same key, kind and task (``outbox.send``)
    supersede: bool = False
    #: seconds a superseding row waits before it is due (None: due at once)
    debounce: float | None = None
    #: the longest a burst waits: seconds from the first send it superseded
    max_wait: float | None = None

    def options_json(self) -> str:
        # strict JSON: NaN and infinity are not JSON, and no relay could read them back
        return json.dumps(
            dict(self.options), sort_keys=True, separators=(",", ":"), allow_nan=False
        )

    def stored(self) -> tuple[str, str, str | None, str, str, str]:
        """What every store writes for it: ``(kind, task, queue, payload, options, okey)``
        (``STORED_COLUMNS``)."""
        return (self.kind, self.task, self.queue, self.payload, self.options_json(), self.key)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """An outbox row as the store holds it."""

    id: int
    kind: str
    task: str
    queue: str | None
    payload: str
    options: Mapping[str, Any]
    key: str
    created_at: float
    attempts: int
    last_error: str | None
    claim_token: int | None
    claimed_by: str | None
    claimed_until: float | None
    sent_at: float | None
    #: failed publishes that counted toward ``dead_after``: each one failed while the
    #: broker took another row of the same batch (a broker outage counts none)
    strikes: int = 0
    #: when a relay gave the row up as dead (the store's clock); None: not dead
    dead_at: float | None = None
    #: when a newer send superseded the row (never published); None: not superseded
    superseded_at: float | None = None
    #: a debounced row is not claimed before this time (the store's clock); None: at once
    due_at: float | None = None
    #: a superseding row: when the first send of the burst it ended was written
    burst_at: float | None = None

    @property
    def sent(self) -> bool:
        """Published and marked sent (a superseded row is settled, not sent)."""
        return self.sent_at is not None and self.superseded_at is None

    @property
    def superseded(self) -> bool:
        return self.superseded_at is not None

    @property
    def dead(self) -> bool:
        return self.dead_at is not None

    @property
    def state(self) -> str:
        """``pending`` (to publish), ``sent``, ``superseded`` (a newer send of its key and
        task replaced it: never published) or ``dead`` (given up: ``outbox.retry``)."""
        if self.superseded:
            return "superseded"
        return "sent" if self.sent else "dead" if self.dead else "pending"

    def age(self, now: float) -> float:
        """Seconds since the row was written, by ``now`` (the store's clock)."""
        return max(0.0, now - self.created_at)


@dataclass(frozen=True, slots=True)
class OutboxClaim:
    """Rows a relay claimed, in the order to publish them, under ``token`` until
    ``until`` (the store's clock, which said ``now`` when it granted the claim)."""

    token: int
    rows: tuple[OutboxRow, ...]
    until: float
    now: float


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """The backlog of pending rows (of one queue kind, or all): how many, and the
    oldest one's age by the store's clock (0 when there is none); ``dead``: how many
    rows were given up as dead (not in ``pending``; a monitor alerts on any)."""

    pending: int
    oldest_age: float
    now: float
    dead: int = 0
    #: rows superseded by a newer send (never published), until pruned like sent ones
    superseded: int = 0


def claimable(rows: Sequence[OutboxRow], kind: str, now: float, limit: int) -> list[OutboxRow]:
    """The rows a claim at ``now`` takes (the rule of ``OutboxFlows.outbox_claim``, for a
    store that keeps rows in Python): ``rows`` are all rows, in id order. Per key, a row
    is taken only if no older unsettled row of its key is left out of the claim: none
    of another queue kind, none not yet due (debounced), and no row of the key under a
    live claim (dead and superseded rows are settled: they hold nothing back)."""
    live = [r for r in rows if r.sent_at is None and r.dead_at is None]
    held = {r.key for r in live if r.claimed_until is not None and r.claimed_until > now}
    free: list[OutboxRow] = []
    for r in live:  # in id order: a row the claim cannot take holds back its key's later rows
        if r.kind != kind or (r.due_at is not None and r.due_at > now):
            held.add(r.key)
        elif r.key not in held:
            free.append(r)
    return free[:limit]


def supersedes(row: OutboxRow, message: OutboxMessage, now: float) -> bool:
    """Whether ``message`` sent at ``now`` with ``supersede`` supersedes ``row`` (the rule
    of every store): same key, queue kind and task, waiting (unsent, not dead), and under
    no live claim (a claimed row is on its way: it is published, the new one after it)."""
    return (
        message.supersede
        and (row.key, row.kind, row.task) == (message.key, message.kind, message.task)
        and row.sent_at is None
        and row.dead_at is None
        and (row.claimed_until is None or row.claimed_until <= now)
    )


def due_times(
    message: OutboxMessage, now: float, burst: float | None
) -> tuple[float | None, float | None]:
    """``(due_at, burst_at)`` of the row ``message`` writes at ``now``, ``burst`` being the
    earliest ``burst_at`` or ``created_at`` of the rows it supersedes (None: none): a
    debounced row is due ``debounce`` seconds from now, and never later than ``max_wait``
    seconds after the burst began."""
    if not message.supersede:
        return None, None
    began = now if burst is None else min(float(burst), now)
    if message.debounce is None:
        return None, began
    cap = began + (message.max_wait if message.max_wait is not None else math.inf)
    return max(now, min(now + message.debounce, cap)), began


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{name} is a number of seconds")
    if not 0 <= value <= MAX_DEBOUNCE:
        raise InvalidInput(f"{name} is from 0 to {MAX_DEBOUNCE:.0f} seconds")
    return float(value)


def check_supersede(
    supersede: object, debounce: object, max_wait: object
) -> tuple[bool, float | None, float | None]:
    """A send's ``supersede``, ``debounce`` and ``max_wait``, checked: ``debounce`` implies
    ``supersede`` (None: not given), and ``max_wait`` defaults to ten times ``debounce``
    (a key written without pause is still published at least that often)."""
    if supersede is not None and not isinstance(supersede, bool):
        raise InvalidInput("supersede is True or False")
    if debounce is None:
        if max_wait is not None:
            raise InvalidInput("max_wait bounds a debounce: give debounce= too")
        return bool(supersede), None, None
    if supersede is False:
        raise InvalidInput("debounce= supersedes the older rows: not with supersede=False")
    wait = _seconds(debounce, "debounce")
    most = 10 * wait if max_wait is None else _seconds(max_wait, "max_wait")
    return True, wait, min(most, MAX_DEBOUNCE)


def outbox_row(values: Sequence[Any]) -> OutboxRow:
    """An :class:`OutboxRow` from a stored row (``OUTBOX_COLUMNS`` order)."""
    (rid, kind, task, queue, payload, options, key, created, attempts, error) = values[:10]
    token, by, until, sent, strikes, dead, superseded, due, burst = values[10:19]
    return OutboxRow(
        int(rid),
        str(kind),
        str(task),
        None if queue is None else str(queue),
        str(payload),
        json.loads(options) if isinstance(options, str | bytes) else dict(options or {}),
        str(key),
        float(created),
        int(attempts),
        None if error is None else str(error),
        None if token is None else int(token),
        None if by is None else str(by),
        None if until is None else float(until),
        None if sent is None else float(sent),
        int(strikes),
        None if dead is None else float(dead),
        None if superseded is None else float(superseded),
        None if due is None else float(due),
        None if burst is None else float(burst),
    )


def _utf8_size(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"outbox text is not valid unicode: {exc}") from None


def check_message(message: object) -> OutboxMessage:
    """A message checked before anything is written (``InvalidInput`` otherwise)."""
    if not isinstance(message, OutboxMessage):
        raise InvalidInput(f"an outbox message is an OutboxMessage, not {type(message).__name__}")
    if message.kind not in QUEUE_KINDS:
        raise InvalidInput(f"outbox queue kind must be one of {QUEUE_KINDS}, not {message.kind!r}")
    for name, text in (("task", message.task), ("key", message.key)):
        if not isinstance(text, str) or not 0 < len(text) <= MAX_TASK_CHARS or "\x00" in text:
            raise InvalidInput(f"outbox {name} must be 1 to {MAX_TASK_CHARS} characters")
        _utf8_size(text)
    if message.queue is not None:
        check_name(message.queue, "queue")
    if not isinstance(message.payload, str) or not message.payload:
        raise InvalidInput("an outbox payload is a non-empty string (the intent's JSON or token)")
    if _utf8_size(message.payload) > MAX_PAYLOAD_BYTES:
        raise InvalidInput(f"an outbox payload is at most {MAX_PAYLOAD_BYTES} bytes")
    if not isinstance(message.options, Mapping) or not all(
        isinstance(k, str) for k in message.options
    ):
        raise InvalidInput("outbox send options are keyword arguments (a mapping of names)")
    try:
        text = message.options_json()
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"outbox send options must be JSON values: {exc}") from None
    if _utf8_size(text) > MAX_OPTIONS_BYTES:
        raise InvalidInput(f"outbox send options are at most {MAX_OPTIONS_BYTES} bytes of JSON")
    flags = check_supersede(message.supersede, message.debounce, message.max_wait)
    if flags != (message.supersede, message.debounce, message.max_wait):
        message = replace(message, supersede=flags[0], debounce=flags[1], max_wait=flags[2])
    return message


def check_claim(
    relay: object, kind: object, limit: object, ttl: object
) -> tuple[str, str, int, float]:
    """A relay's claim arguments, checked: its name, the queue kind, how many rows at
    most, and for how long (seconds) the claim holds them."""
    relay = check_name(relay, "relay")
    if kind not in QUEUE_KINDS:
        raise InvalidInput(f"queue kind must be one of {QUEUE_KINDS}, not {kind!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM:
        raise InvalidInput(f"a claim takes 1 to {MAX_CLAIM} rows")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise InvalidInput("a claim's ttl is a number of seconds")
    if not 0.1 <= ttl <= 86400:
        raise InvalidInput("a claim's ttl is from 0.1 second to one day")
    return relay, str(kind), limit, float(ttl)


def check_ids(ids: object) -> tuple[int, ...]:
    """Row ids for ``outbox.retry`` / ``outbox.drop``: OutboxRow values or positive
    integers, at least one, at most ``MAX_CLAIM``; sorted, each once."""
    if isinstance(ids, int | str | bytes | OutboxRow):
        ids = [ids]
    if not isinstance(ids, Iterable):
        raise InvalidInput("rows are OutboxRow values or their ids (positive integers)")
    found = [r.id if isinstance(r, OutboxRow) else r for r in ids]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in found):
        raise InvalidInput("rows are OutboxRow values or their ids (positive integers)")
    if not 1 <= len(found) <= MAX_CLAIM:
        raise InvalidInput(f"name 1 to {MAX_CLAIM} rows")
    return tuple(sorted(set(found)))


def check_dead(ids: Sequence[int], found: Mapping[int, bool], verb: str) -> None:
    """Raise if a row of ``ids`` is missing from ``found`` (id -> is it dead?) or not
    dead: ``UnknownOutboxRow`` first, else ``OutboxRowNotDead``; ``verb`` names the
    operation (``retry``, ``drop``) in the message."""
    unknown = tuple(i for i in ids if i not in found)
    not_dead = tuple(i for i in ids if i in found and not found[i])
    if unknown:
        raise UnknownOutboxRow(
            f"cannot {verb} outbox row(s) {list(unknown)}: no such row (nothing changed)",
            unknown,
            not_dead,
        )
    if not_dead:
        raise OutboxRowNotDead(
            f"cannot {verb} outbox row(s) {list(not_dead)}: not dead (only a dead row is"
            " put back or dropped; nothing changed)",
            unknown,
            not_dead,
        )


def message_from(
    task: object,
    what: Any,
    transition: str | None,
    guard: Any,
    options: Any,
    supersede: bool | None = None,
    debounce: float | None = None,
    max_wait: float | None = None,
) -> OutboxMessage:
    """The message for ``outbox.send(task, what, ...)``: the fenced task (of any of the
    four queue integrations) encodes it, as its own ``enqueue`` would send it; the
    send's ``supersede``/``debounce``/``max_wait``, or else the task's own (its
    ``fencing.outbox_supersede``: ``fenced_task(..., supersede=True)``)."""
    spec = getattr(task, "fencing", None)
    build = getattr(spec, "outbox_message", None)
    if build is None:
        raise InvalidInput(
            "outbox.send() takes a fenced task (fenced_task, fenced_job, fenced_actor or"
            f" fenced_function of fencing.contrib), not {type(task).__name__}"
        )
    if supersede is None and debounce is None and max_wait is None:
        supersede, debounce, max_wait = getattr(spec, "outbox_supersede", (None, None, None))
    flags = check_supersede(supersede, debounce, max_wait)
    message = check_message(build(task, what, transition, guard=guard, options=dict(options)))
    return replace(message, supersede=flags[0], debounce=flags[1], max_wait=flags[2])
