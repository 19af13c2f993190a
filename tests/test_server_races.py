"""Races on the server stores, made deterministic by a setup connection holding a lock.

A create that overlaps a delete of the same key continues the deleted record's versions.

Found by an outside linearizability check on PostgreSQL and MariaDB: the re-created record
took its version from the tombstone as it was *before* the overlapping delete (PostgreSQL:
the INSERT's snapshot; MariaDB: a non-locking read), so an intent decided against the
deleted record committed against the new one. Here the overlap is made deterministic: a
setup connection holds the key's tombstone row locked while ``delete`` and then ``create``
start, and lets go a moment later. Whatever order the two then take, no version of the key
may repeat, and the old intent must stay refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import fencing

from ._backends import named_case_url
from .backends_postgres import opened

SERVERS = ["postgresql", "mysql"]


@pytest.fixture(params=SERVERS)
def server_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    yield from named_case_url(request, tmp_path)


@contextmanager
def tombstone_locked(server: str, store: Any, key: str) -> Iterator[None]:
    """Hold the row lock of ``key``'s tombstone in collection ``orders``."""
    if server == "postgresql":
        from .backends_postgres import connect

        conn = connect(store)
        conn.autocommit = False
        try:
            found = conn.execute(
                "SELECT version FROM fencing_tombstones WHERE collection = 'orders'"
                " AND key = %s FOR UPDATE",
                (key,),
            ).fetchall()
            assert found, "the setup made a tombstone"
            yield
        finally:
            conn.rollback()
            conn.close()
        return
    from .backends_mysql import connect as mysql_connect

    conn = mysql_connect(store)
    try:
        with conn.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute(
                "SELECT version FROM fencing_tombstones WHERE collection = 'orders'"
                " AND `key` = %s FOR UPDATE",
                (key.encode(),),
            )
            assert cur.fetchall(), "the setup made a tombstone"
        yield
    finally:
        with conn.cursor() as cur:
            cur.execute("ROLLBACK")
        conn.close()


def test_create_overlapping_delete_never_reuses_a_version(
    server_url: tuple[str, str], api: str
) -> None:  # api: sync and async (conftest)
    server, url = server_url
    with opened(url, api) as store:
        orders = store.collection("orders")
        orders.create("k", {"n": 0})
        assert orders.delete("k")  # the key has a tombstone at version 1
        rec = orders.create("k", {"n": 0})
        assert rec.version == 2
        decided_on_v2 = rec.intent("ship")
        for n in range(1, 4):
            out = orders.commit(orders.intent("k", "bump"), {"n": n})
            assert isinstance(out, fencing.Committed)
        assert orders.get("k").version == 5

        answers: dict[str, Any] = {}

        def run(name: str, call: Any) -> None:
            try:
                answers[name] = call()
            except fencing.FencingError as exc:
                answers[name] = exc

        with tombstone_locked(server, store, "k"):
            deleter = threading.Thread(target=run, args=("delete", lambda: orders.delete("k")))
            deleter.start()
            time.sleep(0.3)  # the delete is waiting for the key
            creator = threading.Thread(
                target=run, args=("create", lambda: orders.create("k", {"n": 99}))
            )
            creator.start()
            time.sleep(0.7)  # and the create too
        deleter.join(30)
        creator.join(30)
        assert not deleter.is_alive() and not creator.is_alive()

        assert answers["delete"] is True
        created = answers["create"]
        if isinstance(created, fencing.AlreadyExists):
            # the create went first (found v5), then the delete removed it
            assert orders.get("k") is None
        else:
            assert isinstance(created, fencing.Record), created
            # the delete of v5 went first: the new record continues after it
            assert created.version == 6, f"re-created at v{created.version}: a reused version"
            assert orders.get("k").version == 6
        # an intent decided against the deleted record never commits against a new one
        out = orders.commit(decided_on_v2, {"n": -1})
        assert not out.committed, out


# -- a batch answers from one moment ----------------------------------------------------------
def _consistent(items: list[tuple[str, int]], outcomes: list[Any]) -> list[str]:
    """Whether the outcomes of a batch of (key, expected version) items, in order, are what
    applying the items one after the other to ONE state of the store gives; the faults."""
    faults: list[str] = []
    version: dict[str, int] = {}
    for n, ((key, expected), out) in enumerate(zip(items, outcomes, strict=True)):
        if isinstance(out, fencing.Committed):
            before = version.setdefault(key, expected)
            if before != expected or out.record.version != expected + 1:
                faults.append(f"item {n}: committed {key} exp {expected} at v{before}")
            version[key] = out.record.version
        elif isinstance(out, fencing.Stale):
            now = version.setdefault(key, out.current.version)
            if now != out.current.version or now == expected:
                faults.append(f"item {n}: stale {key} at v{out.current.version}, was v{now}")
        else:
            faults.append(f"item {n}: unexpected {out!r}")
    return faults


def test_a_batch_answers_from_one_moment(server_url: tuple[str, str], api: str) -> None:
    """A concurrent writer moves k2 while a batch that repeats k0 and k2 runs: every outcome
    must describe one state of the store (the one at the batch's commit), in item order."""
    server, url = server_url
    with opened(url, api) as store:
        orders = store.collection("orders")
        for key in ("k0", "k2"):
            orders.create(key, {"n": 0})
        items = [("k0", 1), ("k2", 1), ("k0", 1), ("k2", 2), ("k2", 3)]
        batch = [
            (
                fencing.Intent(
                    id=f"i{n}", collection="orders", key=k, expected_version=v, transition="t"
                ),
                {"n": n},
            )
            for n, (k, v) in enumerate(items)
        ]
        answers: list[Any] = []
        if server == "postgresql":
            from .backends_postgres import connect

            writer = connect(store)
            writer.autocommit = False
            writer.execute(
                "UPDATE fencing_records SET version = version + 1 WHERE key = 'k2'"
            )  # a concurrent commit of k2, in progress
        else:
            from .backends_mysql import connect as mysql_connect

            writer = mysql_connect(store)
            with writer.cursor() as cur:
                cur.execute("START TRANSACTION")
                cur.execute("UPDATE fencing_records SET version = version + 1 WHERE `key` = 'k2'")
        thread = threading.Thread(target=lambda: answers.extend(orders.commit_many(batch)))
        thread.start()
        time.sleep(0.5)  # the batch is under way, waiting for k2
        writer.commit()
        writer.close()
        thread.join(30)
        assert not thread.is_alive()
        faults = _consistent(items, answers)
        shown = [(o.kind, getattr(o, "current", None)) for o in answers]
        assert not faults, (faults, shown)
        assert orders.get("k2").version == 4  # 1, the writer's 2, then this batch's 3 and 4


# -- a write under a token never lands after the next token was granted ----------------------
def test_a_fenced_commit_held_up_past_its_lease_never_lands_after_a_takeover(
    server_url: tuple[str, str], api: str
) -> None:
    """The commit waits for a row lock until its lease has run out and a new owner asks for
    it: either the commit is refused, or the takeover waits until the commit is done."""
    server, url = server_url
    with opened(url, api) as store:
        orders = store.collection("orders")
        orders.create("k", {"n": 0})
        lease = store.acquire("orders/k", owner="old", ttl=0.5)
        intent = orders.intent("k", "ship")
        if server == "postgresql":
            from .backends_postgres import connect

            holder = connect(store)
            holder.autocommit = False
            holder.execute("SELECT 1 FROM fencing_records WHERE key = 'k' FOR UPDATE")
        else:
            from .backends_mysql import connect as mysql_connect

            holder = mysql_connect(store)
            with holder.cursor() as cur:
                cur.execute("START TRANSACTION")
                cur.execute("SELECT 1 FROM fencing_records WHERE `key` = 'k' FOR UPDATE")
        done: dict[str, Any] = {}

        def commit() -> None:
            done["commit"] = orders.commit(intent, {"n": 1}, lease=lease)
            done["commit_at"] = time.monotonic()

        def take_over() -> None:
            done["lease"] = store.acquire("orders/k", owner="new", ttl=30)
            done["lease_at"] = time.monotonic()

        committer = threading.Thread(target=commit)
        committer.start()
        time.sleep(0.8)  # the commit waits for the record; its lease runs out meanwhile
        taker = threading.Thread(target=take_over)
        taker.start()
        time.sleep(0.7)
        released_at = time.monotonic()
        holder.commit()
        holder.close()
        committer.join(30)
        taker.join(30)
        assert not committer.is_alive() and not taker.is_alive()
        assert done["lease"].token == lease.token + 1
        if done["commit"].committed:
            # it could only commit once the row was free: the takeover must have waited
            assert done["commit_at"] > released_at
            assert done["lease_at"] > released_at, (
                "the new token was granted while a commit under the old one was on its way"
            )
            assert orders.get("k").fence == lease.token
        else:
            assert isinstance(done["commit"], fencing.Fenced), done["commit"]
