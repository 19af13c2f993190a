"""The outbox on PostgreSQL / MariaDB: commit-to-wake latency of PostgreSQL's LISTEN
waker, and claim / stats / add timings over a large sent history.

    python scripts/bench_outbox_servers.py postgresql://root@127.0.0.1:5432/test?schema=bench_outbox
    python scripts/bench_outbox_servers.py mysql://root@127.0.0.1:3306/bench_outbox
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import fencing
from fencing import OutboxMessage

SENT, PENDING, WAKES = 100_000, 10_000, 300


def _pct(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * p))] * 1e6


_COLS = "kind, task, queue, payload, options, okey, created_at, sent_at"


def _fill(store: fencing.Store, url: str) -> None:
    """The history in bulk (SQL), straight into the store's table."""
    if store.outbox.stats().pending:
        return
    rows = [
        ("celery", "t", None, f'{{"n":{i}}}', "{}", f"k{i % 1000}", time.time(), t)
        for i in range(SENT + PENDING)
        for t in [time.time() if i < SENT else None]
    ]
    if url.startswith("postgresql"):
        import psycopg

        schema = url.split("schema=")[1].split("&")[0] if "schema=" in url else "public"
        with psycopg.connect(url.split("?")[0]) as conn, conn.cursor() as cur:
            with cur.copy(f'COPY "{schema}".fencing_outbox ({_COLS}) FROM STDIN') as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(f'ANALYZE "{schema}".fencing_outbox')
    else:
        import pymysql

        conn = pymysql.connect(
            host="127.0.0.1", user="root", database=url.rsplit("/", 1)[1].split("?")[0]
        )
        with conn.cursor() as cur:
            for i in range(0, len(rows), 5000):
                cur.executemany(
                    f"INSERT INTO fencing_outbox ({_COLS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                    rows[i : i + 5000],
                )
            cur.execute("ANALYZE TABLE fencing_outbox")
        conn.commit()
        conn.close()


def _timed(label: str, fn: object, n: int = 200) -> None:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    print(f"{label:40s} p50 {_pct(times, 0.5):8.0f} us  p99 {_pct(times, 0.99):8.0f} us")


def main(url: str) -> None:
    store = fencing.open(url)
    store.migrate()
    _fill(store, url)
    print(f"{url.split('?')[0]}: {store.outbox.stats().pending} pending, sent history {SENT}")

    def claim_and_release() -> None:
        claim = store.outbox.claim("bench", "celery", limit=100, ttl=60)
        store.outbox.release(claim, claim.rows, None)

    _timed("claim 100 + release", claim_and_release)
    _timed("stats", store.outbox.stats)
    msg = OutboxMessage("arq", "t", '{"n":0}', "bench")
    _timed("add (own connection)", lambda: store.backend.outbox_add(msg))  # type: ignore[attr-defined]
    make = getattr(store.backend, "outbox_waiter", None)
    if make is not None:
        waker = make("rq")
        waker.listen()
        lags: list[float] = []
        stamp: list[float] = []
        done = threading.Event()

        def listen() -> None:
            while len(lags) < WAKES:
                if waker.wait(5):
                    lags.append(time.perf_counter() - stamp[-1])
            done.set()

        threading.Thread(target=listen, daemon=True).start()
        rq = OutboxMessage("rq", "t", '{"n":0}', "wake")
        for _ in range(WAKES):
            n = len(lags)
            stamp.append(time.perf_counter())
            store.backend.outbox_add(rq)  # type: ignore[attr-defined]  # autocommit: commits
            while len(lags) == n:
                time.sleep(0.0005)
        done.wait(10)
        print(
            f"{'commit -> LISTEN waker wakes':40s} p50 {_pct(lags, 0.5):8.0f} us"
            f"  p99 {_pct(lags, 0.99):8.0f} us  (mean {statistics.mean(lags) * 1e6:.0f})"
        )
        waker.close()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
