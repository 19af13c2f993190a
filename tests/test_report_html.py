"""The HTML reports (`fencing demo --report`, `fencing bench --report`), without a browser:
structure, escaping of hostile names, both lanes, the verdict, the legend, bad paths.
tests/test_report_browser.py opens the same pages in headless Chromium."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fencing._bench._html import bench_html
from fencing._cli import main
from fencing._demo.report import RunView, race_html
from fencing._html import check_report_path, esc
from fencing.testing import check_history, iter_file

from ._backends import require_server

HOSTILE = "</svg><script>alert('x')</script>&amp;\"<b>"
T0 = 1_800_000_000.0


class Tags(HTMLParser):
    """Counts elements, checks nesting, collects attributes and text."""

    VOID: ClassVar = frozenset({"meta", "br", "img", "link", "input", "hr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.starts: dict[str, int] = {}
        self.attrs: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts[tag] = self.starts.get(tag, 0) + 1
        self.attrs.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts[tag] = self.starts.get(tag, 0) + 1
        self.attrs.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    tags.close()
    assert tags.errors == [] and tags.stack == [], (tags.errors, tags.stack)
    return tags


def assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    for pattern in (r"\bsrc=", r"\bhref=", r"url\(", r"@import", r"<link", r"<iframe"):
        assert re.search(pattern, page, re.I) is None, pattern
    # the only address is SVG's namespace name, which nothing fetches
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}


# -- the race --------------------------------------------------------------------------
def outcome(
    mode: str,
    worker: str,
    key: str,
    t: float,
    decided: float,
    result: str,
    expected: int,
    version: int,
    applied_over: int | None = None,
    intent: str = "",
    token: int | None = None,
    kind: str = "orders",
) -> dict[str, Any]:
    event = {
        "event": "outcome",
        "t": T0 + t,
        "decided_at": T0 + decided,
        "worker": f"{mode}-{worker}",
        "collection": f"demo.abc.{mode}.{kind}",
        "key": key,
        "intent_id": intent or f"i{t}{worker}",
        "transition": "ship",
        "expected_version": expected,
        "outcome": result,
        "version": version,
        "applied_over": applied_over,
        "token": token,
        "fence": 0,
    }
    if result == "fenced":
        event["reason"] = "newer_owner"
    return event


def naive_events(key: str) -> list[dict[str, Any]]:
    return [
        outcome("naive", "t1", key, 0.10, 0.00, "committed", 1, 2, 1, intent="a"),
        # decided against v1 too, overwrote v2: a stale write, and a's write is lost
        outcome("naive", "t2", key, 0.30, 0.05, "committed", 1, 3, 2, intent="b"),
        outcome("naive", "t1", "calm", 0.20, 0.15, "committed", 1, 2, 1, intent="c"),
        {"event": "final", "collection": "demo.abc.naive.orders", "key": key, "version": 3},
        {"event": "final", "collection": "demo.abc.naive.orders", "key": "calm", "version": 2},
    ]


def fencing_events(key: str) -> list[dict[str, Any]]:
    return [
        outcome("fencing", "t1", key, 0.10, 0.00, "committed", 1, 2, 1, intent="a"),
        outcome("fencing", "t2", key, 0.30, 0.05, "stale", 1, 2, intent="b"),
        outcome("fencing", "t1", key, 0.40, 0.00, "duplicate", 1, 2, intent="a"),
        outcome("fencing", "t3", key, 0.50, 0.20, "fenced", 2, 2, intent="d", token=1),
        outcome("fencing", "t1", "calm", 0.20, 0.15, "committed", 1, 2, 1, intent="c"),
        {"event": "final", "collection": "demo.abc.fencing.orders", "key": key, "version": 2},
        {"event": "final", "collection": "demo.abc.fencing.orders", "key": "calm", "version": 2},
    ]


def view(mode: str, events: list[dict[str, Any]], drift: int | None = None) -> RunView:
    return RunView(mode, list(enumerate(events, 1)), check_history(events), drift)


def test_race_page_shows_both_lanes_the_verdict_and_the_legend() -> None:
    naive = view("naive", naive_events(HOSTILE), drift=-12)
    fenced = view("fencing", fencing_events(HOSTILE), drift=0)
    assert naive.report.counts["stale_write"] == 1 and naive.report.counts["lost_update"] == 1
    assert fenced.report.ok
    page = race_html([naive, fenced], about=f"about {HOSTILE}")
    assert_self_contained(page)
    tags = parse(page)

    # the verdict on top: naive fails, fencing passes, before any timeline
    verdict = page.index('id="verdict"')
    assert verdict < page.index('class="key"')
    assert 'data-ok="true"' in page
    assert re.search(r'class="verdict fail" data-run="naive".*?FAIL, 2 anomalies', page)
    assert re.search(r'class="verdict pass" data-run="fencing".*?PASS, no anomaly', page)
    assert "1 lost updates, 1 stale writes" in page and "drift: -12" in page
    assert "refused: 1 stale, 1 duplicate, 1 fenced" in page

    # a timeline per key, each with both lanes; the hostile key first (it has the most)
    sections = page.split('<section class="key">')[1:]
    assert len(sections) == 2
    assert "orders <code>&lt;/svg&gt;&lt;script&gt;" in sections[0]
    for section in sections:
        lanes = re.findall(r'data-lane="(\w+)"', section)
        assert lanes == ["naive", "fencing"]
    assert tags.starts["svg"] >= 3  # the legend's marks are small SVGs too

    # naive: the stale write and the lost update flagged; fencing: one mark per refusal
    hostile = sections[0]
    naive_lane, fencing_lane = hostile.split('data-lane="fencing"')
    assert naive_lane.count('class="mark anomaly"') == 2
    assert "stale write: decided against" in naive_lane and "lost update:" in naive_lane
    for refusal in ("stale", "duplicate", "fenced"):
        assert fencing_lane.count(f'class="mark {refusal}"') == 1
    assert "mark anomaly" not in fencing_lane
    assert "newer owner" in fencing_lane  # the fenced reason, in its tooltip
    # each outcome joined to its decision: one line per mark with a decided_at
    assert naive_lane.count("<line ") == 2 and fencing_lane.count("<line ") >= 4

    legend = page[page.index('id="legend"') :].split("</div>", 1)[0]
    for text in ("stale write", "lost update", "double-applied", "fence regression"):
        assert text in legend
    for text in ("stale: refused", "duplicate: refused", "fenced: refused"):
        assert text in legend

    # the hostile text is shown as text, never parsed as markup
    text = "".join(tags.text)
    assert HOSTILE in text
    assert f"about {HOSTILE}" in text
    assert all(tag != "script" and tag != "b" for tag, _ in tags.attrs)


def test_race_page_shows_the_keys_with_most_to_see_first_and_says_how_many() -> None:
    naive: list[dict[str, Any]] = []
    fenced: list[dict[str, Any]] = []
    for i in range(8):
        key = f"k-{i}"
        naive.append(outcome("naive", "t1", key, 0.1 + i, i, "committed", 1, 2, 1, intent=f"a{i}"))
        fenced.append(
            outcome("fencing", "t1", key, 0.1 + i, i, "committed", 1, 2, 1, intent=f"a{i}")
        )
    for i in range(3):  # k-5 has the most refusals, then k-2
        fenced.append(outcome("fencing", "t2", "k-5", 0.5 + i, 0.4, "stale", 1, 2, intent=f"s{i}"))
    fenced.append(outcome("fencing", "t2", "k-2", 0.6, 0.4, "stale", 1, 2, intent="s9"))
    page = race_html([view("naive", naive), view("fencing", fenced)], max_keys=3)
    assert "Showing 3 of 8 keys" in page
    shown = re.findall(r"<h2>orders <code>([^<]*)</code></h2>", page)
    assert shown == ["k-5", "k-2", "k-0"]


def test_race_page_without_decision_times_or_events() -> None:
    events = naive_events("o-1")
    for ev in events:
        ev.pop("decided_at", None)
    page = race_html([view("naive", events), view("fencing", [])])
    parse(page)
    lane = page.split('data-lane="naive"')[1].split('data-lane="fencing"')[0]
    assert "<line " not in lane  # no decision time: the outcome alone
    assert "Showing 2 of 2 keys" in page


def test_esc_makes_any_text_inert() -> None:
    assert esc("<a href='x'>&\"") == "&lt;a href=&#x27;x&#x27;&gt;&amp;&quot;"
    assert esc("a\x00b\x1bc\td\ne") == "a\ufffdb\ufffdc\td\ne"


# -- the demo's option ---------------------------------------------------------------------
def test_demo_writes_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "race.html"
    history = tmp_path / "history"
    size = ["--tasks", "60", "--workers", "4", "--keys", "2"]
    code = main(["demo", "--json", *size, "--report", str(report), "--history", str(history)])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ok"]
    assert data["config"]["report"] == str(report)
    page = report.read_text(encoding="utf-8")
    assert_self_contained(page)
    parse(page)
    assert 'id="verdict" data-ok="true"' in page
    assert "naive read-modify-write: FAIL" in page and "fencing: PASS, no anomaly" in page
    assert "Showing 4 of 4 keys" in page  # two accounts, two orders
    assert page.count('data-lane="naive"') == page.count('data-lane="fencing"') == 4
    # every outcome of the histories is a mark, and each has its decision time
    outcomes = [
        ev
        for mode in ("naive", "fencing")
        for _, ev in iter_file(history / f"{mode}.jsonl")
        if ev["event"] == "outcome"
    ]
    assert page.count('<g class="mark ') == len(outcomes)
    assert all(ev["decided_at"] <= ev["t"] for ev in outcomes)
    assert not list(tmp_path.glob("*.tmp*"))


def test_demo_report_without_history_keeps_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "race.html"
    code = main(["demo", "--json", "--tasks", "30", "--workers", "3", "--report", str(report)])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report.exists() and data["runs"]["naive"]["history"] == ""
    assert data["runs"]["fencing"]["history"] == ""


@pytest.mark.slow
def test_queue_demo_writes_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rq")
    require_server("Redis", "127.0.0.1", 6379)
    report, history = tmp_path / "race.html", tmp_path / "history"
    size = ["--queue", "rq", "--tasks", "40", "--workers", "3"]
    code = main(["demo", "--json", *size, "--report", str(report), "--history", str(history)])
    assert code == 0 and json.loads(capsys.readouterr().out)["ok"]
    page = report.read_text(encoding="utf-8")
    assert_self_contained(page)
    parse(page)
    assert "through rq" in page and 'id="verdict" data-ok="true"' in page
    assert "naive read-modify-write: FAIL" in page and "fencing: PASS, no anomaly" in page
    shown = int(re.findall(r"Showing (\d+) of", page)[0])
    assert page.count('data-lane="naive"') == page.count('data-lane="fencing"') == shown >= 4
    outcomes = [
        ev
        for mode in ("naive", "fencing")
        for _, ev in iter_file(history / f"{mode}.jsonl")
        if ev["event"] == "outcome"
    ]
    # the queue's workers record when each decision was taken, as the in-process ones do
    assert outcomes and all(ev["decided_at"] <= ev["t"] for ev in outcomes)
    assert page.count("<line ") >= len([e for e in outcomes if _shown(e, page)])


def _shown(event: dict[str, Any], page: str) -> bool:
    return f"<code>{esc(event['key'])}</code>" in page


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_a_report_path_that_cannot_be_written_is_refused_first(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir" / "r.html"
    for path, problem in ((missing, "does not exist"), (tmp_path, "is a directory")):
        assert main([command, "--report", str(path), "--json"]) == 2
        err = capsys.readouterr().err
        assert "InvalidInput" in err and problem in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing run
    if command == "demo":  # the outbox race is not drawn: said, not silently skipped
        report = tmp_path / "r.html"
        assert main(["demo", "--queue", "rq", "--outbox", "--report", str(report)]) == 2
        assert "--outbox race" in capsys.readouterr().err and not report.exists()
    with pytest.raises(Exception, match="needs a file name"):
        check_report_path("", "--report")


# -- the bench -----------------------------------------------------------------------------
def pair(store: str, setting: str, operation: str, ratio: float, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kind": "pair",
        "store": store,
        "setting": setting,
        "operation": operation,
        "baseline": "hand-written",
        "baseline_method": "UPDATE ... WHERE version = ?",
        "fencing_method": "collection.commit",
        "ratio": ratio,
        "ratio_low": ratio * 0.9,
        "ratio_high": ratio * 1.2,
        "fencing_ops_per_s": 1000.0,
        "baseline_ops_per_s": 1000.0 * ratio,
        "target_ratio": None,
        "target_met": None,
    }
    for side, scale in (("fencing", ratio), ("baseline", 1.0)):
        for q, us in ((10, 80), (25, 90), (50, 100), (75, 120), (90, 150), (99, 400)):
            row[f"{side}_p{q}_us"] = us * scale
    row.update(extra)
    return row


def test_bench_page_charts_ratios_and_latencies_per_operation_and_store() -> None:
    rows = [
        pair("sqlite", "WAL, FULL", "collection.commit", 1.2, target_ratio=1.5, target_met=True),
        pair("sqlite", "WAL, FULL", HOSTILE, 0.8),
        pair("postgresql", "server", "collection.commit", 1.1, baseline="1-trip CTE"),
        pair("postgresql", "server", "lease acquire", 9.5),  # beyond the axis: capped, marked
        {
            "kind": "skipped",
            "store": "redis",
            "setting": "redis",
            "operation": None,
            "reason": "unavailable: <refused>",
        },
    ]
    old = pair("postgresql", "server", "apply", 1.0)
    for side in ("fencing", "baseline"):  # a row from before p10-p90 were reported
        for q in (10, 25, 75, 90):
            del old[f"{side}_p{q}_us"]
    rows.insert(4, old)
    page = bench_html(rows, quick=True)
    assert_self_contained(page)
    tags = parse(page)
    assert 'id="quick"' in page
    ratios = page[page.index('id="ratios"') : page.index('id="latencies"')]
    assert ratios.count('<g class="ratio">') == 5
    assert "1.10x vs 1-trip CTE" in ratios and "9.50x &gt;" in ratios
    # one row per operation across stores: collection.commit has two bars
    assert ratios.count(">collection.commit</text>") == 1
    assert "sqlite: WAL, FULL" in ratios and "postgresql: server" in ratios
    latencies = page[page.index('id="latencies"') :]
    assert latencies.count('<g class="latency fencing">') == 5
    assert latencies.count('<g class="latency baseline">') == 5
    assert re.findall(r'data-store="(\w+)"', latencies) == ["sqlite", "postgresql", "redis"]
    assert "target: collection.commit within 1.50x of hand-written: met (1.20x)" in page
    assert "skipped store: unavailable: &lt;refused&gt;" in page
    assert HOSTILE in "".join(tags.text)


def test_bench_writes_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "bench.html"
    code = main(["bench", "--quick", "--only", "commit", "--json", "--report", str(report)])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0
    pairs = [r for r in rows if r["kind"] == "pair"]
    assert pairs and all(
        r[f"{side}_p{a}_us"] <= r[f"{side}_p{b}_us"]
        for r in pairs
        for side in ("fencing", "baseline")
        for a, b in ((10, 25), (25, 50), (50, 75), (75, 90), (90, 99))
    )
    page = report.read_text(encoding="utf-8")
    assert_self_contained(page)
    parse(page)
    assert page.count('<g class="ratio">') == len(pairs)
    assert page.count('<g class="latency fencing">') == len(pairs)


def test_race_page_packs_a_lane_of_many_one_job_workers_into_rows() -> None:
    # RQ forks a process per job: a worker name per task. Twenty short tasks one after
    # another on one key fit in one row; the page says so.
    events = [
        outcome("fencing", f"p{i}", "o-1", 0.05 + i * 0.5, i * 0.5, "committed", i + 1, i + 2)
        for i in range(20)
    ]
    for i, ev in enumerate(events):
        ev["applied_over"] = i + 1
    page = race_html([view("naive", []), view("fencing", events)])
    lane = page.split('data-lane="fencing"')[1]
    assert "(20 workers in 1 row: hover a mark for its worker)" in lane
    assert lane.count('<g class="mark committed">') == 20
    assert "fencing-p0" not in lane and "p7: ship decided against v8" in lane
