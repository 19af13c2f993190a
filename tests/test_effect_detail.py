"""``effect_done``/``effect_failed`` and the detail recorded by ``effect()``: as documented,
a detail given when marking replaces the recorded one whole; without one it is kept."""

from __future__ import annotations

from typing import Any


def test_a_detail_given_when_marking_replaces_the_recorded_one(store: Any) -> None:
    orders = store.collection("orders")
    intent = orders.create("o-1", {"total": 40}).intent("charge")
    fx = orders.effect(intent, "charge", detail={"amount": 40})
    kept = orders.effect_done(fx)
    assert kept.status == "done" and kept.detail == {"amount": 40}
    replaced = orders.effect_done(fx, detail={"charge_id": "ch_1"})
    assert replaced.detail == {"charge_id": "ch_1"}  # not merged
    merged = orders.effect_done(fx, detail={**fx.detail, "charge_id": "ch_1"})
    assert merged.detail == {"amount": 40, "charge_id": "ch_1"}
    assert orders.effects(intent)[0].detail == merged.detail
    other = orders.effect(intent, "email", detail={"to": "a@example.com"})
    failed = orders.effect_failed(other, detail="bounced")
    assert failed.status == "failed" and failed.detail == "bounced"
