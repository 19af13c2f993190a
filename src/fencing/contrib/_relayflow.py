"""The relay's logic as a flow (``fencing._flow``): no I/O, one copy for ``Relay`` and
``AsyncRelay``.

A flow yields the steps below; the relay's driver carries each out (blocking, or
awaited) and sends back its result:

==================  ==========================================  =======================
step                what the driver does                        result
==================  ==========================================  =======================
``Claim``           ``store.outbox.claim(relay, kind, ...)``    ``OutboxClaim``
``Publish(row)``    the publisher's ``publish(row)``            None, or ``Failed``
``Done(t, ids)``    ``store.outbox.done(t, ids)``               rows marked
``Release(...)``    ``store.outbox.release(t, ids, error)``     rows given back
                    (``strike``: each a strike too)
``Bury(...)``       ``store.outbox.bury(t, ids, error)``        rows given up as dead
``Prune``           ``store.outbox.prune(retention)``           rows deleted
``Clock``           ``time.monotonic()``                        seconds
``Wait(s, wake)``   sleep ``s`` (``wake``: the waker may end    None
                    it early, on new rows); a stop ends it
``Stopping``        is the relay asked to stop?                 bool
==================  ==========================================  =======================

One *batch*: claim, publish the rows in order, mark what was published every
``mark_every`` rows (so a relay that dies mid-batch re-sends little), give back
what failed. Per key, the first failure stops that key: its later rows of the batch
are given back unsent, so one key's rows go out in the order they were written.
After ``max_failures`` failures in a row the broker is taken to be down: the rest of
the batch is given back unattempted, and the loop backs off (bounded, jittered)
before the next claim. A claim whose deadline is near (``ttl * claim_margin`` of
the relay's own clock since it asked for the claim) publishes no more: another relay may take
those rows once it lapses, and this one must not send them again beside it.

Poison rows (``dead_after``): a failed publish is a *strike* against its row only if
the broker took another row in the same batch: the broker worked, so the failure was
the row's. A batch in which nothing was published (a broker outage) strikes no row,
however many batches the outage lasts. A row whose strikes reach ``dead_after`` is
given up as *dead* (``Bury``): logged at ERROR, kept in the outbox, and no longer
holding its key back. So that poison rows cannot pass for an outage by filling the
head of every batch, the keys of rows that failed before (in this relay, or with
strikes in the store) go to the back of the batch, behind the fresh rows of other keys
(one key's rows keep their order: a key moves whole).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import InvalidInput, TransientStoreError
from .._outbox import QUEUE_KINDS, OutboxClaim, OutboxRow
from .._validate import check_name
from ._options import Backoff

__all__ = [
    "BatchCounts",
    "Bury",
    "Claim",
    "Clock",
    "Done",
    "Failed",
    "Prune",
    "Publish",
    "RelayConfig",
    "RelayCounts",
    "Release",
    "Stopping",
    "Wait",
    "batch",
    "drain",
    "loop",
]

log = logging.getLogger("fencing.relay")

HELD: Final = "held back: an earlier row of its key was not published"
UNTRIED: Final = "not attempted: the broker failed {n} times in a row"
LAPSING: Final = "not attempted: the claim was near its deadline"


# -- steps ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Claim:
    pass


@dataclass(frozen=True, slots=True)
class Publish:
    row: OutboxRow


@dataclass(frozen=True, slots=True)
class Failed:
    """A publish that raised: the exception, as the driver caught it."""

    error: BaseException

    def text(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"[:2000]


@dataclass(frozen=True, slots=True)
class Done:
    token: int
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Release:
    token: int
    ids: tuple[int, ...]
    error: str
    strike: bool = False


@dataclass(frozen=True, slots=True)
class Bury:
    token: int
    ids: tuple[int, ...]
    error: str


@dataclass(frozen=True, slots=True)
class Prune:
    pass


@dataclass(frozen=True, slots=True)
class Clock:
    pass


@dataclass(frozen=True, slots=True)
class Wait:
    seconds: float
    wake: bool


@dataclass(frozen=True, slots=True)
class Stopping:
    pass


# -- configuration and counts ------------------------------------------------------------------
def _seconds(value: object, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{what} is a number of seconds")
    if not low <= value <= high:
        raise InvalidInput(f"{what} is from {low} to {high} seconds, not {value}")
    return float(value)


def _count(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} is an integer from {low} to {high}")
    return value


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """A relay's settings (checked): see ``fencing.contrib.relay.Relay``."""

    name: str
    kind: str
    batch: int = 100
    ttl: float = 30.0
    poll: float = 1.0
    mark_every: int = 20
    max_failures: int = 3
    backoff: Backoff = field(default_factory=lambda: Backoff(0.5, 30.0))
    retention: float = 7 * 86400.0
    prune_every: float = 600.0
    claim_margin: float = 0.8
    #: strikes (failures while the broker took other rows) that make a row dead; None:
    #: never (a poison row then holds its key back until it is published or fixed)
    dead_after: int | None = 10

    def __post_init__(self) -> None:
        check_name(self.name, "relay")
        if self.kind not in QUEUE_KINDS:
            raise InvalidInput(f"queue kind must be one of {QUEUE_KINDS}, not {self.kind!r}")
        _count(self.batch, "batch", 1, 10_000)
        _seconds(self.ttl, "ttl", 0.1, 86400)
        _seconds(self.poll, "poll", 0.001, 3600)
        _count(self.mark_every, "mark_every", 1, 10_000)
        _count(self.max_failures, "max_failures", 1, 10_000)
        if not isinstance(self.backoff, Backoff):
            raise InvalidInput("backoff is a fencing.contrib Backoff")
        _seconds(self.retention, "retention", 0, 10 * 365 * 86400)
        _seconds(self.prune_every, "prune_every", 0.001, 86400)
        _seconds(self.claim_margin, "claim_margin", 0.1, 1.0)
        if self.dead_after is not None:
            _count(self.dead_after, "dead_after (or None: never)", 1, 10_000)


@dataclass(slots=True)
class BatchCounts:
    """What one claim came to."""

    claimed: int = 0
    published: int = 0
    marked: int = 0
    failed: int = 0
    held: int = 0
    #: rows published but not marked: the claim lapsed and another relay took them
    #: (they will be published again: the worker answers ``Duplicate``)
    lost: int = 0
    #: rows given up as dead (``dead_after`` strikes)
    dead: int = 0
    #: of ``held``, rows left unattempted after ``max_failures`` failures in a row
    untried: int = 0


@dataclass(slots=True)
class RelayCounts:
    """Totals of a relay's batches (``run_once`` returns them; ``Relay.counts`` keeps
    them for the relay's life)."""

    batches: int = 0
    claimed: int = 0
    published: int = 0
    marked: int = 0
    failed: int = 0
    held: int = 0
    lost: int = 0
    dead: int = 0
    pruned: int = 0

    def add(self, batch: BatchCounts) -> None:
        self.batches += 1
        self.claimed += batch.claimed
        self.published += batch.published
        self.marked += batch.marked
        self.failed += batch.failed
        self.held += batch.held
        self.lost += batch.lost
        self.dead += batch.dead

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


Flow = Generator[Any, Any, Any]


# -- one batch ------------------------------------------------------------------------------
def _log_publish(cfg: RelayConfig, claim: OutboxClaim, row: OutboxRow, elapsed: float) -> None:
    lag = max(0.0, claim.now + elapsed - row.created_at)
    log.info(
        "published outbox row %d (%s, key %s) after %.3fs",
        row.id,
        row.task,
        row.key,
        lag,
        extra={
            "fencing_relay": cfg.name,
            "fencing_queue": cfg.kind,
            "fencing_row_id": row.id,
            "fencing_task": row.task,
            "fencing_key": row.key,
            "fencing_lag": round(lag, 6),
            "fencing_attempts": row.attempts + 1,
            "fencing_claim": claim.token,
        },
    )


def _log_failure(cfg: RelayConfig, claim: OutboxClaim, row: OutboxRow, failed: Failed) -> None:
    log.warning(
        "could not publish outbox row %d (%s, key %s): %s",
        row.id,
        row.task,
        row.key,
        failed.text(),
        extra={
            "fencing_relay": cfg.name,
            "fencing_queue": cfg.kind,
            "fencing_row_id": row.id,
            "fencing_task": row.task,
            "fencing_key": row.key,
            "fencing_error": failed.text(),
            "fencing_attempts": row.attempts + 1,
            "fencing_claim": claim.token,
        },
    )


def _log_dead(cfg: RelayConfig, token: int, row: OutboxRow, error: str) -> None:
    log.error(
        "outbox row %d (%s, key %s) is dead after %d attempt(s), %d while the broker took"
        " other rows: %s. Its key's later rows go on without it (their order around it is"
        " broken); `fencing outbox URL --dead` lists it, `--retry %d` puts it back",
        row.id,
        row.task,
        row.key,
        row.attempts + 1,
        row.strikes + 1,
        error,
        row.id,
        extra={
            "fencing_relay": cfg.name,
            "fencing_queue": cfg.kind,
            "fencing_row_id": row.id,
            "fencing_task": row.task,
            "fencing_key": row.key,
            "fencing_route": row.queue,
            "fencing_options": dict(row.options),
            "fencing_payload": row.payload[:2000],
            "fencing_created_at": row.created_at,
            "fencing_error": error,
            "fencing_attempts": row.attempts + 1,
            "fencing_strikes": row.strikes + 1,
            "fencing_claim": token,
        },
    )


#: at most this many row ids remembered as having failed (``batch``'s ``suspects``)
MAX_SUSPECTS: Final = 10_000


def _in_order(rows: tuple[OutboxRow, ...], suspects: set[int]) -> list[OutboxRow]:
    """The claim's rows, the keys of rows that failed before last (whole, in order)."""
    late = {r.key for r in rows if r.strikes > 0 or r.id in suspects}
    if not late:
        return list(rows)
    return [r for r in rows if r.key not in late] + [r for r in rows if r.key in late]


def batch(cfg: RelayConfig, counts: BatchCounts, suspects: set[int] | None = None) -> Flow:
    """Claim once and publish what was claimed; fills ``counts``; returns it.
    ``suspects``: ids of rows whose publish failed in earlier batches (kept up to date)."""
    # the claim's age counts from before it was asked for: the store dates its deadline
    # from its own clock when the claim began, and the answer may take long to come
    # back (a loaded host, a slow commit); counted from the answer, a relay could
    # publish past the deadline while another relay takes its rows (older rows of a key
    # published after newer ones)
    started: float = yield Clock()
    claim: OutboxClaim = yield Claim()
    counts.claimed = len(claim.rows)
    if not claim.rows:
        return counts
    suspects = set() if suspects is None else suspects
    token = claim.token
    unmarked: list[int] = []
    given_back: dict[str, list[int]] = {}  # error text -> ids
    failures: list[tuple[OutboxRow, str]] = []  # rows whose publish failed
    stopped_keys: set[str] = set()
    in_a_row = 0
    stop_reason: str | None = None

    def back(error: str, row: OutboxRow) -> None:
        given_back.setdefault(error, []).append(row.id)

    def mark() -> Flow:
        if unmarked:
            ids = tuple(unmarked)
            unmarked.clear()
            marked = yield Done(token, ids)
            counts.marked += int(marked)
            counts.lost += len(ids) - int(marked)

    for row in _in_order(claim.rows, suspects):
        if row.key in stopped_keys:
            back(HELD, row)
            counts.held += 1
            continue
        if stop_reason is not None:
            back(stop_reason, row)
            counts.held += 1
            counts.untried += stop_reason != LAPSING
            continue
        now: float = yield Clock()
        if now - started > cfg.ttl * cfg.claim_margin:
            stop_reason = LAPSING
            back(stop_reason, row)
            counts.held += 1
            continue
        result = yield Publish(row)
        if isinstance(result, Failed):
            counts.failed += 1
            in_a_row += 1
            stopped_keys.add(row.key)
            _log_failure(cfg, claim, row, result)
            failures.append((row, result.text()))
            if in_a_row >= cfg.max_failures:
                stop_reason = UNTRIED.format(n=in_a_row)
            continue
        in_a_row = 0
        suspects.discard(row.id)
        counts.published += 1
        done_at: float = yield Clock()
        _log_publish(cfg, claim, row, done_at - started)
        unmarked.append(row.id)
        if len(unmarked) >= cfg.mark_every:
            yield from mark()
    yield from mark()
    # the broker took other rows of this batch: each failure was its row's (a strike)
    strike = counts.published > 0
    dying: dict[str, list[OutboxRow]] = {}
    struck: dict[str, list[int]] = {}
    for row, error in failures:
        if strike and cfg.dead_after is not None and row.strikes + 1 >= cfg.dead_after:
            dying.setdefault(error, []).append(row)
        elif strike:
            struck.setdefault(error, []).append(row.id)
        else:
            back(error, row)
    for error, rows in dying.items():
        buried = yield Bury(token, tuple(r.id for r in rows), error)
        counts.dead += int(buried)
        if buried:
            for row in rows:
                suspects.discard(row.id)
                _log_dead(cfg, token, row, error)
    for error, ids in struck.items():
        yield Release(token, tuple(ids), error, True)
    for error, ids in given_back.items():
        yield Release(token, tuple(ids), error)
    if len(suspects) > MAX_SUSPECTS:
        suspects.clear()
    dead_ids = {r.id for rows in dying.values() for r in rows}
    suspects.update(r.id for r, _ in failures if r.id not in dead_ids)
    return counts


# -- the loops -------------------------------------------------------------------------------
#: batches in a row that publish nothing but fail rows not seen failing before, after
#: which a drain stops (they may be poison rows filling the head of the outbox: the
#: next batch tries the rows behind them first)
FRUITLESS: Final = 3


def drain(
    cfg: RelayConfig,
    totals: RelayCounts,
    on_batch: Any = None,
    suspects: set[int] | None = None,
) -> Flow:
    """Prune sent rows past the retention, then batches until a claim finds nothing, or
    a batch publishes nothing (the broker is down, or every row left is another live
    relay's; up to ``FRUITLESS`` such batches if each failed ``max_failures`` rows not
    failing before and left rows behind them untried);
    returns ``totals``."""
    suspects = set() if suspects is None else suspects
    totals.pruned += int((yield Prune()))
    fruitless = 0
    while True:
        counts = BatchCounts()
        known = set(suspects)
        yield from batch(cfg, counts, suspects)
        totals.add(counts)
        if on_batch is not None:
            on_batch(counts, totals)
        if counts.claimed == 0:
            return totals
        if counts.published == 0:
            fruitless += 1
            if fruitless >= FRUITLESS or suspects <= known or not counts.untried:
                return totals
        else:
            fruitless = 0
        if (yield Stopping()):
            return totals


def loop(
    cfg: RelayConfig,
    totals: RelayCounts,
    on_batch: Any = None,
    suspects: set[int] | None = None,
) -> Flow:
    """Relay until asked to stop: drain, wait for new rows (``poll``, or the waker),
    back off (bounded, jittered) while the broker or the store fails, prune sent rows
    every ``prune_every`` seconds."""
    suspects = set() if suspects is None else suspects
    streak = 0
    pruned_at: float | None = None
    while not (yield Stopping()):
        now: float = yield Clock()
        if pruned_at is None or now - pruned_at >= cfg.prune_every:
            pruned_at = now
            try:
                totals.pruned += int((yield Prune()))
            except TransientStoreError as exc:
                log.warning("could not prune the outbox: %s", exc)
        counts = BatchCounts()
        try:
            yield from batch(cfg, counts, suspects)
        except TransientStoreError as exc:
            streak += 1
            delay = cfg.backoff.delay(streak)
            log.warning("the store failed (%s); next claim in %.2fs", exc, delay)
            yield Wait(delay, False)
            continue
        totals.add(counts)
        if on_batch is not None:
            on_batch(counts, totals)
        if counts.failed and not counts.published:
            streak += 1
            delay = cfg.backoff.delay(streak)
            log.warning("the broker failed %d time(s); next claim in %.2fs", counts.failed, delay)
            yield Wait(delay, False)
            continue
        streak = 0
        if counts.claimed < cfg.batch:
            yield Wait(cfg.poll, True)
    return totals
