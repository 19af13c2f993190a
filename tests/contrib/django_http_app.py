"""A Django app serving the routes of tests/contrib/test_http_servers.py through
fencing.contrib.django.http, run as its own process (the test process never configures
Django): ``python -m tests.contrib.django_http_app STORE_URL MODE``, MODE one of ``sync``
(plain Django views behind a threaded WSGI server), ``async`` (``async def`` views on an
async store, Django's ASGI handler under uvicorn) and ``drf`` (Django REST Framework
``APIView``s). It prints the port it listens on, then serves until killed."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from socketserver import ThreadingMixIn
from typing import Any, ClassVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.conf import settings

import django
import fencing
from tests.contrib.test_http_servers import routes

URL, MODE = sys.argv[1], sys.argv[2]

settings.configure(
    DEBUG=False,
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    SECRET_KEY="not-a-secret-tests-only",
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"]
    if MODE == "drf"
    else [],
    MIDDLEWARE=[],
    DATABASES={},
    USE_TZ=True,
    REST_FRAMEWORK={"UNAUTHENTICATED_USER": None, "DEFAULT_AUTHENTICATION_CLASSES": []},
)
django.setup()

from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from fencing.contrib.django import http as fhttp  # noqa: E402

ORDERS: dict[str, Any] = {}


def _sync_views() -> list[Any]:
    store = fencing.open(URL)
    orders = store.collection("orders")
    orders.create("o-1", {"status": "new"})
    orders.create("o-2", {"status": "new"})
    edit, shipping, noting = routes(orders)

    @csrf_exempt
    def order(request: Any, key: str) -> Any:
        if request.method == "GET":
            return fhttp.read(edit, request, key)
        return fhttp.write(edit, request, key)

    @csrf_exempt
    def ship(request: Any, key: str) -> Any:
        return fhttp.write(shipping, request, key)

    @csrf_exempt
    def note(request: Any, key: str) -> Any:
        return fhttp.write(noting, request, key)

    return [order, ship, note]


def _async_views() -> list[Any]:
    async def opened() -> Any:
        store = await fencing.open_async(URL)
        orders = store.collection("orders")
        await orders.create("o-1", {"status": "new"})
        await orders.create("o-2", {"status": "new"})
        return orders

    # the store belongs to the loop that serves the requests: opened on first use there
    lock = asyncio.Lock()

    async def orders() -> Any:
        async with lock:
            if "orders" not in ORDERS:
                ORDERS["orders"] = await opened()
        return ORDERS["orders"]

    edit, shipping, noting = routes(lambda: ORDERS["orders"])

    @csrf_exempt
    async def order(request: Any, key: str) -> Any:
        await orders()
        if request.method == "GET":
            return await fhttp.aread(edit, request, key)
        return await fhttp.awrite(edit, request, key)

    @csrf_exempt
    async def ship(request: Any, key: str) -> Any:
        await orders()
        return await fhttp.awrite(shipping, request, key)

    @csrf_exempt
    async def note(request: Any, key: str) -> Any:
        await orders()
        return await fhttp.awrite(noting, request, key)

    return [order, ship, note]


def _drf_views() -> list[Any]:
    from rest_framework.views import APIView

    store = fencing.open(URL)
    orders = store.collection("orders")
    orders.create("o-1", {"status": "new"})
    orders.create("o-2", {"status": "new"})
    edit, shipping, noting = routes(orders)

    class Order(APIView):
        permission_classes: ClassVar[list[Any]] = []

        def get(self, request: Any, key: str) -> Any:
            return fhttp.read(edit, request, key)

        def patch(self, request: Any, key: str) -> Any:
            return fhttp.write(edit, request, key)

    class Ship(APIView):
        permission_classes: ClassVar[list[Any]] = []

        def post(self, request: Any, key: str) -> Any:
            return fhttp.write(shipping, request, key)

    class Note(APIView):
        permission_classes: ClassVar[list[Any]] = []

        def put(self, request: Any, key: str) -> Any:
            return fhttp.write(noting, request, key)

    return [Order.as_view(), Ship.as_view(), Note.as_view()]


_order, _ship, _note = {"sync": _sync_views, "async": _async_views, "drf": _drf_views}[MODE]()
urlpatterns = [
    path("orders/<str:key>", _order),
    path("orders/<str:key>/ship", _ship),
    path("orders/<str:key>/note", _note),
]


class _Threaded(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    if MODE == "async":
        import uvicorn
        from django.core.asgi import get_asgi_application

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        print(sock.getsockname()[1], flush=True)
        config = uvicorn.Config(
            get_asgi_application(), log_level="warning", http="h11", ws="none", lifespan="off"
        )
        uvicorn.Server(config).run(sockets=[sock])
        return
    from django.core.wsgi import get_wsgi_application

    server = make_server(
        "127.0.0.1", 0, get_wsgi_application(), server_class=_Threaded, handler_class=_Quiet
    )
    print(server.server_port, flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
