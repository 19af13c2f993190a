"""Starlette and FastAPI endpoints over :class:`fencing.contrib.http.Conditional`, on a
sync store (run in Starlette's thread pool) or an async one (awaited on the loop).

Starlette::

    async def patch(request):
        return await write(edit, request, request.path_params["key"])

FastAPI, with the dependency::

    @app.patch("/orders/{key}")
    async def patch(key: str, edit: Annotated[Edit, Depends(conditional(orders_edit))]):
        return await edit(key)
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .._astore import AsyncCollection, AsyncTable
from .http import Answer, Conditional, problem

__all__ = ["Edit", "conditional", "read", "respond", "write"]


def respond(answer: Answer) -> Response:
    """A Starlette response for an :class:`~fencing.contrib.http.Answer`."""
    return Response(
        answer.content(),
        status_code=answer.status,
        headers=dict(answer.headers),
        media_type=None if answer.body is None else answer.media_type,
    )


def _is_async(cond: Conditional) -> bool:
    return isinstance(cond.target, AsyncCollection | AsyncTable)


async def request_body(request: Request) -> Any:
    """The request's JSON body (None when empty), or a 400 answer."""
    data = await request.body()
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return problem(400, "the body is not JSON")


class Edit:
    """A write request bound to its route's :class:`Conditional`: ``await edit(key)``
    commits and returns the response (what the :func:`conditional` dependency gives)."""

    __slots__ = ("body", "client", "cond", "idempotency_key", "if_match")

    def __init__(self, cond: Conditional, request: Request, body: Any, client: str | None) -> None:
        self.cond = cond
        self.if_match = request.headers.getlist("if-match")
        self.idempotency_key = request.headers.get("idempotency-key")
        self.body = body
        self.client = client

    async def __call__(self, key: str | int) -> Response:
        if isinstance(self.body, Answer):
            return respond(self.body)
        args: dict[str, Any] = {
            "if_match": self.if_match,
            "idempotency_key": self.idempotency_key,
            "body": self.body,
            "client": self.client,
        }
        if _is_async(self.cond):
            return respond(await self.cond.awrite(key, **args))
        return respond(await run_in_threadpool(lambda: self.cond.write(key, **args)))


def conditional(
    cond: Conditional, *, client: Callable[[Request], str | None] | None = None
) -> Callable[[Request], Awaitable[Edit]]:
    """A FastAPI dependency giving the route's :class:`Edit`; ``client(request)`` names
    the caller an idempotency key belongs to (e.g. the authenticated user)."""

    async def dependency(request: Request) -> Edit:
        who = None if client is None else client(request)
        return Edit(cond, request, await request_body(request), who)

    return dependency


async def write(
    cond: Conditional, request: Request, key: str | int, *, client: str | None = None
) -> Response:
    """Answer ``request`` as a conditional write of record ``key``."""
    return await Edit(cond, request, await request_body(request), client)(key)


async def read(cond: Conditional, request: Request, key: str | int) -> Response:
    """Answer ``request`` as a GET of record ``key`` (ETag, If-None-Match)."""
    tags = request.headers.get("if-none-match")
    if _is_async(cond):
        return respond(await cond.aget(key, if_none_match=tags))
    return respond(await run_in_threadpool(lambda: cond.get(key, if_none_match=tags)))
