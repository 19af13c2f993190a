"""HTTP conditional requests through real servers (issue 22, item 3): a FastAPI app served
by uvicorn (an async store opened in the app's lifespan on the server's loop, or a sync
store in Starlette's thread pool) and a Flask app served by werkzeug's server, each in a
thread on a free port, driven by httpx over TCP, on a SQLite file and on PostgreSQL."""

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest

import fencing

httpx = pytest.importorskip("httpx", reason="pip install 'fencing[http-tests]'")
flask = pytest.importorskip("flask", reason="pip install 'fencing[flask]'")
fastapi = pytest.importorskip("fastapi", reason="pip install 'fencing[fastapi]'")
uvicorn = pytest.importorskip("uvicorn", reason="pip install 'fencing[http-tests]'")

from fastapi import Depends, FastAPI, Request  # noqa: E402

from fencing.contrib import flask as fflask  # noqa: E402
from fencing.contrib import starlette as fstar  # noqa: E402
from fencing.contrib.http import Conditional  # noqa: E402

pytestmark = pytest.mark.backends(only=lambda n: n in {"sqlite-file", "postgresql"})

ROOT = Path(__file__).resolve().parents[2]
SIGNER = fencing.Signer({"k1": secrets.token_bytes(32)}, current="k1")


def merge(record: fencing.Record, body: Any) -> dict[str, Any]:
    return {**record.state, **body}


def ship(record: fencing.Record, body: Any) -> dict[str, Any]:
    """Counts its runs in the state: a second application would show."""
    return {**record.state, "status": "shipped", "ships": record.state.get("ships", 0) + 1}


def routes(orders: Any) -> tuple[Conditional, Conditional, Conditional]:
    edit = Conditional(orders, "edit", update=merge, signer=SIGNER)
    shipping = Conditional(orders, "ship", update=ship, signer=SIGNER)
    noting = Conditional(orders, "note", update=merge, signer=SIGNER, no_content=True)
    return edit, shipping, noting


# -- the servers -----------------------------------------------------------------------
def _listening() -> socket.socket:
    """A socket listening on a free port: a client may connect before the server runs
    (the connection waits in the backlog), so no test waits for a server to start."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def fastapi_app(
    edit: Conditional, shipping: Conditional, noting: Conditional, lifespan: Any = None
) -> Any:
    app = FastAPI(lifespan=lifespan)

    @app.get("/orders/{key}")
    async def show(key: str, request: Request) -> Any:
        return await fstar.read(edit, request, key)

    @app.patch("/orders/{key}")
    async def patch(
        key: str, write: Annotated[fstar.Edit, Depends(fstar.conditional(edit))]
    ) -> Any:
        return await write(key)

    @app.post("/orders/{key}/ship")
    async def post(key: str, request: Request) -> Any:
        return await fstar.write(shipping, request, key)

    @app.put("/orders/{key}/note")
    async def put(key: str, request: Request) -> Any:
        return await fstar.write(noting, request, key)

    return app


def flask_app(edit: Conditional, shipping: Conditional, noting: Conditional) -> Any:
    app = flask.Flask("orders")

    @app.get("/orders/<key>")
    def show(key: str) -> Any:
        return fflask.read(edit, key)

    @app.patch("/orders/<key>")
    def patch(key: str) -> Any:
        return fflask.write(edit, key)

    @app.post("/orders/<key>/ship")
    def post(key: str) -> Any:
        return fflask.write(shipping, key)

    @app.put("/orders/<key>/note")
    def put(key: str) -> Any:
        return fflask.write(noting, key)

    return app


def serve_uvicorn(url: str, api: str) -> Iterator[str]:
    if api == "async":  # opened on the server's loop, in the app's lifespan, as apps do

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            store = await fencing.open_async(url)
            orders = store.collection("orders")
            await orders.create("o-1", {"status": "new"})
            await orders.create("o-2", {"status": "new"})
            app.state.orders = orders
            yield
            await store.close()

        app = fastapi_app(*routes(lambda: app.state.orders), lifespan=lifespan)
        sync_store = None
    else:  # a sync store: the helpers run it in Starlette's thread pool
        sync_store = fencing.open(url)
        sync_store.collection("orders").create("o-1", {"status": "new"})
        sync_store.collection("orders").create("o-2", {"status": "new"})
        app = fastapi_app(*routes(sync_store.collection("orders")))
    config = uvicorn.Config(app, log_level="warning", http="h11", ws="none")
    server = uvicorn.Server(config)
    sock = _listening()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
        if sync_store is not None:
            sync_store.close()


def serve_flask(url: str) -> Iterator[str]:
    from werkzeug.serving import make_server

    store = fencing.open(url)
    store.collection("orders").create("o-1", {"status": "new"})
    store.collection("orders").create("o-2", {"status": "new"})
    app = flask_app(*routes(store.collection("orders")))
    server = make_server("127.0.0.1", 0, app, threaded=True)  # listening once made
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
        store.close()


def serve_django(url: str, mode: str) -> Iterator[str]:
    """Django views (``sync``, ``async``) or DRF ``APIView``s (``drf``) over
    fencing.contrib.django.http, in a process of their own (tests/contrib/django_http_app.py:
    this process never configures Django)."""
    pytest.importorskip("django", reason="pip install 'fencing[django]'")
    if mode == "drf":
        pytest.importorskip("rest_framework", reason="pip install 'fencing[drf]'")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(ROOT),
            *(str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p),
        ]
    )
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.Popen(
        [sys.executable, "-W", "error", "-m", "tests.contrib.django_http_app", url, mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        assert port.isdigit(), f"the Django server did not start (exit {proc.poll()})"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close() if proc.stdout else None


SERVERS = ["fastapi-async", "fastapi-sync", "flask", "django-sync", "django-async", "drf"]


@pytest.fixture(params=SERVERS)
def base(request: pytest.FixtureRequest, store_url: str) -> Iterator[str]:
    """The base URL of a server over a fresh store holding orders o-1 and o-2."""
    if request.param == "flask":
        yield from serve_flask(store_url)
    elif request.param == "drf":
        yield from serve_django(store_url, "drf")
    elif request.param.startswith("django"):
        yield from serve_django(store_url, request.param.split("-")[1])
    else:
        yield from serve_uvicorn(store_url, request.param.split("-")[1])


@pytest.fixture
def client(base: str) -> Iterator[Any]:
    with httpx.Client(base_url=base, timeout=30) as c:
        yield c


def both(first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
    """Run two requests at once (each on its own thread and connection, released together)."""
    gate = threading.Barrier(2)
    results: list[Any] = [None, None]

    def run(i: int, call: Callable[[], Any]) -> None:
        gate.wait()
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results[0], results[1]


# -- the tests -------------------------------------------------------------------------
def test_two_concurrent_edits_one_commits_the_other_gets_412_with_the_current(
    client: Any, base: str
) -> None:
    seen = client.get("/orders/o-1")
    assert seen.status_code == 200 and seen.json() == {"status": "new"}
    tag = seen.headers["etag"]

    def edit(status: str) -> Callable[[], Any]:
        def call() -> Any:
            with httpx.Client(base_url=base, timeout=30) as own:
                return own.patch("/orders/o-1", json={"status": status}, headers={"If-Match": tag})

        return call

    a, b = both(edit("packed"), edit("cancelled"))
    assert sorted([a.status_code, b.status_code]) == [200, 412]
    won, lost = (a, b) if a.status_code == 200 else (b, a)
    # the loser is shown what won, with the ETag to decide again against
    assert lost.json() == won.json() and lost.headers["etag"] == won.headers["etag"]
    now = client.get("/orders/o-1")
    assert now.json() == won.json() and now.headers["etag"] == won.headers["etag"]
    assert now.headers["etag"].startswith('"v2.k1.')
    # deciding again against that ETag commits
    again = client.patch(
        "/orders/o-1", json={"note": "x"}, headers={"If-Match": lost.headers["etag"]}
    )
    assert again.status_code == 200 and again.json() == {**won.json(), "note": "x"}


def test_a_retried_post_with_the_same_idempotency_key_is_applied_once_and_answered_alike(
    client: Any,
) -> None:
    tag = client.get("/orders/o-1").headers["etag"]
    headers = {"If-Match": tag, "Idempotency-Key": '"ship-7f3a"'}
    first = client.post("/orders/o-1/ship", json={"carrier": "dhl"}, headers=headers)
    retried = client.post("/orders/o-1/ship", json={"carrier": "dhl"}, headers=headers)
    assert first.status_code == retried.status_code == 200
    assert first.json() == {"status": "shipped", "ships": 1}
    assert retried.content == first.content and retried.headers["etag"] == first.headers["etag"]
    assert client.get("/orders/o-1").headers["etag"] == first.headers["etag"]  # applied once
    # the same key with another body is other work: never served as this one's duplicate
    other = client.post("/orders/o-1/ship", json={"carrier": "ups"}, headers=headers)
    assert other.status_code == 412 and other.json() == {"status": "shipped", "ships": 1}
    # without the key a retry is not recognised: refused, as stale, never applied twice
    bare = client.post("/orders/o-1/ship", json={"carrier": "dhl"}, headers={"If-Match": tag})
    assert bare.status_code == 412 and bare.json()["ships"] == 1


def test_a_patch_sent_twice_at_once_with_one_key_is_applied_once(client: Any, base: str) -> None:
    tag = client.get("/orders/o-2").headers["etag"]
    headers = {"If-Match": tag, "Idempotency-Key": "patch-1"}  # a bare token is taken too

    def send() -> Any:
        with httpx.Client(base_url=base, timeout=30) as own:
            return own.patch("/orders/o-2", json={"note": "gift"}, headers=headers)

    a, b = both(send, send)
    assert a.status_code == b.status_code == 200 and a.content == b.content
    assert a.json() == {"status": "new", "note": "gift"}
    now = client.get("/orders/o-2").headers["etag"]
    assert now == a.headers["etag"] == b.headers["etag"] and now.startswith('"v2.')  # once


def test_a_204_retried_after_a_later_write_is_answered_exactly_alike(client: Any) -> None:
    tag = client.get("/orders/o-1").headers["etag"]
    headers = {"If-Match": tag, "Idempotency-Key": '"note-1"'}
    first = client.put("/orders/o-1/note", json={"note": "gift"}, headers=headers)
    assert first.status_code == 204 and first.content == b"" and first.headers["etag"] != tag
    later = client.patch(
        "/orders/o-1", json={"status": "packed"}, headers={"If-Match": first.headers["etag"]}
    )
    assert later.status_code == 200
    retried = client.put("/orders/o-1/note", json={"note": "gift"}, headers=headers)
    assert retried.status_code == 204 and retried.content == b""
    assert retried.headers["etag"] == first.headers["etag"]  # the version it made
    now = client.get("/orders/o-1")
    assert now.json() == {"status": "packed", "note": "gift"}
    assert now.headers["etag"] == later.headers["etag"]  # the retry wrote nothing


def test_a_write_without_if_match_is_refused_with_428_and_writes_nothing(client: Any) -> None:
    answer = client.patch("/orders/o-1", json={"status": "blind"})
    assert answer.status_code == 428
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["status"] == 428
    star = client.patch("/orders/o-1", json={"status": "blind"}, headers={"If-Match": "*"})
    assert star.status_code == 428
    assert client.get("/orders/o-1").json() == {"status": "new"}


def test_a_tampered_or_foreign_etag_is_answered_412_with_the_current(client: Any) -> None:
    tag = client.get("/orders/o-1").headers["etag"]
    other = client.get("/orders/o-2").headers["etag"]  # o-2's, at the same version
    tampered = tag.replace('"v1.', '"v9.')
    for forged in (tampered, '"v1"', other, "W/" + tag):
        answer = client.patch("/orders/o-1", json={"status": "x"}, headers={"If-Match": forged})
        assert answer.status_code == 412, forged
        assert answer.json() == {"status": "new"} and answer.headers["etag"] == tag
    # a list matches when one of its tags does
    listed = client.patch(
        "/orders/o-1", json={"status": "x"}, headers={"If-Match": f"{other}, {tag}"}
    )
    assert listed.status_code == 200
    # and so does a list over several header lines
    now = listed.headers["etag"]
    lines = [("If-Match", other), ("If-Match", now)]
    assert client.patch("/orders/o-1", json={"n": 1}, headers=lines).status_code == 200
    assert client.patch("/orders/o-1", json={}, headers={"If-Match": "v1"}).status_code == 400


def test_missing_records_and_unchanged_reads(client: Any) -> None:
    tag = client.get("/orders/o-1").headers["etag"]
    assert client.get("/orders/nope").status_code == 404
    assert client.patch("/orders/nope", json={}, headers={"If-Match": tag}).status_code == 404
    cached = client.get("/orders/o-1", headers={"If-None-Match": tag})
    assert cached.status_code == 304 and cached.headers["etag"] == tag and cached.content == b""
