"""``fencing bench``: it runs and its rows are well formed. Never its speed: the machine
is shared and noisy, so no test here asserts a timing or a ratio."""

from __future__ import annotations

import importlib.util
import json
import math
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from fencing._bench._harness import Block, Contest, Plan, Side, Skip, measure, order, rows_for
from fencing._cli import main

from ._backends import CI, require_server, server_up

GUARD = "table.commit, guard trigger"  # beside the same commit without the trigger
USING = "table.commit in the caller's transaction"  # beside own connections, hand-written
METRICS = "collection.commit, Prometheus metrics on"  # beside the same commit, metrics off
STALE = "refused: stale intent"
REDELIVERED = "refused: redelivered intent"
#: operations beside the same-answer baseline and the older one that returns less
BOTH = {
    "collection.commit",
    "table.commit",
    "apply",
    "commit_many (100/call)",
    "commit under lease",
}
#: a fenced task shipping, booking a row and sending the next step in the worker's
#: transaction, beside today's fenced task then the row's and the send's own transactions
WORKTX = "fenced task: commit + own row + outbox send"
#: issue 21's targets: these beside their first baseline (the same answer, or for leases
#: the hand-written statement)
TARGETED = BOTH | {"lease acquire", "lease renew", "lease release"}
SQLITE_OPERATIONS = {
    "collection.commit",
    STALE,
    REDELIVERED,
    "table.commit",
    GUARD,
    USING,
    WORKTX,
    "apply",
    "commit_many (100/call)",
    "commit under lease",
    "lease acquire",
    "lease renew",
    "lease release",
    METRICS,
}
NUMBERS = [
    f"{side}_{what}"
    for side in ("fencing", "baseline")
    for what in ("ops_per_s", "us_per_call", "p50_us", "p99_us", "peak_kib")
] + ["ratio", "ratio_low", "ratio_high"]

SERVERS = {
    "postgresql": ("postgresql://root@127.0.0.1:5432/test", "PostgreSQL", 5432, "postgres"),
    "mysql": ("mysql://root@127.0.0.1:3306/test", "MySQL", 3306, "mysql"),
    "redis": ("redis://127.0.0.1:6379/0", "Redis", 6379, "redis"),
}


def bench_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["bench", "--quick", "--json", *args]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and rows
    return rows


def check_pair(row: dict[str, Any]) -> None:
    for name in NUMBERS:
        value = row[name]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, row)
    assert row["ratio_low"] <= row["ratio_high"]
    assert row["fencing_p50_us"] <= row["fencing_p99_us"]
    assert row["baseline_p50_us"] <= row["baseline_p99_us"]
    for name in ("rounds", "calls_per_round", "commits_per_call"):
        assert isinstance(row[name], int) and row[name] > 0
    assert row["fencing_method"] and row["baseline_method"] and row["baseline"]


def test_sqlite_quick_json(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench_json(capsys)
    pairs = [r for r in rows if r["kind"] == "pair"]
    settings = {r["setting"] for r in pairs}
    assert settings == {"WAL file, synchronous=FULL", "WAL file, synchronous=NORMAL"}
    for setting in settings:
        ops = [r["operation"] for r in pairs if r["setting"] == setting]
        # two baselines: USING's, and each of BOTH's (the same answer, and the older one)
        assert set(ops) == SQLITE_OPERATIONS, setting
        assert len(ops) == len(SQLITE_OPERATIONS) + 1 + len(BOTH), setting
    for row in pairs:
        baselines = {"hand-written"}
        if row["operation"] in BOTH:
            baselines = {"same answer", "hand-written, no row back"}
        elif row["operation"] in (STALE, REDELIVERED):
            baselines = {"same answer"}
        elif row["operation"] == GUARD:
            baselines = {"no trigger"}
        elif row["operation"] == METRICS:
            baselines = {"metrics off"}
        elif row["operation"] == WORKTX:
            baselines = {"fenced_task, separate"}
        elif row["operation"] == USING:
            baselines = {"fencing, own connections", "hand-written"}
        assert row["store"] == "sqlite" and row["baseline"] in baselines
        check_pair(row)
        many = row["operation"].startswith("commit_many")
        assert row["commits_per_call"] == (100 if many else 1)
        # issue 21's targets, beside the same answer (leases: the hand-written statement)
        if row["operation"] in TARGETED and row["baseline"] in ("same answer", "hand-written"):
            target = (1.15 if many else 1.25) if "NORMAL" in row["setting"] else 1.10
            assert row["target_ratio"] == (1.15 if many else target), row
            assert row["target_met"] is (row["ratio"] <= row["target_ratio"])
        else:
            assert row["target_ratio"] is None and row["target_met"] is None
    using = [r["baseline"] for r in pairs if r["operation"] == USING]
    assert sorted(using) == ["fencing, own connections"] * 2 + ["hand-written"] * 2
    speedups = [r for r in rows if r["kind"] == "speedup"]
    assert {r["setting"] for r in speedups} == settings
    assert all(r["ratio"] > 0 for r in speedups)
    assert not [r for r in rows if r["kind"] == "skipped"]


def test_markdown_and_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--markdown", "--only", "table", "--no-memory"]) == 0
    out = capsys.readouterr().out
    assert "| operation | fencing ops/s | hand-written ops/s |" in out
    assert out.count("| table.commit |") == 4  # two settings, two baselines
    assert "collection.commit" not in out
    assert "target: table.commit within 1.10x of same answer" in out


def test_rich_table(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich")
    assert main(["bench", "--quick", "--only", "lease", "--store", "sqlite://:memory:"]) == 0
    out = capsys.readouterr().out
    assert "sqlite: :memory:" in out
    assert "lease acquire" in out and "lease release" in out


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_server_quick_json(capsys: pytest.CaptureFixture[str], server: str) -> None:
    url, name, port, module = SERVERS[server]
    if importlib.util.find_spec(f"fencing.backends.{module}") is None:
        pytest.skip(f"the {server} backend does not exist in this tree")
    require_server(name, "127.0.0.1", port)
    rows = bench_json(capsys, "--store", url)
    assert not [r for r in rows if r["kind"] == "skipped"], rows
    pairs = [r for r in rows if r["kind"] == "pair"]
    assert {r["store"] for r in pairs} == {server}
    sql_only = {"table.commit", GUARD, USING, WORKTX}
    expected = SQLITE_OPERATIONS - (sql_only if server == "redis" else set())
    assert expected <= {r["operation"] for r in pairs}
    for row in pairs:
        check_pair(row)
    # the approaches readers compare: FOR UPDATE transactions, a redis-py Lock
    other = "redis-py Lock" if server == "redis" else "FOR UPDATE txn"
    baselines = {r["baseline"] for r in pairs}
    assert f"{other}, no row back" in baselines and "same answer" in baselines
    if server == "postgresql":  # RETURNING beside a second SELECT
        assert "same answer, 2nd SELECT" in baselines
    for op in BOTH | {STALE, REDELIVERED}:
        if server == "redis" and op == "table.commit":
            continue
        assert "same answer" in {r["baseline"] for r in pairs if r["operation"] == op}, op
    speedup = [r for r in rows if r["kind"] == "speedup"]
    assert len(speedup) == 1
    assert speedup[0]["target_ratio"] is None


def test_unreachable_server_is_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench_json(capsys, "--store", "postgresql://root@127.0.0.1:1/test")
    assert [r["kind"] for r in rows] == ["skipped"]
    assert "unavailable" in rows[0]["reason"]


@pytest.mark.parametrize(
    "args",
    [
        ["--rounds", "0"],
        ["--ops", "0"],
        ["--seconds", "0"],
        ["--store", "ftp://x"],
        ["--store", "memory://"],
    ],
)
def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    assert main(["bench", "--quick", *args]) == 2
    assert "fencing:" in capsys.readouterr().err


def test_rich_is_not_imported_by_the_module() -> None:
    code = "import sys, fencing._bench; assert 'rich' not in sys.modules, 'rich imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the harness, on fake sides: alternation and the numbers -------------------------------
def test_sides_alternate() -> None:
    assert [order(2, r) for r in range(4)] == [[0, 1], [1, 0], [1, 0], [0, 1]]
    assert sorted(order(3, 4)) == [0, 1, 2]

    calls: list[str] = []

    def side(label: str) -> Side:
        def prepare(n: int) -> Block:
            calls.append(label)
            return Block([lambda i: None, lambda i: None])

        return Side(label, label, prepare)

    contest = Contest(("first", "second"), (side("f"), side("b")))
    result = measure(contest, Plan(rounds=4, ops=3, warmup=1))
    # warm-up f, b; rounds f b, b f, b f, f b; memory f b (order of round 4)
    assert calls == ["f", "b", "f", "b", "b", "f", "b", "f", "f", "b", "f", "b"]
    rows = rows_for(result, "fake", "test")
    assert [r["operation"] for r in rows] == ["first", "second"]
    for row in rows:
        assert row["rounds"] == 4 and row["calls_per_round"] == 3
        assert row["fencing_ops_per_s"] > 0 and row["baseline_ops_per_s"] > 0


# -- the same answer: each baseline returns what fencing returns -----------------------------
CASES = [
    "commit",
    "redelivered",
    "stale",
    "apply",
    "fenced commit",
    "commit_many item 0",
    "commit_many item 1",
    "commit_many item 2",
    "table.commit",
]


def _scenario(store: str) -> Any:
    from fencing._bench import _scenario as make

    if store == "sqlite":
        return make(None, "normal")
    url, name, port, module = SERVERS[store]
    if importlib.util.find_spec(f"fencing.backends.{module}") is None:
        pytest.skip(f"the {store} backend does not exist in this tree")
    require_server(name, "127.0.0.1", port)
    return make(url)


@pytest.mark.parametrize("store", ["sqlite", *sorted(SERVERS)])
def test_baselines_answer_as_fencing_does(store: str) -> None:
    """On success the row at its new version; on refusal the current row and why."""
    scenario = _scenario(store)
    try:
        cases = scenario.check_answers()
    finally:
        scenario.close()
    assert [case for case, _, _ in cases] == CASES
    by_case = {case: (ours, theirs) for case, ours, theirs in cases}
    for case, (ours, theirs) in by_case.items():
        assert ours == theirs, (store, case)
    # and the cases are what they claim: the refusals told apart, the rows carried
    assert by_case["commit"][1][:2] == ("committed", 2)
    assert by_case["redelivered"][1][:2] == ("duplicate", 2)
    assert by_case["stale"][1][:2] == ("stale", 2)
    assert by_case["stale"][1][2] == {"status": "shipped", "n": 7}
    assert [by_case[f"commit_many item {i}"][1][0] for i in range(3)] == [
        "committed",
        "stale",
        "committed",
    ]
    assert by_case["table.commit"][1][2]["status"] == "shipped"


def test_a_baseline_that_returns_less_stops_the_bench(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fencing._bench._sqlite import SQLiteHand

    def less(self: Any, collection: str, key: str, version: int, state: Any, iid: str) -> Any:
        return ("committed", version + 1, {})  # applied, but not the row

    monkeypatch.setattr(SQLiteHand, "answer_commit", less)
    assert main(["bench", "--quick", "--json", "--only", "lease"]) == 2
    assert "answered otherwise" in capsys.readouterr().err


# -- the other modes, --quick on every store that can run them ----------------------------------
@pytest.mark.parametrize("server", ["postgresql", "redis"])
def test_contention_quick(capsys: pytest.CaptureFixture[str], server: str) -> None:
    url, name, port, _ = SERVERS[server]
    require_server(name, "127.0.0.1", port)
    rows = bench_json(capsys, "--contention", "--store", url)
    grid = [r for r in rows if r["kind"] == "contention"]
    assert [(r["how"], r["keys"], r["decide_ms"]) for r in grid] == [
        ("threads", 1, 0.0),
        ("threads", 64, 2.0),
        ("processes", 64, 0.0),
    ]
    other = "redis-py Lock" if server == "redis" else "FOR UPDATE txn"
    for row in grid:
        assert row["store"] == server and row["baseline"] == other
        for name in ("fencing_goodput", "baseline_goodput", "goodput_ratio"):
            assert math.isfinite(row[name]) and row[name] > 0, (name, row)
        assert row["fencing_cpu_us_per_op"] > 0 and row["baseline_cpu_us_per_op"] > 0
        assert row["goodput_met"] is (row["goodput_ratio"] >= row["goodput_target"])
    # issue 21's floors: on Redis 3x a lock on one hot key, 1.5x on many; beside FOR
    # UPDATE 0.8x on one hot key with a 0 ms decide, 1.2x on 64 keys with a 2 ms decide
    want = [3.0, 1.5, 1.5] if server == "redis" else [0.8, 1.2, 1.0]
    assert [r["goodput_target"] for r in grid] == want
    single = {r["operation"] for r in rows if r["kind"] == "single"}
    if server == "postgresql":
        pytest.importorskip("sqlalchemy")
        pytest.importorskip("concurrency")  # django-concurrency, the bench extra
        assert single == {
            "fencing apply + Recompute",
            "FOR UPDATE txn",
            "SQLAlchemy ORM version_id_col",
            "django-concurrency save()",
        }
        for row in rows:
            if row["kind"] == "single":
                for name in ("wall_us_per_op", "cpu_us_per_op"):
                    assert math.isfinite(row[name]) and row[name] > 0, (name, row)
    else:
        assert not single


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--contention"], "--contention needs --store"),
        (["--server-cost"], "--server-cost needs --store"),
        (["--scale", "--report", "x.html"], "--report draws the operation contests"),
    ],
)
def test_modes_refuse_what_they_cannot_do(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["bench", "--quick", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("server", ["postgresql", "redis"])
def test_server_cost_quick(capsys: pytest.CaptureFixture[str], server: str) -> None:
    url, name, port, _ = SERVERS[server]
    require_server(name, "127.0.0.1", port)
    rows = bench_json(capsys, "--server-cost", "--store", url)
    assert [r["kind"] for r in rows] == ["server"], rows
    row = rows[0]
    assert row["store"] == server and row["operation"] == "collection.commit"
    assert row["fencing_server_us"] > 0 and row["baseline_server_us"] > 0


def test_scale_quick(capsys: pytest.CaptureFixture[str]) -> None:
    url, name, port, _ = SERVERS["postgresql"]
    stores = ["sqlite"]
    args = ["--scale"]
    if server_up("127.0.0.1", port) or CI:  # CI: the server must be there
        require_server(name, "127.0.0.1", port)
        stores.append("postgresql")
        args += ["--store", url]
    rows = bench_json(capsys, *args, "--store", "redis://127.0.0.1:6379/0")
    skipped = [r for r in rows if r["kind"] == "skipped"]
    assert [(r["store"], r["reason"]) for r in skipped] == [
        ("redis", "--scale measures SQLite and PostgreSQL")
    ]
    scale = [(r["store"], r["records"]) for r in rows if r["kind"] == "scale"]
    assert scale == [(s, n) for s in stores for n in (100, 1000)]
    prunes = [r for r in rows if r["kind"] == "prune"]
    assert [r["store"] for r in prunes] == stores
    for row in prunes:
        assert row["removed"] >= 1000 and row["prune_s"] > 0


def test_worktx_sides_do_the_same_work() -> None:
    """Both sides of the worker-transaction contest ship, book a row and send the next
    step: one commit, one shipment row and one outbox row per call, each."""
    from fencing._bench._sqlite import SQLiteBench

    bench = SQLiteBench(None, "normal")
    try:
        contest = bench.worktx()
        assert not isinstance(contest, Skip)
        joined, separate = contest.sides
        assert joined.label == "fencing, worker transaction"
        assert separate.label == "fenced_task, separate"
        conn = sqlite3.connect(bench.path)
        try:
            shipments = f"bench_ship_{bench.suffix}"
            for side, done in ((joined, 3), (separate, 6)):
                block = side.prepare(3)
                for i in range(3):
                    block.stages[0](i)
                (rows,) = conn.execute(f"SELECT COUNT(*) FROM {shipments}").fetchone()
                (sent,) = conn.execute("SELECT COUNT(*) FROM fencing_outbox").fetchone()
                assert (rows, sent) == (done, done), side.label
            table = bench.store.table(f"bench_worktx_{bench.suffix}")
            shipped = [table.get(k).version for k in (1, 2, 3, 51, 52, 53)]
            assert shipped == [2] * 6
        finally:
            conn.close()
    finally:
        bench.close()
