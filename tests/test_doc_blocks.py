"""Every fenced code block in README.md and docs/ (every .md below it) runs, as written.

Blocks are found automatically (a new one is picked up, and a failure names its file
and line). A file's ``python`` blocks build on each other, as a reader would type them:
block N runs after blocks 1..N-1 of the same file, in one namespace, in a fresh
directory. ``sh`` blocks run in bash (``make`` lines as ``make -n``: they would build a
virtualenv; a ``chromium`` line skips without Chromium, and fails when ``CI`` is set).
``text`` blocks are diagrams, not code. A file whose blocks configure Django
(``django.setup()``, docs/django.md) runs blocks 1..N as one script in a process of its
own, so this process never configures Django; the README's Django block configures
Django itself and runs alone so.

What the docs assume, the test provides, and the docs say so in a visible comment:
- the documented addresses are mapped to the local services: ``postgresql://app@db/shop``
  to a fresh PostgreSQL schema (SQLAlchemy's ``postgresql+psycopg://app@db/shop`` to the
  same, that schema on its search path, where the README's transaction example's table
  ``orders`` holds row 42); the brokers' ``redis://localhost:6379/N`` to the
  Redis databases the queue tests use (11-14, never 0), where only this test's own
  queue keys are deleted afterwards;
- order ``"o-1"`` exists in that store; the README's guarded table ``orders`` holds row
  42; the after-commit example's ``conn``, ``store``, ``session``, ``Order``; the effects
  example's ``payments`` client (a recording fake).
Queue blocks enqueue onto their broker (arq's ``send`` is called); the worker side runs
in tests/contrib/test_queues_e2e.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fencing

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
FILES = [README, *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([A-Za-z]*)\n(.*?)^```\s*$", re.M | re.S)
LANGUAGES = {"python", "sh", "text"}
REDIS_DBS = {"1": "11", "2": "13", "3": "12", "4": "14"}  # the doc's N -> a test database
PG_DOC_URL = "postgresql://app@db/shop"
PG_SA_DOC_URL = "postgresql+psycopg://app@db/shop"  # SQLAlchemy's URL of the same database


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
        for m in FENCE.finditer(text)
    ]


BLOCKS = [b for path in FILES for b in _blocks(path)]


def test_blocks_are_found_and_tagged() -> None:
    assert len(BLOCKS) >= 16
    untagged = [b.name for b in BLOCKS if b.lang not in LANGUAGES]
    assert untagged == [], "tag every block python, sh or text"
    # every fence is paired: an odd count would hide blocks from the regex
    for path in FILES:
        assert len(re.findall(r"^```", path.read_text(), flags=re.M)) == 2 * len(_blocks(path))


# -- the local services ------------------------------------------------------------------
class Services:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.pg_url: str | None = None
        self.stores: list[Any] = []

    def pg(self) -> str:
        if self.pg_url is None:
            pg = pytest.importorskip("tests.backends_postgres")
            from ._backends import require_server

            require_server("PostgreSQL", pg.HOST, pg.PORT)
            self.pg_url = pg.make_url(self.tmp_path)
        return self.pg_url

    def pg_sqlalchemy(self) -> str:
        """The store's database for a SQLAlchemy engine, its schema on the search path
        (as on the store's own connections)."""
        import tests.backends_postgres as pg

        schema = pg.schema_of(self.pg())
        return (
            f"postgresql+psycopg://root@{pg.HOST}:{pg.PORT}/test?options=-csearch_path%3D{schema}"
        )

    def redis_url(self, db: str) -> str:
        from ._backends import require_server

        require_server("Redis", "127.0.0.1", 6379)
        return f"redis://127.0.0.1:6379/{REDIS_DBS[db]}"

    def localize(self, code: str) -> str:
        """The documented addresses, mapped to the local services."""
        if PG_DOC_URL in code:
            code = code.replace(PG_DOC_URL, self.pg())
        if PG_SA_DOC_URL in code:
            code = code.replace(PG_SA_DOC_URL, self.pg_sqlalchemy())
        return re.sub(r"redis://localhost:6379/(\d)", lambda m: self.redis_url(m.group(1)), code)

    def store(self) -> fencing.Store:
        store = fencing.open(self.pg())
        self.stores.append(store)
        return store

    def close(self) -> None:
        for store in self.stores:
            store.close()
        if self.pg_url is not None:
            import tests.backends_postgres as pg

            pg.cleanup(self.pg_url)
        _clean_brokers()


def _clean_brokers() -> None:
    """Delete this test's queue keys (the doc's queue names) from the test databases."""
    try:
        import redis
    except ImportError:  # pragma: no cover
        return
    for db in REDIS_DBS.values():
        client = redis.Redis(host="127.0.0.1", port=6379, db=int(db))
        try:
            doomed: list[Any] = []
            for pattern in ("celery", "_kombu.binding.*", "rq:*orders*", "dramatiq:orders*"):
                doomed += list(client.scan_iter(pattern))
            if db == "12":
                doomed += [b"rq:job:" + j for j in client.lrange("rq:queue:orders", 0, -1)]
            if db == "14":
                jobs = client.zrange("arq:queue", 0, -1)
                doomed += [b"arq:job:" + j for j in jobs] + [b"arq:queue"]
            if doomed:
                client.delete(*doomed)
        except redis.ConnectionError:
            pass
        finally:
            client.close()


# -- what the docs assume ------------------------------------------------------------------
class Payments:
    """A recording fake of the effects example's payment provider."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str]] = []

    def charge(self, amount: Any, *, idempotency_key: str) -> Any:
        self.calls.append(("charge", amount, idempotency_key))
        return type("Charge", (), {"id": "ch_" + idempotency_key[-8:]})()

    def refund(self, charge_id: str, *, idempotency_key: str) -> None:
        self.calls.append(("refund", charge_id, idempotency_key))


def _setup(block: Block, code: str, ns: dict[str, Any], services: Services) -> None:
    if 'store.table("orders", key="id"' in code and "store" in ns:
        # the README's guarded table: orders (id, version, status) holding row 42
        with sqlite3.connect("app.db") as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY,"
                " version INTEGER NOT NULL DEFAULT 1, status TEXT)"
            )
            conn.execute("INSERT OR IGNORE INTO orders (id, status) VALUES (42, 'packed')")
    if PG_DOC_URL in code:
        orders = services.store().collection("orders")
        if orders.get("o-1") is None:
            orders.create("o-1", {"status": "packed", "total": 40})
    if block.path.name == "README.md" and "intent_for(order" in code:
        # the README's transaction example: orders (id, version, status) holding row 42
        import tests.backends_postgres as pg

        store = services.store()
        store.migrate()
        with pg.connect(store) as admin:
            admin.execute(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY,"
                " version INTEGER NOT NULL DEFAULT 1, status VARCHAR(40))"
            )
            admin.execute(
                "INSERT INTO orders (id, status) VALUES (42, 'new') ON CONFLICT DO NOTHING"
            )
    if "after_commit(conn)" in code:
        import sqlalchemy
        from sqlalchemy.orm import DeclarativeBase, Session, mapped_column

        import tests.backends_postgres as pg

        store = services.store()
        conn = pg.connect(store)
        conn.autocommit = False
        with pg.connect(store) as admin:
            admin.execute(
                "CREATE TABLE orders (id INTEGER PRIMARY KEY,"
                " version INTEGER NOT NULL DEFAULT 1, status TEXT)"
            )
            admin.execute("INSERT INTO orders (id, status) VALUES (42, 'new')")

        class Base(DeclarativeBase):
            pass

        class Order(Base):
            __tablename__ = "orders"
            id = mapped_column(sqlalchemy.Integer, primary_key=True)
            version = mapped_column(sqlalchemy.Integer, nullable=False)
            status = mapped_column(sqlalchemy.Text)
            __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

        engine = sqlalchemy.create_engine(services.pg_sqlalchemy())
        session = Session(engine)
        ns.update(conn=conn, store=store, session=session, Order=Order)
        ns["ship"] = ns["__celery_ship"]
        services.stores.append(_Closing(conn, session, engine))
    if "payments." in code:
        ns["payments"] = Payments()


class _Closing:
    def __init__(self, conn: Any, session: Any, engine: Any) -> None:
        self.conn, self.session, self.engine = conn, session, engine

    def close(self) -> None:
        self.session.close()
        self.engine.dispose()
        self.conn.close()


@pytest.fixture
def services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    monkeypatch.chdir(tmp_path)
    found = Services(tmp_path)
    yield found
    found.close()


def _run_python(block: Block, services: Services) -> dict[str, Any]:
    # a real module (RQ finds a job by importing its module): the blocks are module code
    module = types.ModuleType("docs_" + uuid.uuid4().hex[:8])
    sys.modules[module.__name__] = module
    try:
        return _exec_blocks(block, services, module.__dict__)
    finally:
        del sys.modules[module.__name__]


def _exec_blocks(block: Block, services: Services, ns: dict[str, Any]) -> dict[str, Any]:
    previous = [b for b in BLOCKS if b.path == block.path and b.lang == "python"]
    previous = [b for b in previous if b is block or not _sets_django_up(b)]  # (its own)
    for each in previous[: previous.index(block) + 1]:
        _setup(each, each.code, ns, services)
        exec(compile(services.localize(each.code), each.name, "exec"), ns)
        if "fencing.contrib.celery import" in each.code and "ship" in ns:
            ns["__celery_ship"] = ns["ship"]  # "the Celery task of the first example"
    if "async def send(" in block.code:  # arq: the block defines the sender; send now
        _send_arq(block, ns, services)
    return ns


def _send_arq(block: Block, ns: dict[str, Any], services: Services) -> None:
    import inspect

    from arq import create_pool
    from arq.connections import RedisSettings

    send = ns["send"]

    async def go() -> None:
        if inspect.signature(send).parameters:
            pool = await create_pool(RedisSettings.from_dsn(services.redis_url("4")))
            try:
                await send(pool)
            finally:
                await pool.aclose()
        else:
            await send()

    asyncio.run(go())
    from redis import Redis

    client = Redis(host="127.0.0.1", port=6379, db=int(REDIS_DBS["4"]))
    try:
        assert client.zcard("arq:queue") >= 1, "arq send() enqueued nothing"
    finally:
        client.close()


def _run_sh(block: Block, services: Services) -> None:
    code = services.localize(block.code)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for line in code.splitlines():
        command = line.split("#", 1)[0].strip()
        if not command:
            continue
        if command.startswith("make "):
            # `make demo` / `make test` build a virtualenv: check what they would run
            argv = ["make", "-n", "-C", str(REPO), *command.split()[1:]]
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            assert done.returncode == 0, done.stderr
            assert "fencing" in done.stdout or "pytest" in done.stdout
            continue
        if command.split()[0] == "chromium" and shutil.which("chromium") is None:
            from ._backends import CI

            message = "Chromium is not installed (apt-get install chromium)"
            if CI:
                pytest.fail(f"{command}: {message}, and CI is set")
            pytest.skip(message)
        if '"$KEY"' in command:
            env["KEY"] = _an_effect_key(services)
        done = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, env=env, check=False
        )
        assert done.returncode in ((0, 1) if "--fail-if-any" in command else (0,)), (
            command,
            done.stdout,
            done.stderr,
        )


def _an_effect_key(services: Services) -> str:
    """An effect for `fencing reconcile --mark` to mark: one whose intent went stale."""
    orders = services.store().collection("orders")
    rec = orders.get("o-1") or orders.create("o-1", {"status": "packed"})
    intent = rec.intent("charge")
    fx = orders.effect(intent, "charge")
    orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"})
    assert orders.commit(intent, {"status": "charged"}).kind == "stale"
    return fx.idempotency_key


def _sets_django_up(block: Block) -> bool:
    """Whether ``block``'s file configures Django (``django.setup()`` in a block). The
    README's Django block is whole on its own (it configures Django itself): it alone
    runs so, the README's other blocks as usual."""
    if "django.setup()" in block.code:
        return True
    if block.path == README:
        return False
    return any(b.path == block.path and "django.setup()" in b.code for b in BLOCKS)


def _run_django(block: Block, tmp_path: Path) -> None:
    """Blocks 1..N of a file that configures Django run as one script in a process of
    their own (Django's settings are configured once per process), in a fresh
    directory, warnings as errors."""
    pytest.importorskip("django", reason="pip install 'fencing[django]'")
    previous = [b for b in BLOCKS if b.path == block.path and b.lang == "python"]
    if block.path == README:  # whole on its own
        previous = [block]
    code = "\n".join(f"# {b.name}\n{b.code}" for b in previous[: previous.index(block) + 1])
    script = tmp_path / "doc_blocks.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang != "text"], ids=lambda b: b.name)
def test_doc_block_runs(block: Block, services: Services, tmp_path: Path) -> None:
    if block.lang == "sh":
        _run_sh(block, services)
    elif _sets_django_up(block):
        _run_django(block, tmp_path)
    else:
        _run_python(block, services)
