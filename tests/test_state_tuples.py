"""A tuple in a state is refused (``InvalidState``) before anything is written.

JSON has no tuples: the store would keep a list while the ``Committed`` record handed
back still held the tuple, so ``get()`` and the outcome would disagree. Refused on
every path (create, commit, commit_many, apply), every backend, sync and async.
"""

from __future__ import annotations

from typing import Any

import pytest

import fencing

TUPLE_STATES = [
    {"items": (1, 2)},
    {"nested": {"pair": ("a", "b")}},
    {"list": [1, [2, (3,)]]},
    {"empty": ()},
]


@pytest.mark.parametrize("state", TUPLE_STATES, ids=["top", "in-dict", "in-list", "empty"])
def test_a_tuple_in_a_state_is_refused_everywhere(store: Any, state: dict[str, Any]) -> None:
    orders = store.collection("orders")
    with pytest.raises(fencing.InvalidState, match="tuple"):
        orders.create("o-0", state)
    assert orders.get("o-0") is None
    rec = orders.create("o-1", {"status": "new"})
    intent = rec.intent("ship")
    with pytest.raises(fencing.InvalidState, match="tuple"):
        orders.commit(intent, state)
    with pytest.raises(fencing.InvalidState, match="tuple"):
        orders.commit_many([(intent, state)])
    with pytest.raises(fencing.InvalidState, match="tuple"):
        orders.apply(intent, lambda r: state)
    assert orders.get("o-1") == rec  # nothing written
    # the intent was not consumed: the list form commits
    out = orders.commit(intent, {"items": [1, 2]})
    assert isinstance(out, fencing.Committed)
    assert out.record == orders.get("o-1")
    assert out.record.state["items"] == [1, 2]
