"""The relay's flow (``fencing.contrib._relayflow``) driven by hand: no store, no broker,
a fake clock. Each step the flow yields is answered by a script, so a property that
needs time to pass (a claim near its deadline, a backoff after an outage) is exact.

What they prove: a claim publishes nothing once ``ttl * claim_margin`` of its own clock
has passed (and still publishes up to that point); the backoff streak starts over after
a batch that published, so an outage late in a relay's life backs off from the base.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from fencing import InvalidInput
from fencing._errors import TransientStoreError
from fencing._outbox import OutboxClaim, OutboxRow
from fencing.contrib._options import Backoff
from fencing.contrib._relayflow import (
    LAPSING,
    MAX_SUSPECTS,
    BatchCounts,
    Bury,
    Claim,
    Clock,
    Done,
    Failed,
    Prune,
    Publish,
    RelayConfig,
    RelayCounts,
    Release,
    Stopping,
    Wait,
    batch,
    drain,
    loop,
)


def row(id: int, key: str) -> OutboxRow:
    return OutboxRow(
        id, "celery", "ship", None, "{}", {}, key, 0.0, 0, None, None, None, None, None
    )


class Raise:
    """An answer that is an error: the driver throws it into the flow at that step."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def drive(flow: Any, answer: Callable[[Any], Any]) -> Any:
    """Run ``flow`` to its end, answering each step with ``answer(step)``."""
    try:
        step = next(flow)
        while True:
            result = answer(step)
            step = flow.throw(result.error) if isinstance(result, Raise) else flow.send(result)
    except StopIteration as stop:
        return stop.value


def test_a_claim_near_its_deadline_publishes_no_more() -> None:
    """With ``ttl=10`` and ``claim_margin=0.8``, a row reached 8 s after the claim is
    published, one reached at 8.5 s (the claim still has 1.5 s to live) is not: it is
    given back, as is every row after it."""
    cfg = RelayConfig("r", "celery", ttl=10.0, claim_margin=0.8)
    rows = (row(1, "a"), row(2, "b"), row(3, "c"), row(4, "d"))
    # the clock: claimed at 100; rows reached at 101, 108 (the margin exactly), 108.5
    times = iter([100.0, 101.0, 101.5, 108.0, 108.2, 108.5])
    published: list[int] = []
    released: list[Release] = []

    def answer(step: Any) -> Any:
        if isinstance(step, Claim):
            return OutboxClaim(7, rows, until=110.0, now=100.0)
        if isinstance(step, Clock):
            return next(times)
        if isinstance(step, Publish):
            published.append(step.row.id)
            return None
        if isinstance(step, Done):
            return len(step.ids)
        if isinstance(step, Release):
            released.append(step)
            return len(step.ids)
        raise AssertionError(step)

    counts = drive(batch(cfg, BatchCounts()), answer)
    assert published == [1, 2]
    assert (counts.published, counts.marked, counts.held, counts.untried) == (2, 2, 2, 0)
    assert released == [Release(7, (3, 4), LAPSING)]


def test_a_claims_age_counts_from_before_it_was_asked_for() -> None:
    """The store dates a claim's deadline from its own clock when the claim began: a
    claim whose answer took 8.5 s to come back (a loaded host, a slow commit; ``ttl=10``,
    ``claim_margin=0.8``) publishes nothing and gives its rows back, since another
    relay may take them 1.5 s later (counted from the answer, the relay would publish
    for 8 s more, past the deadline, beside that relay: a key's older row after its newer
    one)."""
    cfg = RelayConfig("r", "celery", ttl=10.0, claim_margin=0.8)
    rows = (row(1, "a"), row(2, "a"))
    clock = [100.0]
    published: list[int] = []
    released: list[Release] = []

    def answer(step: Any) -> Any:
        if isinstance(step, Claim):
            clock[0] += 8.5  # the claim's round trip
            return OutboxClaim(7, rows, until=110.0, now=100.0)
        if isinstance(step, Clock):
            return clock[0]
        if isinstance(step, Publish):
            published.append(step.row.id)
            return None
        if isinstance(step, Release):
            released.append(step)
            return len(step.ids)
        raise AssertionError(step)

    counts = drive(batch(cfg, BatchCounts()), answer)
    assert published == [] and (counts.claimed, counts.held) == (2, 2)
    assert released == [Release(7, (1, 2), LAPSING)]


class Script:
    """Answers ``loop``'s steps: one row per claim, published or failed as ``outcomes``
    says (True: the broker took it); records every ``Wait``; stops when they run out."""

    def __init__(self, outcomes: list[bool]) -> None:
        self.outcomes = list(outcomes)
        self.ok = True
        self.now = 0.0
        self.waits: list[Wait] = []
        self.next_id = 1

    def __call__(self, step: Any) -> Any:
        if isinstance(step, Stopping):
            return not self.outcomes
        if isinstance(step, Clock):
            self.now += 0.001
            return self.now
        if isinstance(step, Prune):
            return 0
        if isinstance(step, Claim):
            self.ok = self.outcomes.pop(0)
            claimed = (row(self.next_id, f"k{self.next_id}"),)
            self.next_id += 1
            return OutboxClaim(1, claimed, until=self.now + 30, now=self.now)
        if isinstance(step, Publish):
            return None if self.ok else Failed(ConnectionError("broker down"))
        if isinstance(step, Done | Release):
            return len(step.ids)
        if isinstance(step, Wait):
            self.waits.append(step)
            return None
        raise AssertionError(step)


def test_the_backoff_starts_over_after_a_batch_that_published() -> None:
    """Four failed batches back off 1, 2, 4, 8 s (jittered to their upper half); a good
    batch then resets the streak, so the next failure waits 1 s again, not 16 s."""
    cfg = RelayConfig("r", "celery", batch=10, poll=0.25, backoff=Backoff(1.0, 1000.0))
    script = Script([False, False, False, False, True, False])
    drive(loop(cfg, RelayCounts()), script)
    waits = [(w.seconds, w.wake) for w in script.waits]
    assert len(waits) == 6
    for (seconds, wake), ceiling in zip(waits[:4], (1, 2, 4, 8), strict=True):
        assert ceiling / 2 <= seconds <= ceiling and wake is False
    assert waits[4] == (0.25, True)  # the good batch: the poll, wakeable
    seconds, wake = waits[5]
    assert 0.5 <= seconds <= 1.0 and wake is False


def test_the_loop_backs_off_on_store_errors_and_prunes_every_prune_every(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store failing a claim backs off like a broker outage (1 s, then 2 s), and its
    error is logged; a full batch (``claimed == batch``) claims again at once; a
    partial one waits for the poll. Pruning runs at the loop's first turn and then every
    ``prune_every`` seconds of its clock (10 s here: at 0, 10 and 20.5, not at 5 or 15);
    a prune that fails is logged and the loop goes on."""
    cfg = RelayConfig(
        "r", "celery", batch=1, poll=0.25, prune_every=10.0, backoff=Backoff(1.0, 1000.0)
    )
    # each turn of the loop: (its clock, what the claim does)
    turns = [(0.0, "store"), (5.0, "store"), (10.0, "full"), (15.0, "full"), (20.5, "part")]
    now = 0.0
    prunes: list[float] = []
    waits: list[Wait] = []
    batches: list[tuple[int, int]] = []
    claim_ids = iter(range(1, 100))

    def answer(step: Any) -> Any:
        nonlocal now
        if isinstance(step, Stopping):
            if not turns:
                return True
            now = turns[0][0]
            return False
        if isinstance(step, Clock):
            return now
        if isinstance(step, Prune):
            prunes.append(now)
            if len(prunes) == 2:
                return Raise(TransientStoreError("prune: the database is locked"))
            return 2
        if isinstance(step, Claim):
            _, what = turns.pop(0)
            if what == "store":
                return Raise(TransientStoreError("claim: the database is locked"))
            rows = () if what == "part" else (row(next(claim_ids), "k"),)
            return OutboxClaim(1, rows, until=now + 30, now=now)
        if isinstance(step, Publish):
            return None
        if isinstance(step, Done | Release):
            return len(step.ids)
        if isinstance(step, Wait):
            waits.append(step)
            return None
        raise AssertionError(step)

    totals = RelayCounts()
    with caplog.at_level(logging.WARNING, logger="fencing.relay"):
        drive(loop(cfg, totals, lambda c, t: batches.append((c.claimed, t.claimed))), answer)
    assert prunes == [0.0, 10.0, 20.5]
    assert totals.pruned == 4  # two prunes of 2 rows; the failed one counts nothing
    assert batches == [(1, 1), (1, 2), (0, 2)]
    assert [w.wake for w in waits] == [False, False, True]
    assert 0.5 <= waits[0].seconds <= 1.0 and 1.0 <= waits[1].seconds <= 2.0
    assert waits[2].seconds == 0.25
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith(
        "the store failed (claim: the database is locked); next claim in "
    )
    assert messages[2] == "could not prune the outbox: prune: the database is locked"
    assert len(messages) == 3


INTEGERS = [
    ("batch", "batch", 1, 10_000),
    ("mark_every", "mark_every", 1, 10_000),
    ("max_failures", "max_failures", 1, 10_000),
    ("dead_after", "dead_after (or None: never)", 1, 10_000),
]
SECONDS = [
    ("ttl", 0.1, 86400),
    ("poll", 0.001, 3600),
    ("retention", 0, 10 * 365 * 86400),
    ("prune_every", 0.001, 86400),
    ("claim_margin", 0.1, 1.0),
]


def refused(message: str, **settings: Any) -> None:
    with pytest.raises(InvalidInput, match="^" + re.escape(message) + "$"):
        RelayConfig("r", "celery", **settings)


@pytest.mark.parametrize(("field", "what", "low", "high"), INTEGERS)
def test_a_relay_count_setting_is_an_integer_in_its_range(
    field: str, what: str, low: int, high: int
) -> None:
    for ok in (low, high):
        assert getattr(RelayConfig("r", "celery", **{field: ok}), field) == ok
    message = f"{what} is an integer from {low} to {high}"
    for bad in (low - 1, high + 1, True, 2.0, "3"):
        refused(message, **{field: bad})


@pytest.mark.parametrize(("field", "low", "high"), SECONDS)
def test_a_relay_time_setting_is_seconds_in_its_range(field: str, low: float, high: float) -> None:
    for ok in (low, high):
        assert getattr(RelayConfig("r", "celery", **{field: ok}), field) == ok
    for bad in (low - 0.0001, high + 0.0001):
        refused(f"{field} is from {low} to {high} seconds, not {bad}", **{field: bad})
    for bad in (True, "1", math.nan, math.inf):
        refused(f"{field} is a number of seconds", **{field: bad})


def test_a_relay_s_name_kind_and_backoff_are_checked() -> None:
    with pytest.raises(InvalidInput, match=r"^relay name 'no spaces' is not allowed"):
        RelayConfig("no spaces", "celery")
    with pytest.raises(InvalidInput, match=r"^queue kind must be one of"):
        RelayConfig("r", "carrier-pigeon")
    refused("backoff is a fencing.contrib Backoff", backoff=(1, 2))
    assert RelayConfig("r", "celery", dead_after=None).dead_after is None


def test_what_the_relay_logs_of_a_published_a_failed_and_a_dead_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each record's message and structured fields, exactly: a published row (its lag by
    the store's clock), a failed one, and one that failed its ``dead_after``-th strike."""
    cfg = RelayConfig("relay-1", "celery", dead_after=3)
    good = row(1, "a")
    good = OutboxRow(**{**_fields(good), "attempts": 1, "created_at": 90.0})
    poison = OutboxRow(
        **{
            **_fields(row(2, "b")),
            "queue": "q1",
            "options": {"priority": 5},
            "payload": LONG,
            "attempts": 4,
            "strikes": 2,
            "created_at": 80.0,
        }
    )
    times = iter([50.0, 51.0, 52.50000037, 53.0])

    def answer(step: Any) -> Any:
        if isinstance(step, Claim):
            return OutboxClaim(7, (good, poison), until=130.0, now=100.0)
        if isinstance(step, Clock):
            return next(times)
        if isinstance(step, Publish):
            return None if step.row.id == 1 else Failed(ValueError("poison"))
        if isinstance(step, Done | Bury | Release):
            return len(step.ids)
        raise AssertionError(step)

    with caplog.at_level(logging.INFO, logger="fencing.relay"):
        counts = drive(batch(cfg, BatchCounts()), answer)
    assert (counts.published, counts.failed, counts.dead) == (1, 1, 1)
    published, failed, dead = caplog.records
    assert (published.levelno, failed.levelno, dead.levelno) == (20, 30, 40)
    assert published.getMessage() == "published outbox row 1 (ship, key a) after 12.500s"
    common = {"fencing_relay": "relay-1", "fencing_queue": "celery", "fencing_task": "ship"}
    assert _extra(published) == {
        **common,
        "fencing_row_id": 1,
        "fencing_key": "a",
        "fencing_lag": 12.5,  # 100 (claimed, the store's clock) + 2.5 s - 90, to the µs
        "fencing_attempts": 2,
        "fencing_claim": 7,
    }
    assert failed.getMessage() == "could not publish outbox row 2 (ship, key b): ValueError: poison"
    assert _extra(failed) == {
        **common,
        "fencing_row_id": 2,
        "fencing_key": "b",
        "fencing_error": "ValueError: poison",
        "fencing_attempts": 5,
        "fencing_claim": 7,
    }
    assert dead.getMessage() == (
        "outbox row 2 (ship, key b) is dead after 5 attempt(s), 3 while the broker took"
        " other rows: ValueError: poison. Its key's later rows go on without it (their"
        " order around it is broken); `fencing outbox URL --dead` lists it, `--retry 2`"
        " puts it back"
    )
    assert _extra(dead) == {
        **common,
        "fencing_row_id": 2,
        "fencing_key": "b",
        "fencing_route": "q1",
        "fencing_options": {"priority": 5},
        "fencing_payload": LONG[:2000],  # at most 2000 characters of it
        "fencing_created_at": 80.0,
        "fencing_error": "ValueError: poison",
        "fencing_attempts": 5,
        "fencing_strikes": 3,
        "fencing_claim": 7,
    }


LONG = '{"p": "' + "x" * 2100 + '"}'


def _fields(r: OutboxRow) -> dict[str, Any]:
    return {name: getattr(r, name) for name in OutboxRow.__dataclass_fields__}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k.startswith("fencing_")}


def run_drain(
    plan: list[str], suspects: set[int] | None = None, pruned: int = 0
) -> tuple[int, RelayCounts, list[int]]:
    """Drive ``drain`` over claims of two rows of two keys each: "fail" (the first row
    fails, the second is left untried: ``max_failures=1``), "good" (both published),
    "one" (a claim of one row, published);
    then empty claims. Returns how many claims it made, the totals, ``on_batch``'s view."""
    cfg = RelayConfig("r", "celery", max_failures=1)
    claims = 0
    ids = iter(range(1, 1000))
    outcome = "fail"
    seen: list[int] = []

    def answer(step: Any) -> Any:
        nonlocal claims, outcome
        if isinstance(step, Prune):
            return 2
        if isinstance(step, Stopping):
            return False
        if isinstance(step, Clock):
            return 0.0
        if isinstance(step, Claim):
            claims += 1
            assert claims < 20, "drain never stopped"
            if not plan:
                return OutboxClaim(1, (), until=30.0, now=0.0)
            outcome = plan.pop(0)
            rows = (row(next(ids), f"a{claims}"), row(next(ids), f"b{claims}"))
            return OutboxClaim(1, rows[: 1 if outcome == "one" else 2], until=30.0, now=0.0)
        if isinstance(step, Publish):
            return Failed(ConnectionError("down")) if outcome == "fail" else None
        if isinstance(step, Done | Release):
            return len(step.ids)
        raise AssertionError(step)

    totals = RelayCounts(pruned=pruned)
    drain_flow = drain(cfg, totals, lambda c, t: seen.append(t.batches), suspects)
    assert drive(drain_flow, answer) is totals
    return claims, totals, seen


def test_a_drain_stops_after_fruitless_batches_or_an_empty_claim() -> None:
    """Batches that publish nothing but fail rows not failing before, leaving rows
    untried, go on up to FRUITLESS (3) in a row; a good batch starts the count over; a
    batch whose failures were all known before stops at once; an empty claim ends it."""
    claims, totals, seen = run_drain(["fail"] * 5, pruned=5)
    assert claims == 3 and totals.batches == 3 and seen == [1, 2, 3]
    assert totals.pruned == 7  # pruned once first, added to what it had
    claims, _, _ = run_drain(["fail", "fail", "good", "fail", "fail", "fail", "fail"])
    assert claims == 6
    claims, _, _ = run_drain(["one", "good"])
    assert claims == 3  # a batch of one row, a good batch, then the empty claim
    known = {1, 2}  # the rows that will fail were failing before
    claims, _, _ = run_drain(["fail", "fail"], suspects=known)
    assert claims == 1 and known == {1, 2}


# -- one batch's steps and counts, exactly (issue 23) ----------------------------------------
def struck(id: int, key: str, strikes: int) -> OutboxRow:
    return OutboxRow(**{**_fields(row(id, key)), "strikes": strikes})


def run_batch(
    cfg: RelayConfig,
    rows: tuple[OutboxRow, ...],
    fail: set[int],
    suspects: set[int] | None = None,
    marked: Callable[[tuple[int, ...]], int] = len,
    times: list[float] | None = None,
) -> tuple[BatchCounts, list[Any]]:
    """Drive one ``batch`` over ``rows`` (those in ``fail`` fail to publish, each with its
    own error); ``Done`` answers ``marked(ids)``; the clock reads ``times`` (else 0)."""
    steps: list[Any] = []
    clock = iter(times or [])

    def answer(step: Any) -> Any:
        steps.append(step)
        if isinstance(step, Claim):
            return OutboxClaim(7, rows, until=30.0, now=0.0)
        if isinstance(step, Clock):
            return next(clock, 0.0)
        if isinstance(step, Publish):
            return Failed(ConnectionError(f"no {step.row.id}")) if step.row.id in fail else None
        if isinstance(step, Done):
            return marked(step.ids)
        if isinstance(step, Bury | Release):
            return len(step.ids)
        raise AssertionError(step)

    counts = drive(batch(cfg, BatchCounts(), suspects), answer)
    return counts, steps


def attempted(steps: list[Any]) -> list[int]:
    return [s.row.id for s in steps if isinstance(s, Publish)]


def given_back(steps: list[Any]) -> list[Any]:
    return [s for s in steps if isinstance(s, Release | Bury | Done)]


def test_a_row_with_one_strike_goes_behind_the_fresh_rows() -> None:
    rows = (struck(1, "a", 1), row(2, "a"), row(3, "b"))
    _, steps = run_batch(RelayConfig("r", "celery"), rows, set())
    assert attempted(steps) == [3, 1, 2]  # key a moves whole, in its own order


def test_rows_are_marked_every_mark_every_rows() -> None:
    rows = tuple(row(i, f"k{i}") for i in range(1, 6))
    _, steps = run_batch(RelayConfig("r", "celery", mark_every=2), rows, set())
    assert given_back(steps) == [Done(7, (1, 2)), Done(7, (3, 4)), Done(7, (5,))]


def test_rows_published_but_not_marked_are_counted_lost_over_every_mark() -> None:
    rows = tuple(row(i, f"k{i}") for i in range(1, 4))
    cfg = RelayConfig("r", "celery", mark_every=1)
    counts, _ = run_batch(cfg, rows, set(), marked=lambda ids: 0)
    assert (counts.published, counts.marked, counts.lost) == (3, 0, 3)


def test_what_a_batch_counts_and_gives_back_when_rows_fail() -> None:
    """``max_failures=2``: a failure after a good publish starts the count over; two in
    a row leave the rest untried (the message says how many); a failed row's key holds
    its later rows back; each failure is a strike (the broker took other rows), given
    back with its own error."""
    cfg = RelayConfig("r", "celery", max_failures=2, dead_after=None)
    rows = (
        row(1, "a"),  # fails (1 in a row)
        row(2, "b"),  # published: the count starts over
        row(3, "a"),  # held back: key a failed
        row(4, "c"),  # fails (1 in a row)
        row(5, "d"),  # published
        row(6, "e"),  # fails (1)
        row(7, "f"),  # fails (2 in a row): the broker is taken to be down
        row(8, "g"),  # untried
        row(9, "h"),  # untried
        row(10, "a"),  # held back: key a failed
    )
    counts, steps = run_batch(cfg, rows, {1, 4, 6, 7})
    assert attempted(steps) == [1, 2, 4, 5, 6, 7]
    assert (counts.published, counts.failed, counts.held, counts.untried) == (2, 4, 4, 2)
    untried = "not attempted: the broker failed 2 times in a row"
    assert given_back(steps) == [
        Done(7, (2, 5)),
        Release(7, (1,), "ConnectionError: no 1", True),
        Release(7, (4,), "ConnectionError: no 4", True),
        Release(7, (6,), "ConnectionError: no 6", True),
        Release(7, (7,), "ConnectionError: no 7", True),
        Release(7, (3, 10), "held back: an earlier row of its key was not published"),
        Release(7, (8, 9), untried),
    ]


def test_rows_held_by_a_key_and_by_a_lapsing_claim_all_count_held() -> None:
    cfg = RelayConfig("r", "celery", ttl=10.0, claim_margin=0.5)
    rows = (row(1, "a"), row(2, "a"), row(3, "b"), row(4, "c"))
    # claimed at 0; row 1 reached at 1; row 3 at 6 (past 10 * 0.5): it and row 4 lapse
    counts, steps = run_batch(cfg, rows, {1}, times=[0.0, 1.0, 6.0])
    assert attempted(steps) == [1]
    assert (counts.failed, counts.held, counts.untried) == (1, 3, 0)


def test_the_suspects_are_kept_up_to_date() -> None:
    """A row that fails joins the suspects; one published or buried leaves them."""
    cfg = RelayConfig("r", "celery", dead_after=2)
    suspects = {1, 2, 3}
    rows = (row(1, "a"), struck(2, "b", 1), row(3, "c"), row(4, "d"))
    counts, steps = run_batch(cfg, rows, {2, 4}, suspects)
    assert counts.dead == 1 and Bury(7, (2,), "ConnectionError: no 2") in steps
    assert suspects == {4}


@pytest.mark.parametrize(
    ("before", "after"), [(MAX_SUSPECTS, MAX_SUSPECTS + 1), (MAX_SUSPECTS + 1, 1)]
)
def test_the_suspects_are_forgotten_past_max_suspects(before: int, after: int) -> None:
    suspects = set(range(100_000, 100_000 + before))
    run_batch(RelayConfig("r", "celery"), (row(1, "a"),), {1}, suspects)
    assert len(suspects) == after and 1 in suspects


def test_a_published_row_s_lag_is_never_below_zero_nor_rounded_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lag is the store's clock at the claim plus the relay's time since, less the
    row's ``created_at``: 0.25 s here; a row stamped ahead of the claim (clocks of two
    servers) lags 0, not a negative time."""
    rows = (
        OutboxRow(**{**_fields(row(1, "a")), "created_at": 99.75}),
        OutboxRow(**{**_fields(row(2, "b")), "created_at": 120.0}),
    )

    def answer(step: Any) -> Any:
        if isinstance(step, Claim):
            return OutboxClaim(7, rows, until=130.0, now=100.0)
        if isinstance(step, Clock):
            return 0.0
        return None if isinstance(step, Publish) else len(step.ids)

    with caplog.at_level(logging.INFO, logger="fencing.relay"):
        drive(batch(RelayConfig("r", "celery"), BatchCounts()), answer)
    assert [_extra(r)["fencing_lag"] for r in caplog.records] == [0.25, 0.0]


def test_a_failure_s_text_is_at_most_2000_characters() -> None:
    assert Failed(ValueError("x" * 10)).text() == "ValueError: xxxxxxxxxx"
    text = Failed(ValueError("x" * 3000)).text()
    assert text == "ValueError: " + "x" * 1988 and len(text) == 2000


def test_relay_counts_as_a_dict() -> None:
    counts = RelayCounts(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert counts.as_dict() == {
        "batches": 1,
        "claimed": 2,
        "published": 3,
        "marked": 4,
        "failed": 5,
        "held": 6,
        "lost": 7,
        "dead": 8,
        "pruned": 9,
    }


@pytest.mark.parametrize("caller_s", [False, True], ids=["its-own", "the-caller-s"])
def test_the_loop_remembers_failed_rows_across_batches(
    caller_s: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Row 1 fails in the first batch (the broker down: nothing published); in the
    second it goes behind row 3 of another key, although the store gave it no strike:
    the loop keeps its suspects (the caller's set, if it gave one) from batch to batch.
    The backoff is logged with the failures counted."""
    cfg = RelayConfig("r", "celery", backoff=Backoff(1.0, 1000.0))
    given: set[int] | None = set() if caller_s else None  # (a fresh set each run)
    claims = [(row(1, "a"),), (row(1, "a"), row(3, "c"))]
    order: list[list[int]] = []

    def answer(step: Any) -> Any:
        if isinstance(step, Stopping):
            return not claims
        if isinstance(step, Clock | Prune):
            return 0
        if isinstance(step, Claim):
            rows = claims.pop(0)
            order.append([])
            return OutboxClaim(1, rows, until=30.0, now=0.0)
        if isinstance(step, Publish):
            order[-1].append(step.row.id)
            return Failed(ConnectionError("down")) if step.row.id == 1 else None
        if isinstance(step, Done | Release | Bury):
            return len(step.ids)
        if isinstance(step, Wait):
            return None
        raise AssertionError(step)

    with caplog.at_level(logging.WARNING, logger="fencing.relay"):
        drive(loop(cfg, RelayCounts(), None, given), answer)
    assert order == [[1], [3, 1]]
    if given is not None:
        assert given == {1}
    backoffs = [r.getMessage() for r in caplog.records if "next claim" in r.getMessage()]
    assert len(backoffs) == 1
    found = re.fullmatch(r"the broker failed 1 time\(s\); next claim in (\d+\.\d\d)s", backoffs[0])
    assert found is not None, backoffs[0]
    assert 0.5 <= float(found[1]) <= 1.0
