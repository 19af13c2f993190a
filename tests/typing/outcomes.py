"""Checked by mypy --strict in tests/test_typing.py (not collected by pytest).

A user's code must type-check: an exhaustive ``match`` over ``fencing.Outcome``
ending in ``assert_never``, and a decide annotated ``-> dict[str, Any] | SkipType``.
"""

from __future__ import annotations

from typing import Any, assert_never

import fencing


def describe(outcome: fencing.Outcome) -> str:
    match outcome:
        case fencing.Committed(record):
            return f"committed at {record.version}"
        case fencing.Stale(current):
            return f"stale at {current.version}"
        case fencing.Duplicate():
            return "duplicate"
        case fencing.Fenced(current, reason):
            return f"fenced ({reason.value})"
        case fencing.Missing():
            return "missing"
        case fencing.Skipped():
            return "skipped"
        case fencing.Contended(current, attempts):
            return f"contended after {attempts}"
        case _:
            assert_never(outcome)


def decide(record: fencing.Record) -> dict[str, Any] | fencing.SkipType:
    if record.state.get("status") == "shipped":
        return fencing.SKIP
    return {**record.state, "status": "shipped"}


def run(store: fencing.Store) -> str:
    orders = store.collection("orders")
    intent = orders.intent("o-1", "ship")
    return describe(orders.apply(intent, decide))
