"""The reports in a real browser: headless Chromium opens `fencing demo --report` and
`fencing bench --report` pages, takes a screenshot, and dumps the DOM it built.

The screenshot is decoded here (zlib and struct: no image library) and checked for
its size and for the colours that only the drawn verdict, lanes and marks have.
Skips when Chromium is not installed; fails instead when ``CI`` is set (.ci/run
installs the distribution's ``chromium`` package).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from fencing._cli import main

from ._backends import CI

WINDOW = (1400, 1000)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = os.environ.get("FENCING_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(found, os.X_OK):
        message = "Chromium is not installed (apt-get install chromium)"
        if CI:
            pytest.fail(f"{message}, and CI is set: the browser tests must run in CI")
        pytest.skip(message)
    return found


def browse(chromium: str, page: Path, tmp: Path, *action: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            *action,
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def screenshot(chromium: str, page: Path, tmp: Path) -> tuple[int, int, set[bytes]]:
    png = tmp / f"{page.stem}.png"
    done = browse(chromium, page, tmp, f"--screenshot={png}")
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    return decode_png(png.read_bytes())


def dom(chromium: str, page: Path, tmp: Path) -> str:
    done = browse(chromium, page, tmp, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def decode_png(data: bytes) -> tuple[int, int, set[bytes]]:
    """Width, height and the set of RGB colours of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour in (2, 6), header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    at = 0
    for _ in range(height):
        kind, line = raw[at], bytearray(raw[at + 1 : at + 1 + stride])
        at += 1 + stride
        if kind == 1:
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 255
        elif kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev, strict=True))
        elif kind == 3:
            for x in range(stride):
                left = line[x - bpp] if x >= bpp else 0
                line[x] = (line[x] + ((left + prev[x]) >> 1)) & 255
        elif kind == 4:
            for x in range(stride):
                a = line[x - bpp] if x >= bpp else 0
                b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(bytes(line[x : x + 3]) for x in range(0, stride, bpp))
        prev = line
    return width, height, colours


def rgb(code: str) -> bytes:
    return bytes.fromhex(code.lstrip("#"))


def test_the_race_report_in_chromium(
    chromium: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "race.html"
    code = main(["demo", "--json", "--tasks", "120", "--report", str(page)])
    assert code == 0 and json.loads(capsys.readouterr().out)["ok"]

    width, height, colours = screenshot(chromium, page, tmp_path)
    assert (width, height) == WINDOW
    assert len(colours) > 200, f"a nearly blank screenshot: {len(colours)} colours"
    seen = {
        "the fencing verdict (PASS box)": "#e8f5e9",
        "the naive verdict (FAIL box) and lane": "#fdecea",
        "the fencing lane": "#eef5ee",
        "a naive stale write": "#d32f2f",
        "a fencing commit": "#2e7d32",
        "a naive commit": "#607d8b",
    }
    missing = [what for what, colour in seen.items() if rgb(colour) not in colours]
    assert missing == [], f"not on the screenshot: {missing}"

    built = dom(chromium, page, tmp_path)
    assert 'id="verdict" data-ok="true"' in built
    assert "naive read-modify-write: FAIL" in built and "fencing: PASS, no anomaly" in built
    assert built.count('data-lane="naive"') == built.count('data-lane="fencing"') >= 4
    assert 'id="legend"' in built and "<script" not in built


def test_the_bench_report_in_chromium(
    chromium: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "bench.html"
    code = main(["bench", "--quick", "--only", "commit", "--json", "--report", str(page)])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0
    pairs = [r for r in rows if r["kind"] == "pair"]

    width, height, colours = screenshot(chromium, page, tmp_path)
    assert (width, height) == WINDOW
    assert len(colours) > 100, f"a nearly blank screenshot: {len(colours)} colours"
    seen = {
        "the quick run's warning": "#fdecea",
        "sqlite FULL's ratio bars": "#1565c0",
        "sqlite NORMAL's ratio bars": "#2e7d32",
        "fencing's latency boxes": "#80cbc4",
        "hand-written latency boxes": "#cfd8dc",
    }
    missing = [what for what, colour in seen.items() if rgb(colour) not in colours]
    assert missing == [], f"not on the screenshot: {missing}"

    built = dom(chromium, page, tmp_path)
    assert built.count('<g class="ratio">') == len(pairs)
    assert built.count('<g class="latency fencing">') == len(pairs)
    assert built.count('<g class="latency baseline">') == len(pairs)
    assert 'id="ratios"' in built and 'id="latencies"' in built
