"""Django views (and Django REST Framework views) over
:class:`fencing.contrib.http.Conditional`: a record's version as its ETag, ``If-Match``
into an intent at that version, ``412`` with the current representation on ``Stale``,
``428`` without a precondition, ``Idempotency-Key`` into the intent's id (docs/http.md).

    from fencing.contrib.django.http import read, write

    def order(request, key):
        if request.method == "GET":
            return read(edit, request, key)
        return write(edit, request, key)

A sync store in a sync view (Django runs it in a thread); an async store in an ``async
def`` view with :func:`aread` / :func:`awrite`. In a DRF ``APIView`` the same functions
take DRF's ``Request`` (its parsed ``request.data`` is the body) and return a plain
``HttpResponse``, which DRF passes through.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse

from ..http import Answer, Conditional, problem

__all__ = ["aread", "awrite", "read", "request_body", "respond", "write"]


def respond(answer: Answer) -> HttpResponse:
    """A Django response for an :class:`~fencing.contrib.http.Answer`."""
    response = HttpResponse(
        answer.content(),
        status=answer.status,
        content_type=None if answer.body is None else answer.media_type,
    )
    if answer.body is None:
        del response["Content-Type"]
    for name, value in answer.headers:
        response[name] = value
    return response


def request_body(request: Any) -> Any:
    """The request's JSON body (None when empty), or a 400 answer. A DRF ``Request``'s
    body is what its parsers made of it (``request.data``); a Django ``HttpRequest``'s is
    read as JSON."""
    if not isinstance(request, HttpRequest) and hasattr(request, "data"):
        if not _carries_body(request):
            return None
        try:
            data = request.data
        except Exception as exc:  # DRF's ParseError, UnsupportedMediaType: the client's
            if not type(exc).__module__.startswith("rest_framework"):
                raise
            return problem(400, f"the body could not be read: {exc}")
        return _plain(data)
    raw = request.body
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return problem(400, "the body is not JSON")


def _carries_body(request: Any) -> bool:
    """Whether the request carried a body at all (DRF parses an empty one to ``{}``)."""
    length = request.META.get("CONTENT_LENGTH") or "0"
    return length.strip() not in ("", "0")


def _plain(data: Any) -> Any:
    """DRF's QueryDict (a form post) as a plain dict; JSON's data as it is."""
    if hasattr(data, "dict") and callable(data.dict):
        return data.dict()
    return data


def _headers(request: Any) -> tuple[str | None, str | None]:
    """``If-Match`` (a WSGI/ASGI server joins repeated header lines with commas) and
    ``Idempotency-Key``."""
    return request.headers.get("If-Match"), request.headers.get("Idempotency-Key")


def write(
    cond: Conditional, request: Any, key: str | int, *, client: str | None = None
) -> HttpResponse:
    """Answer ``request`` as a conditional write of record ``key`` (a sync store)."""
    body = request_body(request)
    if isinstance(body, Answer):
        return respond(body)
    if_match, idempotency_key = _headers(request)
    answer = cond.write(
        key, if_match=if_match, idempotency_key=idempotency_key, body=body, client=client
    )
    return respond(answer)


async def awrite(
    cond: Conditional, request: Any, key: str | int, *, client: str | None = None
) -> HttpResponse:
    """:func:`write` in an ``async def`` view, on an async store."""
    body = request_body(request)
    if isinstance(body, Answer):
        return respond(body)
    if_match, idempotency_key = _headers(request)
    answer = await cond.awrite(
        key, if_match=if_match, idempotency_key=idempotency_key, body=body, client=client
    )
    return respond(answer)


def read(cond: Conditional, request: Any, key: str | int) -> HttpResponse:
    """Answer ``request`` as a GET of record ``key`` (ETag, If-None-Match)."""
    return respond(cond.get(key, if_none_match=request.headers.get("If-None-Match")))


async def aread(cond: Conditional, request: Any, key: str | int) -> HttpResponse:
    """:func:`read` in an ``async def`` view, on an async store."""
    return respond(await cond.aget(key, if_none_match=request.headers.get("If-None-Match")))
