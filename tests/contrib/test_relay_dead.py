"""Poison outbox rows and the relay's ``dead_after``, on every store with an outbox
(memory, SQLite, PostgreSQL, MariaDB), through ``Relay`` and ``AsyncRelay``, with
recording publishers; then ``fencing outbox --dead/--fail-if-dead/--retry/--drop`` and
``fencing relay --dead-after``.

What they prove: a row whose publish always fails, while the broker takes the other
rows, is given up as dead after ``dead_after`` strikes (logged at ERROR with its
fields, counted), and its key's later rows then go on; a broker outage, however many
batches it lasts, kills no row, even with ``dead_after=1``, and when it ends every row
is delivered; an outage that begins mid-batch strikes a row at most once; poison rows
filling the head of every batch (more than ``max_failures``) do not pass for an
outage; ``dead_after=None`` never gives a row up; a dead row put back is published.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencing
from fencing._cli import main
from fencing.contrib.relay import AsyncRelay, OutboxRow, Relay, RelayCounts

from .._syncify import Loop, Syncified
from ..test_outbox import OUTBOX_STORES, TASK

pytestmark = pytest.mark.backends(only=lambda name: name in OUTBOX_STORES)


class Publisher:
    """Records what it sent; raises for a row ``fail(row)`` says fails."""

    kind = "celery"

    def __init__(self, fail: Callable[[OutboxRow], bool]) -> None:
        self.fail = fail
        self.sent: list[OutboxRow] = []
        self.failed: list[int] = []

    def publish(self, row: OutboxRow) -> None:
        if self.fail(row):
            self.failed.append(row.id)
            raise ValueError(f"the broker refuses row {row.id}")
        self.sent.append(row)

    def close(self) -> None:
        pass


class Side:
    """One store through the sync or the async front, and one relay on it (kept, so its
    memory of failed rows lasts across ``run_once`` calls, as in a relay process)."""

    def __init__(self, url: str, api: str, loop: Loop) -> None:
        self.api, self.lp = api, loop
        if api == "sync":
            self.raw: Any = fencing.open(url)
            self.store: Any = self.raw
        else:
            self.raw = loop.run(fencing.open_async(url))
            self.store = Syncified(self.raw, loop)
        self.orders = self.store.collection("orders")
        self.relay: Any = None
        self.made: set[str] = set()

    def send(self, key: str, count: int = 1) -> list[OutboxRow]:
        if key not in self.made:
            self.orders.create(key, {"n": 0})
            self.made.add(key)
        record = self.orders.get(key)
        return [self.store.outbox.send(TASK, record, f"t{i}") for i in range(count)]

    def start(self, publisher: Publisher, **options: Any) -> None:
        options.setdefault("batch", 100)
        options.setdefault("max_failures", 3)
        kind = Relay if self.api == "sync" else AsyncRelay
        self.relay = kind(self.raw, publisher, name="dead-tests", **options)

    def run_once(self) -> RelayCounts:
        found = self.relay.run_once()
        return found if self.api == "sync" else self.lp.run(found)

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def side(store_url: str, api: str, loop: Loop) -> Iterator[Side]:
    found = Side(store_url, api, loop)
    yield found
    found.close()


def _per_key(rows: list[OutboxRow]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for row in rows:
        found.setdefault(row.key, []).append(row.id)
    return found


def test_a_poison_row_dies_after_dead_after_strikes_and_its_key_goes_on(
    side: Side, caplog: pytest.LogCaptureFixture
) -> None:
    poison, *later = side.send("p", 3)
    pub = Publisher(lambda row: row.id == poison.id)
    side.start(pub, dead_after=3)
    totals = RelayCounts()
    with caplog.at_level(logging.ERROR, logger="fencing.relay"):
        for round_ in range(3):  # other keys' traffic: the broker takes their rows
            side.send(f"o-{round_}", 2)
            counts = side.run_once()
            totals.dead += counts.dead
            if round_ < 2:
                (row,) = [r for r in side.store.outbox.pending() if r.id == poison.id]
                assert (row.strikes, row.state) == (round_ + 1, "pending")
    assert totals.dead == 1
    (dead,) = side.store.outbox.dead()
    assert (dead.id, dead.strikes, dead.payload) == (poison.id, 3, poison.payload)
    assert dead.attempts >= 3 and dead.last_error == f"ValueError: the broker refuses row {dead.id}"
    assert side.store.outbox.stats().dead == 1 and side.store.outbox.stats().pending == 0
    # its key's later rows went on without it, in their order
    assert _per_key(pub.sent)[poison.key] == [r.id for r in later]
    assert sorted(r.id for r in pub.sent) == sorted({r.id for r in pub.sent})  # each once
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    fields = record.__dict__
    assert fields["fencing_row_id"] == poison.id and fields["fencing_key"] == poison.key
    assert fields["fencing_payload"] == poison.payload and fields["fencing_strikes"] == 3
    assert fields["fencing_error"] == dead.last_error and "is dead" in record.getMessage()

    # put back (once the cause is fixed), it is published like any row
    pub.fail = lambda row: False
    assert side.store.outbox.retry([poison.id]) == 1
    assert side.run_once().published == 1 and pub.sent[-1].id == poison.id
    assert side.store.outbox.dead() == [] and side.store.outbox.stats().pending == 0


def test_a_broker_outage_kills_no_row_however_long(side: Side) -> None:
    rows = [row for k in range(4) for row in side.send(f"k-{k}", 3)]
    down = True
    pub = Publisher(lambda row: down)
    side.start(pub, dead_after=1)  # the strictest: one strike kills
    batches = 0
    for _ in range(12):  # the broker is down for many batches
        counts = side.run_once()
        assert counts.published == counts.dead == 0 and counts.failed >= 1
        batches += counts.batches
    assert batches >= 12 and len(pub.failed) >= 36
    assert side.store.outbox.dead() == [] and side.store.outbox.stats().dead == 0
    assert all(r.strikes == 0 for r in side.store.outbox.pending(limit=100))
    down = False  # the broker is back: every row delivered, in each key's order
    counts = side.run_once()
    assert (counts.published, counts.dead) == (len(rows), 0)
    assert sorted(r.id for r in pub.sent) == [r.id for r in rows]
    assert all(ids == sorted(ids) for ids in _per_key(pub.sent).values())
    assert side.store.outbox.stats().pending == 0 and side.store.outbox.dead() == []


def test_an_outage_that_begins_mid_batch_strikes_a_row_at_most_once(side: Side) -> None:
    rows = [row for k in range(10) for row in side.send(f"k-{k}", 2)]
    calls = 0

    def fail(row: OutboxRow) -> bool:
        nonlocal calls
        calls += 1
        return calls > 5 and not back  # up for 5 publishes, then down

    back = False
    pub = Publisher(fail)
    side.start(pub, dead_after=2)
    for _ in range(8):
        assert side.run_once().dead == 0
    assert max(r.strikes for r in side.store.outbox.pending(limit=100)) <= 1
    back = True
    side.run_once()
    assert sorted(r.id for r in pub.sent) == [r.id for r in rows]
    assert side.store.outbox.dead() == []


def test_poison_rows_filling_the_head_of_every_batch_are_not_an_outage(side: Side) -> None:
    poison = [side.send(f"p-{k}")[0] for k in range(5)]  # more than max_failures
    bad = {r.id for r in poison}
    pub = Publisher(lambda row: row.id in bad)
    side.start(pub, dead_after=2, max_failures=3)
    good = []
    for round_ in range(6):
        good += side.send(f"g-{round_}", 2)
        side.run_once()
    assert {r.id for r in side.store.outbox.dead(limit=100)} == bad
    assert sorted(r.id for r in pub.sent) == [r.id for r in good]  # none held back for good


def test_dead_after_none_never_gives_a_row_up(side: Side) -> None:
    poison, held = side.send("p", 2)
    pub = Publisher(lambda row: row.id == poison.id)
    side.start(pub, dead_after=None)
    for round_ in range(4):
        side.send(f"o-{round_}")
        assert side.run_once().dead == 0
    (row,) = [r for r in side.store.outbox.pending() if r.id == poison.id]
    assert row.strikes == 4  # counted, never acted on
    assert held.id not in {r.id for r in pub.sent}  # its key keeps its order at all cost
    assert side.store.outbox.dead() == []


# -- the command line (SQLite file: the CLI opens the store by URL) ----------------------------
@pytest.mark.backends(only=lambda name: name == "sqlite-file")
@pytest.mark.apis(only=["sync"])
def test_outbox_command_lists_retries_and_drops_dead_rows(
    side: Side, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    poison = [side.send(f"p-{k}")[0] for k in range(2)]
    bad = {r.id for r in poison}
    side.start(Publisher(lambda row: row.id in bad), dead_after=1)
    side.send("o")
    assert side.run_once().dead == 2
    pending = side.send("q")[0]
    capsys.readouterr()

    assert main(["outbox", store_url, "--fail-if-dead"]) == 1
    out, err = capsys.readouterr()
    assert "1 pending outbox row" in out and "2 dead row(s)" in err
    assert main(["outbox", store_url, "--dead"]) == 0
    out, _ = capsys.readouterr()
    assert "2 dead outbox row(s)" in out and "the broker refuses" in out
    assert main(["outbox", store_url, "--dead", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["id"] for x in lines[:-1]] == [r.id for r in poison]
    assert lines[0]["payload"] == poison[0].payload and lines[0]["strikes"] == 1
    assert lines[-1] == {
        "dead": 2,
        "oldest_age": lines[-1]["oldest_age"],
        "pending": 1,
        "superseded": 0,
    }

    # every id or none: an unknown one, or a row that is not dead, changes nothing
    assert main(["outbox", store_url, "--retry", str(poison[0].id), "999999"]) == 2
    assert "no such row" in capsys.readouterr().err
    assert main(["outbox", store_url, "--drop", str(poison[0].id), str(pending.id)]) == 2
    assert "not dead" in capsys.readouterr().err
    assert side.store.outbox.stats().dead == 2
    assert main(["outbox", store_url, "--retry", str(poison[0].id)]) == 0
    assert "put back 1 dead outbox row(s)" in capsys.readouterr().out
    assert main(["outbox", store_url, "--drop", str(poison[1].id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"dropped": 1, "ids": [poison[1].id]}
    assert main(["outbox", store_url, "--fail-if-dead"]) == 0
    assert main(["outbox", store_url, "--dead"]) == 0
    assert "no dead outbox row" in capsys.readouterr().out
    assert [r.id for r in side.store.outbox.pending()] == [poison[0].id, pending.id]


@pytest.mark.backends(only=lambda name: name == "sqlite-file")
@pytest.mark.apis(only=["sync"])
def test_relay_command_takes_dead_after(
    side: Side, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    side.send("a", 2)
    argv = ["relay", store_url, "--queue", "celery", "--once", "--quiet"]
    app = "tests.contrib.test_relay:APP"
    with pytest.raises(SystemExit):
        main([*argv, "--app", app, "--dead-after", "-3"])
    assert "--dead-after" in capsys.readouterr().err
    assert main([*argv, "--app", app, "--dead-after", "never"]) == 0
    out = capsys.readouterr().out
    assert "published 2 row(s)" in out and "dead 0" in out and "0 dead in all" in out
