"""An interruption inside a bound PostgreSQL commit never wedges the caller's psycopg
connection (issue 18, item 6): after a signal handler's exception (Celery's soft time
limit, RQ's job timeout) or a task cancellation lands anywhere in ``store.using(conn)``'s
step, the caller's connection is at rest (``rollback()`` and ``execute`` work) or closed,
never "another command is already in progress" / "connection not in pipeline mode".

psycopg's pipeline keeps its own record of the pipeline (``conn._pipeline`` and its
level) apart from libpq's; an exception landing between two steps of that bookkeeping
(at the start of ``Pipeline._exit``, say) leaves the record behind, its level not
counted down, while fencing's cleanup takes libpq out of pipeline mode: every later
command of the caller's then failed. Measured before the fix (this storm and a script
like it): 11 wedged connections in about 15,000 interruptions, one in 1,300, so the
sync storm's 1,750-odd interruptions catch one about three runs in four; after it, none
in 7,500 (none closed either). The injected test hits that very point every time. The
asyncio storm never wedged a connection, before the fix or after (a cancellation lands
only at an await, never between two steps of psycopg's bookkeeping): it guards the
async path's cleanup.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import fencing
from fencing import Committed, Duplicate

from .backends_postgres import Setup
from .test_interrupts import Interrupt, Scale, _finalizers, _interrupted, _timer
from .test_using_postgres import alend, lend

psycopg = pytest.importorskip("psycopg")
from psycopg import _pipeline_base  # noqa: E402

CALLS = 3500  # about 2,000 interruptions: 20-40 s here
ASYNC_CALLS = 2500


@pytest.fixture
def store(pg: Setup) -> Iterator[Any]:
    s = fencing.open(pg.url)
    s.migrate()
    for k in range(20):
        s.collection("c").create(f"k{k}", {"n": 0})
    yield s
    s.close()


def at_rest(conn: Any, mine: int) -> None:
    """The caller's connection works (or was closed, which the caller can see); its own
    write of this transaction is still there when it was not closed."""
    if conn.closed:
        return
    assert conn.execute("SELECT count(*) FROM notes").fetchone() == (mine,)
    conn.rollback()
    assert conn.execute("SELECT 1").fetchone() == (1,)


def notes(conn: Any) -> None:
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS notes (n int)")
    conn.commit()


@contextmanager
def raising_at(code: Any, line: str | None) -> Iterator[list[bool]]:
    """Raise ``Interrupt`` once, at the start of ``code`` (``line`` None) or before its
    line that reads ``line``, as a signal handler's exception would land there."""
    fired = [False]
    lines = {
        code.co_firstlineno + i
        for i, text in enumerate(_source(code))
        if line is not None and text.strip() == line
    }
    assert line is None or lines, f"no line {line!r} in {code.co_name}"

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno in lines and not fired[0]:
            fired[0] = True
            raise Interrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event != "call" or frame.f_code is not code or fired[0]:
            return None
        if line is None:
            fired[0] = True
            raise Interrupt
        return local

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield fired
    finally:
        sys.settrace(previous)


def _source(code: Any) -> list[str]:
    import inspect

    return inspect.getsourcelines(code)[0]


POINTS = {
    # level not counted down: psycopg keeps a pipeline libpq no longer has
    "Pipeline._exit, entered": (_pipeline_base.BasePipeline._exit.__code__, None),
    "Pipeline._exit, before exiting libpq's pipeline": (
        _pipeline_base.BasePipeline._exit.__code__,
        "if self.level == 0 and self.pgconn.status != BAD:",
    ),
    "Pipeline._enter_gen, libpq in pipeline mode, level not counted": (
        _pipeline_base.BasePipeline._enter_gen.__code__,
        "self.level += 1",
    ),
    "Connection.pipeline, the record not dropped": (
        psycopg.Connection.pipeline.__wrapped__.__code__,  # type: ignore[attr-defined]
        "self._pipeline = None",
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", list(POINTS))
def test_an_interrupt_in_psycopgs_pipeline_bookkeeping(store: Any, pg: Setup, point: str) -> None:
    code, line = POINTS[point]
    conn = lend(store, pg)
    try:
        notes(conn)
        view = store.using(conn).collection("c")
        conn.execute("INSERT INTO notes VALUES (1)")
        intent = view.intent("k1", "x")
        with _finalizers(), raising_at(code, line) as fired, pytest.raises(Exception) as caught:
            view.commit(intent, {"n": 1})
        assert _interrupted(caught.value), caught.value
        assert fired[0], "the interruption never happened"
        at_rest(conn, 1)
        if conn.closed:  # allowed, but not for these: each can be brought back to rest
            pytest.fail("the connection was closed")
        again = view.commit(intent, {"n": 1})  # rolled back above: it never happened
        assert isinstance(again, Committed)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.timeout(180)
def test_a_signal_storm_never_wedges_the_callers_connection(store: Any, pg: Setup) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread")
    rng = random.Random(20261204)
    conn = lend(store, pg)
    notes(conn)
    view = store.using(conn).collection("c")
    started = time.perf_counter()
    for i in range(50):
        view.commit(view.intent(f"k{i % 20}", "x"), {"n": i})
    conn.commit()
    scale = Scale((time.perf_counter() - started) / 50)
    landed = closed = 0
    try:
        with _finalizers(), _timer() as arm:
            for i in range(CALLS):
                conn.execute("INSERT INTO notes VALUES (1)")
                key = f"k{rng.randrange(20)}"
                intent = view.intent(key, "x")
                try:
                    try:
                        arm(scale.delay(rng))
                        out = view.commit(intent, {"n": i})
                    finally:
                        arm(0)
                    scale.missed()
                    assert isinstance(out, Committed | fencing.Stale), out
                except Exception as exc:
                    if not _interrupted(exc):
                        raise
                    landed += 1
                    scale.landed()
                at_rest(conn, 1)  # (rolls the caller's transaction back)
                if conn.closed:
                    closed += 1
                    conn = lend(store, pg)
                    notes(conn)
                    view = store.using(conn).collection("c")
    finally:
        conn.close()
    print(f"postgresql using: {landed} of {CALLS} commits interrupted, {closed} closed")
    assert landed >= 1000, "the storm hardly landed: it proves nothing"
    assert closed <= landed // 100, "closed where it could be brought back to rest"


@pytest.mark.timeout(180)
def test_a_cancellation_storm_never_wedges_the_callers_async_connection(
    store: Any, pg: Setup
) -> None:
    async def main() -> tuple[int, int]:
        rng = random.Random(20261205)
        astore = await fencing.open_async(pg.url)
        conn = await alend(store, pg)

        async def fresh() -> Any:
            c = await alend(store, pg)
            await c.execute("CREATE TEMP TABLE IF NOT EXISTS notes (n int)")
            await c.commit()
            return c

        await conn.close()
        conn = await fresh()
        view = astore.using(conn).collection("c")
        started = time.perf_counter()
        for i in range(30):
            await view.commit(await view.intent(f"k{i % 20}", "x"), {"n": i})
        await conn.commit()
        scale = Scale((time.perf_counter() - started) / 30)
        landed = closed = 0
        try:
            for i in range(ASYNC_CALLS):
                await conn.execute("INSERT INTO notes VALUES (1)")
                intent = await view.intent(f"k{rng.randrange(20)}", "x")
                try:
                    out = await asyncio.wait_for(view.commit(intent, {"n": i}), scale.delay(rng))
                    scale.missed()
                    assert isinstance(out, Committed | Duplicate | fencing.Stale), out
                except TimeoutError:
                    landed += 1
                    scale.landed()
                if conn.closed:
                    closed += 1
                    conn = await fresh()
                    view = astore.using(conn).collection("c")
                    continue
                cur = await conn.execute("SELECT count(*) FROM notes")
                assert await cur.fetchone() == (1,)
                await conn.rollback()
                cur = await conn.execute("SELECT 1")
                assert await cur.fetchone() == (1,)
        finally:
            await conn.close()
            await astore.close()
        return landed, closed

    landed, closed = asyncio.run(main())
    print(f"postgresql using (async): {landed} of {ASYNC_CALLS} commits cancelled, {closed} closed")
    assert landed >= 500, "the storm hardly landed: it proves nothing"
    assert closed <= landed // 100
