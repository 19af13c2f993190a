"""Redis's replies read as fencing's values: records, commit and lease answers, effect
rows, SCAN pages. A reply that is not what the scripts send is a ``StoreError``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from ..._effects import Effect, effect_from_row
from ..._errors import SchemaError, StoreError
from ..._request import CommitRequest, CommitResult, LeaseAnswer, Target
from ..._rules import LeaseRow, Status, judge
from ..._values import Record

__all__ = [
    "as_int",
    "as_list",
    "as_text",
    "commit_result",
    "effect_reply",
    "judge_reply",
    "lease_answer",
    "scan_reply",
    "table_record",
]

_INTEGER = re.compile(r"0|-?[1-9][0-9]*")


def as_text(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise StoreError(f"redis: a value is not UTF-8 text ({exc})") from exc
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    raise StoreError(f"redis: unexpected reply {value!r}")


def as_int(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            pass
    raise StoreError(f"redis: expected an integer, got {value!r}")


def as_list(value: object, length: int | None = None) -> list[object]:
    if not isinstance(value, list | tuple) or (length is not None and len(value) != length):
        raise StoreError(f"redis: unexpected reply {value!r}")
    return list(value)


def _fields(row: object) -> dict[str, str]:
    flat = [as_text(v) for v in as_list(row)]
    return dict(zip(flat[::2], flat[1::2], strict=True))


def table_record(
    target: Target, key: str | int, version: object, fence: object, row: object
) -> Record:
    fields = _fields(row)
    vcol = target.version_column
    if version is None and vcol is not None:
        # read path: the client checks the version field as the scripts do
        text = fields.get(vcol)
        if text is None or _INTEGER.fullmatch(text) is None:
            raise SchemaError(
                f"table row {target.name}:{key} has no integer {vcol} field (NULL or missing)"
            )
        version = text
    fields.pop(target.key_column, None)
    if vcol is not None:
        fields.pop(vcol, None)
    return Record(
        target.name, key, 0 if vcol is None else as_int(version), as_int(fence), fields, "table"
    )


def _record(request: CommitRequest, items: list[object], status: Status) -> Record:
    target, key = request.target, request.intent.key
    if target.kind == "table":
        return table_record(target, key, items[1], items[2], items[3])
    if status is Status.APPLIED:
        state: Mapping[str, Any] = request.state
    else:
        state = json.loads(as_text(items[3]))
    return Record(target.name, key, as_int(items[1]), as_int(items[2]), state)


_STATUS: Final = {s.value.encode(): s for s in Status}


def _status(value: object) -> Status:
    status = _STATUS.get(value) if isinstance(value, bytes) else None
    if status is None:
        raise StoreError(f"redis: unexpected status {value!r}")
    return status


def commit_result(request: CommitRequest, reply: object) -> CommitResult:
    """A commit or probe reply as the contract's answer (the status comes from Lua).

    Replies: ``[status, version, fence, state JSON or row, applied, lease token, lease
    owner, lease expiry, now]``, or ``[b"applied", version, fence, row]`` after a write.
    """
    if not isinstance(reply, list) or len(reply) not in (4, 9):
        raise StoreError(f"redis: unexpected reply {reply!r}")
    status = _status(reply[0])
    if status is Status.MISSING:
        return CommitResult(status, None)
    return CommitResult(status, _record(request, reply, status))


def judge_reply(request: CommitRequest, reply: object) -> Status:
    """What ``fencing._rules.judge()`` says about the facts a probe reply carries.

    The scripts decide the status themselves; tests hold them to this.
    """
    items = as_list(reply, 9)
    status = _status(items[0])
    record = None if status is Status.MISSING else _record(request, items, status)
    lease = request.lease
    row = None
    if lease is not None and items[5] is not None:
        owner = None if items[6] is None else as_text(items[6])
        row = LeaseRow(lease.name, owner, as_int(items[5]), as_int(items[7]) / 1e6)
    applied = items[4] is not None and as_int(items[4]) == 1
    return judge(record, applied, request.intent, lease, row, as_int(items[8]) / 1e6)


def lease_answer(name: str, reply: object) -> LeaseAnswer:
    granted, token, owner, expires, now = as_list(reply, 5)
    row = None
    if token is not None:
        row = LeaseRow(
            name,
            None if owner is None else as_text(owner),
            as_int(token),
            0.0 if expires is None else as_int(expires) / 1e6,
        )
    return LeaseAnswer(as_int(granted) == 1, row, as_int(now) / 1e6)


def effect_reply(reply: object) -> Effect:
    """A stored effect row (JSON, see ``record_effect.lua``) as an :class:`Effect`.

    The scripts keep times as integer microseconds of the server's clock (text); the
    row is handed to ``effect_from_row`` with them as seconds, like every other time.
    """
    try:
        row = as_list(json.loads(as_text(reply)), 12)
    except ValueError as exc:
        raise StoreError(f"redis: an effect row is not JSON ({exc})") from exc
    for i in (9, 10, 11):
        if row[i] is not None:
            row[i] = as_int(row[i]) / 1e6
    return effect_from_row(row)


def scan_reply(
    state: tuple[int, int], nodes: int, cursor: object, keys: object
) -> tuple[tuple[int, int] | None, list[object]]:
    """A ``Scan`` step's result, from SCAN's reply on node ``state[0]`` of ``nodes``."""
    if isinstance(cursor, dict):  # a Cluster answers per node
        cursor = next(iter(cursor.values()), 0)
    node, nxt = state[0], as_int(cursor)
    if nxt == 0:
        node, nxt = node + 1, 0
    return (None if node >= nodes else (node, nxt)), as_list(keys)
