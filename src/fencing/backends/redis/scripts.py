"""The Lua scripts (reviewed text in ``lua/``), the calls to them, and the flows that
send calls: one round trip (EVALSHA), ``WAIT`` after writes when configured, and the
scripts loaded again on NOSCRIPT (a server that lost its script cache ran nothing of
those calls, so they are sent again).

Every primitive that reads or writes more than one value is one script, loaded once
with SCRIPT LOAD and called by its SHA.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..._errors import InvalidInput, InvalidState, TransientStoreError
from ..._flow import Flow
from ..._request import CommitRequest
from .errors import driver_errors, raise_error
from .layout import Layout, key_slot
from .replies import as_int
from .settings import Settings
from .steps import Command, Load, Send

__all__ = [
    "MAX_EXACT_INT",
    "SCRIPTS",
    "Call",
    "Script",
    "check_slots",
    "field_text",
    "judge_call",
    "run_call",
    "run_calls",
    "script_call",
    "send",
]


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    text: str
    sha: str


def _load_scripts() -> dict[str, Script]:
    """Each script is its ``#!lua`` line, then ``prelude.lua``, then its body."""
    root = importlib.resources.files("fencing.backends.redis").joinpath("lua")
    prelude = root.joinpath("prelude.lua").read_text("utf-8")
    scripts = {}
    for name in (
        "commit",
        "probe",
        "read",
        "create",
        "delete",
        "acquire",
        "renew",
        "release",
        "lease_state",
        "prune",
        "declare",
        "migrate",
        "record_effect",
        "mark_effect",
        "settle_effects",
        "list_effects",
        "scan_effects",
        "prune_effects",
        "is_applied",
    ):
        shebang, body = root.joinpath(f"{name}.lua").read_text("utf-8").split("\n", 1)
        assert shebang.startswith("#!lua"), name
        text = f"{shebang}\n{prelude}\n{body}"
        scripts[name] = Script(name, text, hashlib.sha1(text.encode()).hexdigest())
    return scripts


SCRIPTS: Final = _load_scripts()
#: Integers a Lua number (a double) holds exactly.
MAX_EXACT_INT: Final = 2**53


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation: EVALSHA sha numkeys keys... args..."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[str, ...]

    def command(self) -> Command:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def check_slots(call: Call, hint: str = "") -> Call:
    """Refuse a call whose keys span hash slots (Cluster could not run it atomically)."""
    slots = {key_slot(k) for k in call.keys}
    if len(slots) > 1:
        raise InvalidInput(
            f"in Redis Cluster the keys of one {call.script.name} must share a hash slot,"
            f" and {list(call.keys)} do not{hint}"
        )
    return call


def script_call(layout: Layout, name: str, keys: Sequence[str], args: Sequence[str]) -> Call:
    """A call of script ``name`` (refused before sending in a Cluster when its keys span
    slots)."""
    call = Call(SCRIPTS[name], tuple(keys), tuple(args))
    return check_slots(call) if layout.cluster else call


def field_text(value: object) -> str:
    """The text a table row's hash field holds for a column value (see "Guarded tables"
    in ``docs/backends/redis.md``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    raise InvalidState(
        f"a Redis table field cannot hold {type(value).__name__}: a Redis row holds text;"
        " write the text you want (e.g. str(value)) (docs/types.md)"
    )


def _guard_text(request: CommitRequest) -> str:
    guard = request.intent.guard
    if guard is None:
        return ""
    if request.target.kind == "table":
        text = {f: None if v is None else field_text(v) for f, v in guard.items()}
        return json.dumps(text, separators=(",", ":"))
    for name, value in guard.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
            raise InvalidState(
                f"guard value for {name!r} is beyond 2**53: the Redis backend compares"
                " JSON numbers as doubles and cannot compare it exactly"
            )
    return json.dumps(dict(guard), separators=(",", ":"))


def judge_call(layout: Layout, request: CommitRequest, name: str) -> Call:
    """The ``commit`` or ``probe`` script call for a request (refused before sending in a
    Cluster when its keys span slots)."""
    target, intent, lease = request.target, request.intent, request.lease
    key = intent.key
    keys: tuple[str, ...] = layout.record_keys(target, key)
    if lease is not None:
        keys += (layout.lease(lease.name),)
    expected = intent.expected_version
    args = [
        "c" if target.kind == "collection" else "t",
        request.claim_id,  # the root id: every derivation of one intent shares one claim
        "" if expected is None else str(expected),
        "" if lease is None else str(lease.token),
        _guard_text(request),
        target.version_column or "",
        target.key_column,
    ]
    if name == "commit":
        if target.kind == "collection":
            args.append(request.state_json)
        else:
            for column, value in request.state.items():
                args += [column, "-" if value is None else "=" + field_text(value)]
    call = Call(SCRIPTS[name], keys, tuple(args))
    if layout.cluster:
        hint = ""
        if lease is not None:
            hint = (
                f": a fenced commit needs its lease in the record's slot; name the lease"
                f" {layout.tag(target, key)!r} (it is {lease.name!r})"
            )
        check_slots(call, hint)
    return call


def run_calls(settings: Settings, calls: Sequence[Call], *, write: bool) -> Flow[list[object]]:
    """Run script calls in one round trip (plus WAIT after writes, if configured)."""
    commands = [c.command() for c in calls]
    wait = settings.wait if write else None
    if wait is None and len(commands) == 1:
        replies: list[object] = yield Send((commands[0],))
        if not isinstance(replies[0], BaseException):
            return replies  # the common case: one script call, answered
        tail: tuple[Command, ...] = ()
    else:
        tail = (wait,) if wait is not None else ()
        replies = yield Send((*commands, *tail))
    no_script = driver_errors().no_script
    replies = list(replies)
    waits = replies[len(commands) :]
    replies = replies[: len(commands)]
    redo = [i for i, r in enumerate(replies) if isinstance(r, no_script)]
    if redo:
        # The server lost its script cache (a restart, SCRIPT FLUSH): nothing of those
        # calls ran, so load the scripts and send them again.
        yield Load()
        again = list((yield Send((*(commands[i] for i in redo), *tail))))
        for i, reply in zip(redo, again, strict=False):
            replies[i] = reply
        waits += again[len(redo) :]
    for reply in replies:
        raise_error(reply)
    for acked in waits:
        raise_error(acked)
        if as_int(acked) < settings.wait_replicas:
            raise TransientStoreError(
                f"redis: only {as_int(acked)} of {settings.wait_replicas} replicas acknowledged"
                f" the write within {settings.wait_timeout_ms} ms; it is on the primary but"
                " may not survive a failover: the outcome is unknown, retry with the same"
                " intent"
            )
    return replies


def run_call(settings: Settings, call: Call, *, write: bool) -> Flow[object]:
    return (yield from run_calls(settings, [call], write=write))[0]


def send(commands: Sequence[Command]) -> Flow[list[object]]:
    """Commands in one round trip; an error reply is raised, translated."""
    replies = list((yield Send(tuple(commands))))
    for reply in replies:
        raise_error(reply)
    return replies
