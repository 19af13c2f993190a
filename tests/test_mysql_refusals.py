"""A stale commit to a collection on MySQL/MariaDB writes nothing (issue 21): the record
is locked first and the intent claimed only when the record is at the intent's version,
so a stale intent's transaction has nothing to flush at COMMIT (an InnoDB log flush was
most of a stale refusal's time: 5.5x the hand-written refusal). A redelivered intent
is still told apart (``Duplicate``), from a claim read with a shared lock.

Whether a refusal wrote is seen from inside the caller's transaction
(``store.using(conn)``): ``information_schema.INNODB_TRX.trx_rows_modified``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, Duplicate, Stale

from .backends_mysql import cleanup, lend, make_url

pytest.importorskip("pymysql")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    url = make_url(tmp_path)
    yield url
    cleanup(url)


def _modified(conn: Any) -> int:
    """Rows the connection's open transaction has written so far (0: none, or none open).
    InnoDB serves ``INNODB_TRX`` from a copy it renews when older than 0.1 s: wait that
    long first, or the answer may predate the last statement."""
    time.sleep(0.15)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT trx_rows_modified FROM information_schema.INNODB_TRX"
            " WHERE trx_mysql_thread_id = CONNECTION_ID()"
        )
        found = cur.fetchone()
    return 0 if found is None else int(found[0])


def test_a_stale_or_redelivered_commit_writes_nothing(url: str) -> None:
    with fencing.open(url) as store:
        jobs = store.collection("jobs")
        jobs.create("j-1", {"n": 0})
        stale = jobs.intent("j-1", "late")
        done = jobs.intent("j-1", "first")
        assert isinstance(jobs.commit(done, {"n": 1}), Committed)
        conn = lend(url)
        try:
            with conn.cursor() as cur:  # the caller's transaction, with a write of its own
                cur.execute("CREATE TABLE audit (n INT) ENGINE=InnoDB")
                conn.begin()
                cur.execute("INSERT INTO audit VALUES (1)")
            mine = _modified(conn)
            assert mine == 1
            view = store.using(conn).collection("jobs")
            for intent, expected in ((stale, Stale), (done, Duplicate)):
                outcome = view.commit(intent, {"n": 2})
                assert isinstance(outcome, expected), outcome
                assert outcome.current is not None and outcome.current.version == 2
                assert _modified(conn) == mine, f"a {expected.__name__} refusal wrote"
            fresh = view.commit(view.intent("j-1", "next"), {"n": 3})
            assert isinstance(fresh, Committed)
            assert _modified(conn) > mine  # (the record and the claim: the probe sees writes)
            conn.rollback()
        finally:
            conn.close()
        assert jobs.get("j-1").state == {"n": 1}
        assert isinstance(jobs.commit(done, {"n": 2}), Duplicate)  # the store's own too
        assert isinstance(jobs.commit(stale, {"n": 2}), Stale)
