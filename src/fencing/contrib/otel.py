"""OpenTelemetry traces of fencing's operations (the ``otel`` extra: ``opentelemetry-api``
only; bring your own SDK): see docs/observability.md.

``enable()`` makes a span per commit, apply and lease operation (``db.system``,
``db.operation.name``, ``db.collection.name`` and fencing's ``fencing.*`` attributes),
a child of the span current where the operation ran. With ``propagate=True`` (the
default) every intent made while a span is current carries that span's context
(``Intent.trace``, a W3C traceparent, in format 3 of the intent's JSON), and the span
of the operation that judges the intent, in whatever worker, links to it.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from .._errors import MissingDependency
from .._observe import HUB, Event, add_observer, remove_observer

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(
        f"fencing.contrib.otel needs {exc.name}: pip install 'fencing[otel]'"
    ) from exc

__all__ = ["Tracing", "current_traceparent", "disable", "enable"]

#: ``db.system`` of each store scheme (OpenTelemetry's semantic conventions)
DB_SYSTEM: Final = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mariadb",
    "redis": "redis",
    "rediss": "redis",
    "sqlite": "sqlite",
    "memory": "other_sql",
}


def current_traceparent() -> str | None:
    """The W3C traceparent of the span current here, or None when there is none."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _linked(traceparent: str) -> Link:
    _, trace_id, span_id, flags = traceparent.split("-")
    context = SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))
    )
    return Link(context, {"fencing.link": "decided"})


class Tracing:
    """The observer that makes the spans (``enable`` makes it)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.tracer = trace.get_tracer("fencing", tracer_provider=tracer_provider)

    def observe(self, event: Event) -> None:
        if event.started_ns is None or event.seconds is None:
            return  # switched on while the operation ran
        attributes: dict[str, Any] = {
            "db.system": DB_SYSTEM.get(event.store, event.store),
            "db.operation.name": event.op,
            "db.collection.name": event.name,
            "fencing.outcome": event.outcome,
        }
        optional = {
            "fencing.key": event.key,
            "fencing.expected_version": event.expected_version,
            "fencing.current_version": event.current_version,
            "fencing.intent_id": event.intent_id,
            "fencing.lease_token": event.token,
            "fencing.fence_reason": event.fence_reason,  # newer_owner or expired
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        if event.kind == "lease":
            attributes["fencing.lease_name"] = event.name
            if event.waits:
                attributes["fencing.lease_waits"] = event.waits
        # a span name stays low-cardinality: a lease name is per record by default, so it
        # is an attribute only; a collection or table name is bounded
        name = event.op if event.kind == "lease" else f"{event.op} {event.name}"
        links = [] if event.trace is None else [_linked(event.trace)]
        span = self.tracer.start_span(
            name,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=links,
            start_time=event.started_ns,
        )
        span.end(end_time=event.started_ns + int(event.seconds * 1e9))


_lock = threading.Lock()
_on: list[Tracing] = []


def enable(tracer_provider: Any = None, *, propagate: bool = True) -> Tracing:
    """Make spans from now on (``tracer_provider``: default the global one). With
    ``propagate``, new intents carry the current span's context (see the module).
    Calling it again replaces the earlier tracing."""
    tracing = Tracing(tracer_provider)
    with _lock:
        for old in _on:
            remove_observer(old)
        _on[:] = [tracing]
        HUB.trace = current_traceparent if propagate else None
        add_observer(tracing)
    return tracing


def disable() -> None:
    """Stop making spans, and stop stamping intents with the trace context."""
    with _lock:
        for old in _on:
            remove_observer(old)
        _on.clear()
        HUB.trace = None
