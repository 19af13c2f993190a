"""HTTP conditional requests on fenced records: ``ETag``, ``If-Match``, ``412``, ``428``
and ``Idempotency-Key``, free of any web framework (``fencing.contrib.flask`` and
``fencing.contrib.starlette`` are thin drivers of it). Design notes: docs/http.md.

A record's version is its strong ETag, ``"v7"`` (signed with a :class:`fencing.Signer`
when one is given: ``"v7.<key id>.<mac>"``, bound to the record, so a client can only
send back a version it was served). A write names the version it was decided against in
``If-Match``; the helper turns it into an :class:`~fencing.Intent` at that version, for
the route's record and transition, and the store's conditional commit decides:

=========================  ===============================================================
outcome                    answer
=========================  ===============================================================
``Committed``/``Skipped``  200 with the representation and its ETag (204 with ``no_content``)
``Duplicate``              the first answer again (recomputed: see :meth:`Conditional.answer`)
``Stale``                  412 with the current representation and its ETag
``Missing``                404
``Fenced`` (newer owner)   409 with the current representation and its ETag
``Fenced`` (expired),      503 with ``Retry-After``: nothing was written and the same request
``Contended``              (same ``Idempotency-Key``) may simply be sent again later
no ``If-Match``            428 where the route requires one
=========================  ===============================================================
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._errors import (
    ConfigurationError,
    InvalidIdentifier,
    InvalidInput,
    InvalidState,
    TransientStoreError,
)
from .._policy import Drop, StalePolicy
from .._request import Target
from .._signing import Signer
from .._validate import check_key, check_name
from .._values import (
    MAX_VERSION,
    Committed,
    Contended,
    Duplicate,
    Fenced,
    FenceReason,
    Intent,
    Missing,
    Outcome,
    Record,
    Skipped,
    Stale,
)

__all__ = [
    "Answer",
    "BadRequest",
    "Conditional",
    "HeaderError",
    "IfMatch",
    "Plan",
    "parse_idempotency_key",
    "parse_if_match",
]

#: An ``Idempotency-Key`` longer than this is refused (400).
MAX_IDEMPOTENCY_KEY: Final = 255
#: An ``If-Match`` listing more entity-tags than this is refused (400): each is verified.
MAX_TAGS: Final = 64
PROBLEM: Final = "application/problem+json"
JSON: Final = "application/json"
_TAG = re.compile(r'(W/)?"([\x21\x23-\x7e\x80-\xff]*)"')
_VERSION = re.compile(r"v(0|[1-9][0-9]{0,18})")
_TOKEN = re.compile(r"[\x21\x23-\x2b\x2d-\x7e]+")  # a bare key: visible ASCII, no " or ,
_REASONS: Final = {
    200: "OK",
    204: "No Content",
    304: "Not Modified",
    400: "Bad Request",
    404: "Not Found",
    409: "Conflict",
    412: "Precondition Failed",
    428: "Precondition Required",
    503: "Service Unavailable",
}


class BadRequest(InvalidInput):
    """A request the client must change (answered 400); ``update`` may raise it."""


class HeaderError(BadRequest):
    """A malformed ``If-Match``, ``If-None-Match`` or ``Idempotency-Key``."""


# -- headers ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class IfMatch:
    """A parsed ``If-Match`` (RFC 9110, 13.1.1): ``*``, or entity-tags ``(weak, opaque)``."""

    any: bool = False
    tags: tuple[tuple[bool, str], ...] = ()


def parse_if_match(values: str | list[str] | None) -> IfMatch | None:
    """The header's value(s), or None when it is absent; :class:`HeaderError` if malformed.

    Several header lines are one comma-separated list; empty list elements are ignored.
    """
    if values is None or (isinstance(values, list) and not values):
        return None
    text = values if isinstance(values, str) else ",".join(values)
    if text.strip(" \t") == "*":
        return IfMatch(any=True)
    tags: list[tuple[bool, str]] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in " \t,":  # OWS and empty list elements
            pos += 1
        if pos == end:
            break
        found = _TAG.match(text, pos)
        if found is None:
            raise HeaderError(f"If-Match is not '*' or a list of entity-tags: {text[:80]!r}")
        tags.append((found.group(1) is not None, found.group(2)))
        if len(tags) > MAX_TAGS:
            raise HeaderError(f"If-Match lists more than {MAX_TAGS} entity-tags")
        pos = found.end()
        while pos < end and text[pos] in " \t":
            pos += 1
        if pos < end and text[pos] != ",":
            raise HeaderError(f"If-Match is not '*' or a list of entity-tags: {text[:80]!r}")
    if not tags:
        raise HeaderError("If-Match names no entity-tag")
    return IfMatch(tags=tuple(tags))


def parse_idempotency_key(value: str | None) -> str | None:
    """An ``Idempotency-Key`` (draft-ietf-httpapi-idempotency-key-header): a structured
    field String (``"8e03978e-..."``); a bare token (as many clients send it) is taken
    as it is. None when absent; :class:`HeaderError` if malformed, empty or too long."""
    if value is None:
        return None
    text = value.strip(" \t")
    if text.startswith('"'):
        out: list[str] = []
        i = 1
        while i < len(text):
            ch = text[i]
            if ch == "\\" and i + 1 < len(text) and text[i + 1] in '"\\':
                out.append(text[i + 1])
                i += 2
            elif ch == '"':
                break
            elif " " <= ch <= "~" and ch != "\\":
                out.append(ch)
                i += 1
            else:
                raise HeaderError("Idempotency-Key holds a character a String cannot")
        if i != len(text) - 1:
            raise HeaderError("Idempotency-Key is not one quoted String")
        key = "".join(out)
    elif _TOKEN.fullmatch(text):
        key = text
    else:
        raise HeaderError("Idempotency-Key must be a quoted String")
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise HeaderError(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters")
    return key


# -- answers ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP response to send: status, headers, and a JSON body (None: no body)."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: Any = None
    media_type: str = JSON

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def content(self) -> bytes:
        """The body as bytes (empty without a body): canonical JSON (sorted keys), so a
        record reads back as the same bytes whatever order its store keeps keys in."""
        if self.body is None:
            return b""
        text = json.dumps(self.body, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
        return text.encode()


def problem(status: int, detail: str, *headers: tuple[str, str]) -> Answer:
    """An RFC 9457 problem answer."""
    body = {"type": "about:blank", "title": _REASONS[status], "status": status, "detail": detail}
    return Answer(status, headers, body, PROBLEM)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a write request comes to before the store is asked: the intent to commit,
    or (``intent`` None) the versions to choose from once the record is read."""

    key: str | int
    body: Any
    intent: Intent | None
    intent_id: str | None  #: derived from the Idempotency-Key, or None (a fresh id)
    versions: frozenset[int] | None = None  #: If-Match lists these (None: '*' or none)
    client_version: bool = False  #: the version came from the client's If-Match


#: ``update(record, body)`` -> the record's new state (or ``fencing.SKIP``)
Update = Callable[[Record, Any], Any]


def _replace(record: Record, body: Any) -> Any:
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object (the record's new state)")
    return dict(body)


def _is_front(target: object) -> bool:
    return isinstance(getattr(target, "target", None), Target)


def _checked(target: Any) -> Any:
    if target.target.kind == "table" and target.target.version_column is None:
        raise ConfigurationError(
            f"table {target.name!r} has no version column: an ETag is a record's version"
        )
    return target


class Conditional:
    """One write route on a collection or table: its transition, how the body makes the
    new state, whether ``If-Match`` is required, and how a record is shown.

    ``target`` is a collection or table, or a function returning one, called on first
    use (an async store opened in the app's lifespan: ``lambda: app.state.orders``).
    ``update(record, body)`` returns the new state (default: the body replaces the
    state); ``represent(record)`` the JSON body of a 200/412 (default: the state);
    ``signer`` signs ETags; ``require`` answers 428 to a write without ``If-Match``;
    ``allow_any`` accepts ``If-Match: *`` (a write at whatever version is current: a
    blind write, refused with 428 by default); ``on_stale`` is the stale policy of a
    write whose version the server read (no ``If-Match``); ``no_content`` answers a
    commit 204 instead of 200; ``retry_after`` is the 503's ``Retry-After`` (seconds).
    """

    def __init__(
        self,
        target: Any,
        transition: str,
        *,
        update: Update | None = None,
        represent: Callable[[Record], Any] | None = None,
        signer: Signer | None = None,
        require: bool = True,
        allow_any: bool = False,
        on_stale: StalePolicy | None = None,
        no_content: bool = False,
        retry_after: int = 1,
    ) -> None:
        if signer is not None and not isinstance(signer, Signer):
            raise ConfigurationError(f"signer must be a fencing.Signer, not {type(signer)}")
        self._target: Any = None
        self._factory: Callable[[], Any] | None = None
        if _is_front(target):
            self._target = _checked(target)
        elif callable(target):
            self._factory = target
        else:
            raise ConfigurationError(
                "target must be a collection or table of a fencing store (or a function"
                " returning one)"
            )
        self.transition = check_name(transition, "transition")
        self.update: Update = update or _replace
        self.represent: Callable[[Record], Any] = represent or (lambda r: dict(r.state))
        self.signer = signer
        self.require = require
        self.allow_any = allow_any
        self.on_stale = on_stale
        self.no_content = no_content
        self.retry_after = retry_after

    @property
    def target(self) -> Any:
        """The collection or table written to (a factory given is called on first use)."""
        if self._target is None:
            assert self._factory is not None
            made = self._factory()
            if not _is_front(made):
                raise ConfigurationError(
                    f"the target function returned a {type(made).__name__}, not a collection"
                    " or table of a fencing store"
                )
            self._target = _checked(made)
        return self._target

    # -- ETags -------------------------------------------------------------------------
    def _signed_text(self, kind: str, name: str, key: str | int, version: int) -> str:
        return json.dumps([kind, name, key, version], separators=(",", ":"))

    def etag(self, record: Record) -> str:
        """The record's strong ETag, quoted, as the ``ETag`` header carries it."""
        return f'"{self._opaque(record.key, record.version)}"'

    def _opaque(self, key: str | int, version: int) -> str:
        if self.signer is None:
            return f"v{version}"
        text = self._signed_text(self.target.kind, self.target.name, key, version)
        return f"v{version}.{self.signer.sign_text('etag', text)}"

    def version_of(self, key: str | int, opaque: str) -> int | None:
        """The version an entity-tag's opaque part names for record ``key``, or None if
        it names none (not ours, or with a signer: unsigned, tampered, another record's)."""
        head, _, signature = opaque.partition(".")
        found = _VERSION.fullmatch(head)
        if found is None:
            return None
        version = int(found.group(1))
        if version > MAX_VERSION:
            return None
        if self.signer is None:
            return None if signature else version
        text = self._signed_text(self.target.kind, self.target.name, key, version)
        return version if self.signer.verify_text("etag", text, signature) else None

    def _no_such_key(self, key: object) -> Answer | None:
        """404 for a key no record of the target can have (the store would refuse it)."""
        try:
            check_key(key)
        except InvalidIdentifier:
            return problem(404, "no such record (not a record key)")
        if self.target.kind == "collection" and not isinstance(key, str):
            return problem(404, "no such record (a collection's keys are strings)")
        return None

    # -- reads -------------------------------------------------------------------------
    def shown(self, record: Record, status: int = 200) -> Answer:
        """The record's representation with its ETag."""
        tag = ("ETag", self.etag(record))
        if status == 204 or status == 304:
            return Answer(status, (tag,))
        return Answer(status, (tag,), self.represent(record))

    def read(self, record: Record | None, key: object, if_none_match: str | None = None) -> Answer:
        """The answer to a GET: 200 with the ETag, 304 when ``If-None-Match`` names the
        current version (weak comparison), 404 without a record."""
        if record is None:
            return problem(404, f"no record {key!r}")
        try:
            cond = parse_if_match(if_none_match)
        except HeaderError as exc:
            return problem(400, str(exc).replace("If-Match", "If-None-Match"))
        if cond is not None and (
            cond.any or any(self.version_of(record.key, o) == record.version for _, o in cond.tags)
        ):
            return self.shown(record, 304)
        return self.shown(record)

    # -- writes ------------------------------------------------------------------------
    def plan(
        self,
        key: str | int,
        *,
        if_match: str | list[str] | None,
        idempotency_key: str | None = None,
        body: Any = None,
        client: str | None = None,
    ) -> Plan | Answer:
        """A write request's plan, or the answer that ends it before the store: 400 for
        a malformed header, 404 for a key no record can have, 428 without a version
        where one is required. A plan without an intent is resolved (:meth:`resolve`) once the
        record is read (for ``*``, no ``If-Match``, several versions, or none: all the
        listed tags weak, unsigned, tampered or another record's).

        ``client`` scopes the idempotency key (e.g. the authenticated user): two clients
        that chose the same key are not each other's duplicates."""
        refused = self._no_such_key(key)
        if refused is not None:
            return refused
        try:
            cond = parse_if_match(if_match)
            idem = parse_idempotency_key(idempotency_key)
        except HeaderError as exc:
            return problem(400, str(exc))
        intent_id = None if idem is None else self.intent_id(key, idem, body, client)
        if cond is None or cond.any:
            if cond is None and self.require:
                return problem(428, "this write needs If-Match: the ETag you last read")
            if cond is not None and not self.allow_any:
                return problem(428, "If-Match: * names no version: send the ETag you last read")
            return Plan(key, body, None, intent_id)
        # strong comparison: a weak tag never matches (RFC 9110, 8.8.3.2)
        found = {self.version_of(key, opaque) for weak, opaque in cond.tags if not weak}
        versions = frozenset(v for v in found if v is not None)
        if not versions:
            return Plan(key, body, None, intent_id, frozenset(), client_version=True)
        if len(versions) > 1:
            return Plan(key, body, None, intent_id, versions, client_version=True)
        intent = self._intent(key, next(iter(versions)), intent_id)
        return Plan(key, body, intent, intent_id, versions, client_version=True)

    def intent_id(self, key: str | int, idempotency_key: str, body: Any, client: str | None) -> str:
        """The intent id an idempotency key names: a digest of the key with the route's
        record and transition, the client, and the body (canonical JSON), so that the
        same key sent with another body, to another record or action, or by another
        client is other work, never its duplicate."""
        try:
            payload = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"the body is not JSON: {exc}") from None
        what = [self.target.kind, self.target.name, key, self.transition, client, idempotency_key]
        text = json.dumps([*what, payload], separators=(",", ":"), ensure_ascii=False)
        return "http." + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:40]

    def _intent(self, key: str | int, version: int, intent_id: str | None) -> Intent:
        fresh = Intent.new(self.target.name, key, version, self.transition, kind=self.target.kind)
        return fresh if intent_id is None else dataclasses.replace(fresh, id=intent_id)

    def resolve(self, plan: Plan, record: Record | None) -> Plan | Answer:
        """A plan without an intent, given the record as read now: 404 without it; else
        the intent at its version (``*``, no If-Match, or a listed version that is the
        current one), or at a listed version, for the store to answer Stale (412) or,
        for a retry of work already done, Duplicate."""
        if record is None:
            return problem(404, f"no record {plan.key!r}")
        version = record.version
        if plan.versions is not None and version not in plan.versions:
            if not plan.versions:
                return self.shown(record, 412)
            version = max(plan.versions)
        intent = self._intent(plan.key, version, plan.intent_id)
        return dataclasses.replace(plan, intent=intent)

    def policy(self, plan: Plan) -> StalePolicy:
        """The client's version is final (Drop); a version the server read follows ``on_stale``."""
        return Drop() if plan.client_version or self.on_stale is None else self.on_stale

    def decide(self, plan: Plan) -> Callable[[Record], Any]:
        return lambda record: self.update(record, plan.body)

    def answer(self, outcome: Outcome, plan: Plan) -> Answer:
        """The response to a write's outcome.

        ``Duplicate`` is answered from the record, not from a stored copy: a commit
        moves the version by exactly one, so the first answer was the record at the
        intent's version + 1. While the record is still there (a client retrying after
        a lost response), the answer is the first one, byte for byte; a 204 route's
        always is. After a later write, a 200 route answers with the current
        representation and its ETag, as a GET would (see docs/http.md)."""
        ok = 204 if self.no_content else 200
        match outcome:
            case Committed(record) | Skipped(record) if record is not None:
                return self.shown(record, ok)
            case Duplicate(record):
                produced = None  # known when the client named one version only
                if plan.versions is not None and len(plan.versions) == 1:
                    produced = next(iter(plan.versions)) + 1
                if ok == 204 and produced is not None:
                    return Answer(204, (("ETag", f'"{self._opaque(record.key, produced)}"'),))
                return self.shown(record, ok)
            case Stale(current):
                return self.shown(current, 412)
            case Missing():
                return problem(404, f"no record {plan.key!r}")
            case Fenced(current, FenceReason.NEWER_OWNER):
                return self.shown(current, 409)
            case Fenced() | Contended():
                wait = ("Retry-After", str(self.retry_after))
                return problem(503, f"the write was not applied ({outcome.kind}): retry", wait)
            case _:  # Skipped without a record: nothing to show
                return problem(404, f"no record {plan.key!r}")

    def failed(self, exc: Exception) -> Answer:
        """The answer to a write that raised: 400 for a request the client must change
        (:class:`BadRequest` from ``update``, a state the store refuses), 503 for a
        store error whose outcome is unknown (the same request, same Idempotency-Key,
        is answered ``Duplicate`` if it landed); anything else is raised again."""
        if isinstance(exc, BadRequest | InvalidState):
            return problem(400, str(exc))
        if isinstance(exc, TransientStoreError):
            wait = ("Retry-After", str(self.retry_after))
            return problem(503, "the store did not answer: send the same request again", wait)
        raise exc

    # -- drivers -----------------------------------------------------------------------
    def write(
        self,
        key: str | int,
        *,
        if_match: str | list[str] | None,
        idempotency_key: str | None = None,
        body: Any = None,
        client: str | None = None,
    ) -> Answer:
        """Plan, read if needed, apply, answer: on a sync store."""
        step = self.plan(
            key, if_match=if_match, idempotency_key=idempotency_key, body=body, client=client
        )
        if isinstance(step, Plan) and step.intent is None:
            step = self.resolve(step, self.target.get(key))
        if isinstance(step, Answer):
            return step
        assert step.intent is not None
        try:
            outcome = self.target.apply(step.intent, self.decide(step), on_stale=self.policy(step))
        except Exception as exc:
            return self.failed(exc)
        return self.answer(outcome, step)

    async def awrite(
        self,
        key: str | int,
        *,
        if_match: str | list[str] | None,
        idempotency_key: str | None = None,
        body: Any = None,
        client: str | None = None,
    ) -> Answer:
        """:meth:`write` on an async store."""
        step = self.plan(
            key, if_match=if_match, idempotency_key=idempotency_key, body=body, client=client
        )
        if isinstance(step, Plan) and step.intent is None:
            step = self.resolve(step, await self.target.get(key))
        if isinstance(step, Answer):
            return step
        assert step.intent is not None
        decide = self.decide(step)
        try:
            outcome = await self.target.apply(step.intent, decide, on_stale=self.policy(step))
        except Exception as exc:
            return self.failed(exc)
        return self.answer(outcome, step)

    def get(self, key: str | int, *, if_none_match: str | None = None) -> Answer:
        """The answer to a GET of record ``key``, on a sync store."""
        refused = self._no_such_key(key)
        if refused is not None:
            return refused
        return self.read(self.target.get(key), key, if_none_match)

    async def aget(self, key: str | int, *, if_none_match: str | None = None) -> Answer:
        """:meth:`get` on an async store."""
        refused = self._no_such_key(key)
        if refused is not None:
            return refused
        return self.read(await self.target.get(key), key, if_none_match)
