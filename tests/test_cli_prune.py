"""``fencing prune URL``: forgets applied intent ids, finished effects and sent outbox
rows past the retention (or ``--older-than``), never a row still to publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fencing
from fencing import Committed, Duplicate, Stale
from fencing._cli import main


def test_prune_forgets_what_is_past_the_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with fencing.open(url) as store:
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        intent = orders.intent("o-1", "bump")
        assert isinstance(orders.commit(intent, {"n": 1}), Committed)
        assert isinstance(orders.commit(intent, {"n": 1}), Duplicate)

    assert main(["prune", url, "--json"]) == 0  # the default horizon: 30 days, nothing
    assert json.loads(capsys.readouterr().out) == {
        "older_than": 30 * 86400.0,
        "pruned": 0,
        "outbox_pruned": 0,
    }
    assert main(["prune", url, "--older-than", "0"]) == 0
    assert capsys.readouterr().out == (
        "pruned 1 applied intent(s) and finished effect(s), 0 sent outbox row(s) older than 0s\n"
    )
    with fencing.open(url) as store:  # the id is forgotten: a replay is only Stale now
        assert isinstance(store.collection("orders").commit(intent, {"n": 1}), Stale)


def test_prune_on_a_store_without_an_outbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("redis")
    from tests._backends import CASES, require_server

    require_server("Redis", "127.0.0.1", 6379)
    case = CASES["redis"]
    url = case.url(tmp_path)
    try:
        fencing.open(url).close()  # made and migrated
        assert main(["prune", url, "--json", "--older-than", "3600"]) == 0
        assert json.loads(capsys.readouterr().out)["outbox_pruned"] is None
    finally:
        if case.cleanup is not None:
            case.cleanup(url)


@pytest.mark.parametrize("bad", ["-1", "soon", "inf", "nan"])
def test_prune_refuses_a_bad_horizon(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["prune", "sqlite:///never-made.db", "--older-than", bad])
    assert exc.value.code == 2
    assert "--older-than: a number of seconds" in capsys.readouterr().err
    assert not Path("never-made.db").exists()
