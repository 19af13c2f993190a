"""Killing one test store's server connections at random moments (and only its own).

PostgreSQL: ``pg_terminate_backend`` of the backends whose ``application_name`` is the
store's (a fresh name set in the URL); MariaDB: ``KILL`` of the connections to the test's
own database; Redis: ``CLIENT KILL ID`` of the clients named by the store's
``client_name``. Other stores have no connection to kill (``Killer`` is then idle).
"""

from __future__ import annotations

import random
import threading
from typing import Any
from urllib.parse import urlsplit

from . import _lin_churn

SERVER = {"postgresql", "mysql", "redis", "redis-cluster"}


def url_with_name(backend: str, url: str, name: str) -> str:
    """The store URL with a connection name the killer can find."""
    if backend == "postgresql":
        return url + f"&application_name={name}"
    if backend.startswith("redis"):
        return url + f"&client_name={name}"
    return url


class Killer:
    """A side thread that kills one of the store's connections every 5-50 ms."""

    def __init__(self, backend: str, url: str, name: str, seed: int = 0) -> None:
        self.backend = backend
        self.url = url
        self.name = name
        self.kills = 0
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._thread = threading.Thread(target=self._run, name="lin-killer", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Killer:
        if self.backend in SERVER:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        _lin_churn.count(self.backend, kills=self.kills)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            make = {
                "postgresql": self._pg,
                "mysql": self._mysql,
                "redis": self._redis,
                "redis-cluster": self._redis,
            }
            kill, conn = make[self.backend]()
            try:
                while not self._stop.wait(self._rng.uniform(0.005, 0.05)):
                    self.kills += kill()
            finally:
                conn.close()
        except BaseException as exc:  # reported by __exit__
            self.error = exc

    def _pg(self) -> Any:
        from .backends_postgres import admin

        conn = admin()
        sql = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"

        def kill() -> int:
            pids = [r[0] for r in conn.execute(sql, (self.name,)).fetchall()]
            if not pids:
                return 0
            conn.execute("SELECT pg_terminate_backend(%s)", (self._rng.choice(pids),))
            return 1

        return kill, conn

    def _mysql(self) -> Any:
        import pymysql

        from .backends_mysql import _admin

        conn = _admin()
        database = urlsplit(self.url).path.lstrip("/")
        sql = (
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()"
        )

        def kill() -> int:
            with conn.cursor() as cur:
                cur.execute(sql, (database,))
                ids = [r[0] for r in cur.fetchall()]
                if not ids:
                    return 0
                try:
                    cur.execute(f"KILL {int(self._rng.choice(ids))}")
                except pymysql.err.OperationalError:  # gone already (1094: unknown thread)
                    return 0
            return 1

        return kill, conn

    def _redis(self) -> Any:
        import redis

        from .backends_redis import CLUSTER_PORT, HOST, PORT

        ports = [PORT] if self.backend == "redis" else [CLUSTER_PORT + i for i in range(3)]
        clients = [redis.Redis(host=HOST, port=port) for port in ports]

        def kill() -> int:
            client = self._rng.choice(clients)  # a Cluster: one of its primaries
            ids = [c["id"] for c in client.client_list() if c.get("name") == self.name]
            if not ids:
                return 0
            return int(client.client_kill_filter(_id=self._rng.choice(ids)))

        class Closer:
            def close(self) -> None:
                for client in clients:
                    client.close()

        return kill, Closer()
