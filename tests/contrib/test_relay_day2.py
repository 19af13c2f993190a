"""Day-2 operation of ``fencing relay``: a start line saying what it relays, from where
and as whom (no password in it); the store URL from an environment variable or a file
(``env:NAME``, ``file:PATH``: a password on a command line shows in ``ps``), for every
command that takes one; Prometheus metrics on ``--metrics-port``."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import fencing
from fencing._cli import main

from .._backends import CASES, require_server

celery = pytest.importorskip("celery")

from .test_relay import World  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _filled(tmp_path: Path, rows: int = 3) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with fencing.open(url) as store:
        World(store).send(keys=rows, per_key=1)
    return url


def test_the_start_line_and_the_url_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _filled(tmp_path)
    monkeypatch.setenv("SHOP_FENCING_URL", url)
    argv = ["relay", "env:SHOP_FENCING_URL", "--queue", "celery", "--once", "--name", "r-7"]
    assert main([*argv, "--app", "tests.contrib.test_relay:APP", "--batch", "50"]) == 0
    out = capsys.readouterr()
    assert "published 3 row(s)" in out.out
    start = out.err.splitlines()[0]
    assert start == (
        f"relay r-7 started: celery rows of {url} through Celery 'relay-cli'; batches of 50,"
        " claims of 30s, polls every 1s; --once"
    )


def test_the_url_from_a_file_for_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _filled(tmp_path)
    secret = tmp_path / "fencing_url"
    secret.write_text(url + "\n")
    assert main(["outbox", f"file:{secret}", "--json"]) == 0
    assert '"pending": 3' in capsys.readouterr().out
    assert main(["stats", f"file:{secret}"]) == 0
    assert main(["migrate", f"file:{secret}"]) == 0
    assert f"migrated {url}" in capsys.readouterr().out
    argv = ["relay", f"file:{secret}", "--queue", "celery", "--once", "--quiet"]
    assert main([*argv, "--app", "tests.contrib.test_relay:APP"]) == 0
    out = capsys.readouterr()
    assert "published 3 row(s)" in out.out and out.err == ""  # --quiet: no start line


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("env:FENCING_TEST_NOT_SET", "the environment variable FENCING_TEST_NOT_SET"),
        ("env:", "env: needs a name after it, e.g. env:FENCING_URL"),
        ("file:", "file: needs a name after it"),
        ("file:{tmp}/nowhere", "cannot read the store URL from {tmp}/nowhere"),
        ("file:{tmp}/two", "{tmp}/two must hold one store URL on one line"),
        ("file:{tmp}/empty", "{tmp}/empty must hold one store URL on one line"),
    ],
)
def test_a_url_that_cannot_be_read_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, message: str
) -> None:
    (tmp_path / "two").write_text("sqlite:///a.db\nsqlite:///b.db\n")
    (tmp_path / "empty").write_text("\n")
    given, message = given.format(tmp=tmp_path), message.format(tmp=tmp_path)
    assert main(["stats", given]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fencing: ConfigurationError: ") and message in err


def test_the_start_line_hides_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    require_server("PostgreSQL", "127.0.0.1", 5432)
    case = CASES["postgresql"]
    url = case.url(tmp_path).replace("postgresql://root@", "postgresql://root:s3cr%40t@", 1)
    assert ":s3cr%40t@" in url
    try:
        fencing.open(url).close()  # (trust auth: the password is not checked)
        monkeypatch.setenv("FENCING_URL_WITH_PASSWORD", url)
        argv = ["relay", "env:FENCING_URL_WITH_PASSWORD", "--queue", "celery", "--once"]
        assert main([*argv, "--app", "tests.contrib.test_relay:APP"]) == 0
        err = capsys.readouterr().err
        assert "s3cr" not in err and "postgresql://root:***@127.0.0.1" in err
    finally:
        assert case.cleanup is not None
        case.cleanup(url)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sample(text: str, name: str, labels: str) -> float | None:
    found = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def test_metrics_on_a_port(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    url = _filled(tmp_path, rows=5)
    port = _free_port()
    argv = ["relay", url, "--queue", "celery", "--app", "tests.contrib.test_relay:APP"]
    argv += ["--poll", "0.05", "--quiet", "--metrics-port", str(port)]
    relay = subprocess.Popen(
        [sys.executable, "-W", "error", "-m", "fencing", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    try:
        text, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                text = ""
            published = _sample(
                text, "fencing_relay_rows_total", 'queue="celery",result="published"'
            )
            if published == 5.0 and _sample(text, "fencing_outbox_pending", 'store="sqlite"') == 0:
                break
            assert relay.poll() is None, relay.communicate()
            time.sleep(0.05)
        assert _sample(text, "fencing_relay_rows_total", 'queue="celery",result="published"') == 5
        assert _sample(text, "fencing_relay_rows_total", 'queue="celery",result="failed"') == 0
        assert _sample(text, "fencing_outbox_dead", 'store="sqlite"') == 0
    finally:
        relay.send_signal(signal.SIGTERM)
        out, err = relay.communicate(timeout=60)
    assert relay.returncode == 0, err
    assert "published 5 row(s)" in out
