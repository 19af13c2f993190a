"""Flask views over :class:`fencing.contrib.http.Conditional` (sync stores: a Flask
view runs in a thread of the server; an async store belongs to one event loop).

    from fencing.contrib.flask import read, write

    @app.get("/orders/<key>")
    def show(key):
        return read(edit, key)

    @app.patch("/orders/<key>")
    def patch(key):
        return write(edit, key)
"""

from __future__ import annotations

import json
from typing import Any

from flask import Response, request

from .http import Answer, Conditional, problem

__all__ = ["read", "respond", "write"]


def respond(answer: Answer) -> Response:
    """A Flask response for an :class:`~fencing.contrib.http.Answer`."""
    return Response(
        answer.content(),
        status=answer.status,
        headers=list(answer.headers),
        mimetype=None if answer.body is None else answer.media_type,
    )


def request_body() -> Any:
    """The request's JSON body (None when empty), or a 400 answer."""
    data = request.get_data(cache=True)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return problem(400, "the body is not JSON")


def write(cond: Conditional, key: str | int, *, client: str | None = None) -> Response:
    """Answer the current request as a conditional write of record ``key``."""
    body = request_body()
    if isinstance(body, Answer):
        return respond(body)
    answer = cond.write(
        key,
        if_match=request.headers.getlist("If-Match"),
        idempotency_key=request.headers.get("Idempotency-Key"),
        body=body,
        client=client,
    )
    return respond(answer)


def read(cond: Conditional, key: str | int) -> Response:
    """Answer the current request as a GET of record ``key`` (ETag, If-None-Match)."""
    return respond(cond.get(key, if_none_match=request.headers.get("If-None-Match")))
