"""The history checker's verdicts exactly: which anomaly, which events, which words.

Small hand-made histories, each with every anomaly the checker must report (kind, key,
message, line numbers) and nothing else; and malformed events with their exact message.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from fencing.testing import HistoryError, Report, check_file, check_history

from .test_checker import commit, final, refused

Event = dict[str, Any]


def found(report: Report) -> list[tuple[str, str, str | int, str, tuple[int, ...]]]:
    """Every anomaly of a report as (kind, collection, key, message, lines), in report order."""
    return [
        (a.kind, a.collection, a.key, a.message, a.lines)
        for kind in report.anomalies
        for a in report.anomalies[kind]
    ]


def v(version: int, over: int, **kw: Any) -> Event:
    """A commit of ``version`` over ``over`` (decided against ``over`` unless told)."""
    kw.setdefault("expected", over)
    return commit(version, over=over, **kw)


LOST = "lost_update"
STALE = "stale_write"
DOUBLE = "double_applied"
FENCE = "fence_regression"
OLDER = "overwritten by a write decided against an older version"

# name: (history, every anomaly expected, in report order: kind, message, lines)
CASES: dict[str, tuple[list[Event], list[tuple[str, str, tuple[int, ...]]]]] = {
    # -- lost updates and why; the final event's line comes with each
    "a lost commit that produced the head version": (
        [v(2, 1, intent="a"), v(2, 1, intent="b"), final(2)],
        [(LOST, "v2 of intent a lost: 2 commits produced v2", (1, 3))],
    ),
    "overwritten by an older decision": (
        [v(2, 1, intent="a"), v(3, 2, intent="b"), v(4, 2, intent="c"), final(4)],
        [(LOST, f"v3 of intent b lost: {OLDER}", (2, 4))],
    ),
    "rolled back": (
        [v(2, 1, intent="a"), v(3, 2, intent="b"), final(2)],
        [(LOST, "v3 of intent b lost: rolled back, the final version is v2", (2, 3))],
    ),
    "without a final event, no final line": (
        [v(2, 1, intent="a"), v(3, 2, intent="b"), v(3, 1, intent="c")],
        [
            (LOST, f"v2 of intent a lost: {OLDER}", (1,)),
            (LOST, "v3 of intent b lost: 2 commits produced v3", (2,)),
        ],
    ),
    # intent ids of 14 characters are shown whole; longer ones cut to 12 and an ellipsis
    "intent ids cut after 14 characters": (
        [v(2, 1, intent="abcdefghijklmn"), v(3, 2, expected=1, intent="abcdefghijklmno")],
        [
            (LOST, f"v2 of intent abcdefghijklmn lost: {OLDER}", (1,)),
            (STALE, "intent abcdefghijkl\u2026 decided against v1, applied over v2", (2,)),
        ],
    ),
    "a double apply names the root, before the first '~'": (
        [v(2, 1, intent="x~1"), v(3, 2, intent="x~2~1"), v(4, 3, intent="x~1~1~1~1~1~1~1")],
        [(DOUBLE, "intent x committed 3 times", (1, 2, 3))],
    ),
    # a guard-only intent (no expected version) chains through the version it replaced
    "guard-only intents chain through applied_over": (
        [v(2, 1, expected=None), v(3, 2, expected=None), final(3)],
        [],
    ),
    # b was decided against v3 (a broken recorder) and is the first producer of its own
    # base: the trace goes on through the later producer of v3, and nothing is lost
    "a commit that produced its own base": (
        [
            v(2, 1, intent="a"),
            v(3, 2, expected=3, intent="b"),
            v(4, 3, intent="d"),
            v(3, 2, intent="c"),
            final(4),
        ],
        [(STALE, "intent b decided against v3, applied over v2", (2,))],
    ),
    # the only producer of its own base: the trace ends there
    "a commit that is the only producer of its own base": (
        [v(2, 1, intent="p"), v(3, 2, intent="q"), v(4, 3, expected=4, intent="s"), final(4)],
        [
            (LOST, f"v2 of intent p lost: {OLDER}", (1, 4)),
            (LOST, f"v3 of intent q lost: {OLDER}", (2, 4)),
            (STALE, "intent s decided against v4, applied over v3", (3,)),
        ],
    ),
    # -- fence regressions: the earliest commit of the highest token on the chain is named
    "the earliest holder of the highest token is named": (
        [v(2, 1, token=9), v(3, 2, token=9), v(4, 3, token=1)],
        [(FENCE, "token 1 wrote v4 after token 9 wrote v2", (1, 3))],
    ),
    "a chain already walked is remembered": (
        [v(2, 1, token=1), v(3, 2, token=1), v(4, 3, token=9), v(5, 4, token=9), v(6, 5, token=1)],
        [(FENCE, "token 1 wrote v6 after token 9 wrote v4", (3, 5))],
    ),
    "a lower token after a remembered higher one": (
        [v(2, 1, token=9), v(3, 2, token=1), v(4, 3, token=1)],
        [
            (FENCE, "token 1 wrote v3 after token 9 wrote v2", (1, 2)),
            (FENCE, "token 1 wrote v4 after token 9 wrote v2", (1, 3)),
        ],
    ),
    "token 0 is a token": (
        [v(2, 1, token=0), v(3, 2, token=1), v(4, 3, token=0)],
        [(FENCE, "token 0 wrote v4 after token 1 wrote v3", (2, 3))],
    ),
    "a chain without tokens, then a regression": (
        [v(2, 1), v(3, 2, token=1), v(4, 3, token=9), v(5, 4, token=2)],
        [(FENCE, "token 2 wrote v5 after token 9 wrote v4", (3, 4))],
    ),
    # two producers of v2 before v3: v3 follows the latest one (token 1), not the first
    "a write follows the latest earlier producer": (
        [v(2, 1, token=9, intent="a"), v(2, 1, token=1, intent="b"), v(3, 2, token=1)],
        [(LOST, "v2 of intent a lost: 2 commits produced v2", (1,))],
    ),
    "a token on another chain of the key holds nothing": (
        [v(2, 1, token=1), v(10, 9, token=7), v(3, 2, token=1), final(3)],
        [(LOST, "v10 of intent i-c-k-10-7 lost: rolled back, the final version is v3", (2, 4))],
    ),
    # -- recorded out of order (processes append after their commit returned)
    "out of order: the predecessor is recorded later": (
        [v(3, 2, token=2), v(2, 1, token=5)],
        [(FENCE, "token 2 wrote v3 after token 5 wrote v2", (2, 1))],
    ),
    "out of order: the chain goes on through a later record": (
        [v(3, 2), v(2, 1, token=5), v(4, 3, token=2)],
        [(FENCE, "token 2 wrote v4 after token 5 wrote v2", (2, 3))],
    ),
    "out of order: the first recorded producer is followed": (
        [v(3, 2, token=1, intent="x"), v(2, 1, token=9, intent="y"), v(2, 1, token=1, intent="z")],
        [
            (LOST, "v2 of intent z lost: 2 commits produced v2", (3,)),
            (FENCE, "token 1 wrote v3 after token 9 wrote v2", (2, 1)),
        ],
    ),
    # v9's chain starts at v8, recorded with nothing before it: no token, no regression
    # (v3's chain, walked first, ends at the last commit recorded)
    "out of order: a chain's start knows no token": (
        [v(3, 2, token=1), v(9, 8, token=1), v(8, 7), v(2, 1, token=5)],
        [
            (LOST, f"v3 of intent i-c-k-3-1 lost: {OLDER}", (1,)),
            (LOST, f"v2 of intent i-c-k-2-5 lost: {OLDER}", (4,)),
            (FENCE, "token 1 wrote v3 after token 5 wrote v2", (4, 1)),
        ],
    ),
    # the commit of line 2 replaced v3 and made v3 (a broken recorder), the first one
    # recorded: v4's chain goes on through the later producer of v3 (line 4) to token 5
    "out of order: a commit over its own version": (
        [v(2, 1, token=5), v(3, 3, intent="a"), v(4, 3, token=2), v(3, 2, intent="c")],
        [(FENCE, "token 2 wrote v4 after token 5 wrote v2", (1, 3))],
    ),
    # the same with a token: line 2's own chain goes on through line 3 to token 5
    "out of order: a commit under a token over its own version": (
        [v(2, 1, token=5), v(3, 3, token=2, intent="s"), v(3, 2, intent="c")],
        [
            (LOST, "v3 of intent s lost: 2 commits produced v3", (2,)),
            (FENCE, "token 2 wrote v3 after token 5 wrote v2", (1, 2)),
        ],
    ),
}


@pytest.mark.parametrize(("events", "expected"), CASES.values(), ids=list(CASES))
def test_each_anomaly_exactly(
    events: list[Event], expected: list[tuple[str, str, tuple[int, ...]]]
) -> None:
    report = check_history(events)
    assert found(report) == [(kind, "c", "k", message, lines) for kind, message, lines in expected]
    assert report.total == len(expected) and report.ok is (not expected)
    for anomaly in (a for kind in report.anomalies for a in report.anomalies[kind]):
        assert anomaly.events == tuple(events[line - 1] for line in anomaly.lines)


def test_keys_and_collections_are_named_as_recorded() -> None:
    events = [
        commit(2, key=7, collection="orders", intent="a"),
        commit(2, key=7, collection="orders", intent="a~1"),
    ]
    report = check_history(events)
    assert found(report) == [
        (LOST, "orders", 7, "v2 of intent a lost: 2 commits produced v2", (1,)),
        (DOUBLE, "orders", 7, "intent a committed 2 times", (1, 2)),
    ]
    assert (
        report.summary()
        == "2 anomalies in 2 events on 1 keys: 1 lost updates, 1 double-applied intents"
    )


def test_error_events_are_counted_and_their_keys_too() -> None:
    def error(key: str) -> Event:
        return {"event": "error", "collection": "c", "key": key, "intent_id": "i", "t": 1}

    report = check_history([error("a"), error("b"), error("a"), refused("stale", 2, key="c")])
    assert (report.errors, report.keys, report.events) == (3, 3, 4)
    assert report.ok and report.outcomes["stale"] == 1


def test_events_may_be_any_mapping() -> None:
    events = [types.MappingProxyType(e) for e in (commit(2), commit(3), final(3))]
    report = check_history(events)
    assert report.ok and report.events == 3


def _without(event: Event, name: str) -> Event:
    return {k: val for k, val in event.items() if k != name}


def _bare(**fields: Any) -> Event:
    """A refused outcome with no version fields at all but ``fields``."""
    return {
        "event": "outcome",
        "collection": "c",
        "key": "k",
        "intent_id": "r",
        "outcome": "stale",
        **fields,
    }


LEASE: Event = {"event": "lease", "name": "c/k", "action": "acquire", "token": 1}


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (["a"], "an event must be a JSON object, got list"),
        (_without(commit(2), "key"), "'key' is missing"),
        ({**commit(2), "collection": 5}, "'collection' must be a non-empty string, got 5"),
        ({**commit(2), "intent_id": 5}, "'intent_id' must be a non-empty string, got 5"),
        ({**commit(2), "intent_id": ""}, "'intent_id' must be a non-empty string, got ''"),
        ({**commit(2), "applied_over": "1"}, "'applied_over' must be an integer or null, got '1'"),
        ({**commit(2), "fence": "x"}, "'fence' must be an integer or null, got 'x'"),
        (_bare(version="2"), "'version' must be an integer or null, got '2'"),
        ({**commit(2), "version": None}, "a commit with 'applied_over' needs its 'version'"),
        (
            {**commit(2), "applied_over": None},
            "a committed outcome with a 'version' needs 'applied_over'",
        ),
        ({**commit(2), "t": float("inf")}, "'t' must be a finite number, got inf"),
        ({**commit(2), "t": float("nan")}, "'t' must be a finite number, got nan"),
        ({**final(2), "t": float("-inf")}, "'t' must be a finite number, got -inf"),
        ({**final(2), "t": "noon"}, "'t' must be a finite number, got 'noon'"),
        ({**final(2), "fence": "x"}, "'fence' must be an integer or null, got 'x'"),
        (_without(final(2), "key"), "'key' is missing"),
        (_without(LEASE, "name"), "'name' must be a non-empty string, got None"),
        ({**LEASE, "token": "1"}, "'token' must be an integer or null, got '1'"),
        ({**LEASE, "token": None}, "a lease event needs an integer 'token'"),
        ({"event": "error", "collection": "c", "intent_id": "i"}, "'key' is missing"),
    ],
)
def test_a_malformed_event_exactly(event: object, message: str) -> None:
    with pytest.raises(HistoryError) as caught:
        check_history([commit(2), LEASE, event])  # type: ignore[list-item]
    assert str(caught.value) == f"line 3: {message}"


@pytest.mark.parametrize("t", [0, 1.5, -2, 1e300])
def test_finite_times_are_accepted_on_every_event(t: float) -> None:
    events = [{**commit(2), "t": t}, {**final(2), "t": t}, {**LEASE, "t": t}]
    assert check_history(events).ok


def test_a_second_final_event_exactly() -> None:
    with pytest.raises(HistoryError) as caught:
        check_history([final(2, key=7, collection="orders"), final(2, key=7, collection="orders")])
    assert str(caught.value) == "line 2: a second 'final' event for orders/7"


def test_a_non_json_constant_in_a_file_exactly(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(commit(2)) + "\n" + '{"event": "final", "version": NaN}\n')
    with pytest.raises(HistoryError) as caught:
        check_file(path)
    assert str(caught.value) == f"{path}: line 2: not JSON (NaN is not valid JSON)"


def test_an_infinite_time_in_a_file(tmp_path: Path) -> None:
    # 1e999 is valid JSON and reads as infinity
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(commit(2)).replace('"t": 0.0', '"t": 1e999') + "\n")
    with pytest.raises(HistoryError) as caught:
        check_file(path)
    assert str(caught.value) == f"{path}: line 1: 't' must be a finite number, got inf"
