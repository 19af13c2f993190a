"""What the rows MySQL answers mean: records, lease rows, and the judgement of a commit
the conditional UPDATE refused (``fencing._rules.judge`` on rows read in its transaction)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..._request import CommitRequest, CommitResult, LeaseAnswer, Target, table_version
from ..._rules import LeaseRow, Status, judge
from ..._values import Record
from .steps import Result
from .templates import Reads, Slots

__all__ = ["commit_result", "judged", "lease_answer", "record_of"]


def _float(value: Any) -> float:
    return 0.0 if value is None else float(value)


def _lease_row(name: str, owner: Any, token: Any, expires_at: Any) -> LeaseRow | None:
    if token is None:
        return None
    return LeaseRow(name, owner, int(token), _float(expires_at))


def _table_record(
    target: Target, key: str | int, names: Sequence[str], row: Sequence[Any], fence: Any
) -> Record:
    values = dict(zip(names, row, strict=True))
    vcol = target.version_column
    version = table_version(values.pop(vcol), target, key) if vcol else 0
    values.pop(target.key_column, None)
    return Record(target.name, key, version, int(fence or 0), values, "table")


def record_of(result: Result, target: Target, key: str | int) -> Record | None:
    """The record a read (``templates.add_read``) found, or None."""
    if not result.rows:
        return None
    row = result.rows[0]
    if target.kind == "collection":
        return Record(target.name, key, int(row[0]), int(row[1]), json.loads(row[2]))
    return _table_record(target, key, result.names[1:], row[1:], row[0])


def judged(results: list[Result], at: Reads, request: CommitRequest) -> CommitResult:
    """The rules' judgement of the rows ``templates.add_judge_reads`` read."""
    target, intent, lease = request.target, request.intent, request.lease
    now, applied = results[at.meta].rows[0]
    record = record_of(results[at.record], target, intent.key)
    row = None
    if lease is not None and at.lease is not None and results[at.lease].rows:
        row = _lease_row(lease.name, *results[at.lease].rows[0])
    return CommitResult(judge(record, bool(applied), intent, lease, row, _float(now)), record)


def commit_result(results: list[Result], slots: Slots, request: CommitRequest) -> CommitResult:
    """What one commit (``templates.add_commit``) did, from its batch's results."""
    target, intent, lease = request.target, request.intent, request.lease
    found = results[slots.result]
    if not found.rows:
        return CommitResult(Status.MISSING, None)
    if target.kind == "collection":
        claimed, done, now, version, fence, state = json.loads(found.rows[0][0])
        claimed, done = int(claimed), int(done)  # MariaDB renders user variables as text
        if done == 1:
            record = Record(target.name, intent.key, int(version), int(fence), request.state)
            return CommitResult(Status.APPLIED, record)
        record = Record(target.name, intent.key, int(version), int(fence), json.loads(state))
    else:
        claimed, done, now, fence, *rest = found.rows[0]
        claimed, done = int(claimed), int(done)
        record = _table_record(target, intent.key, found.names[4:], rest, fence)
        if done == 1:
            return CommitResult(Status.APPLIED, record)
    row = None
    if lease is not None and slots.lease is not None:
        lease_rows = results[slots.lease].rows
        row = _lease_row(lease.name, *lease_rows[0]) if lease_rows else None
    status = judge(record, claimed == 0, intent, lease, row, _float(now))
    # The UPDATE refused. The rules agreeing now, on the row locked since, can only mean
    # a row created (again) since the UPDATE looked, or a comparison the server made
    # differently from Python (a user table's column type): nothing was written.
    looked = results[slots.unsettled].rows  # 0: it looked, and found no effect to settle
    maybe = not looked or looked[0][0] is None or int(looked[0][0]) != 0
    return CommitResult(Status.STALE if status is Status.OK else status, record, maybe)


def lease_answer(name: str, result: Result, granted: bool) -> LeaseAnswer:
    """A lease flow's answer from its read of the lease row (``LEASE_READ``)."""
    now, owner, token, expires_at = result.rows[0]
    return LeaseAnswer(granted, _lease_row(name, owner, token, expires_at), _float(now))
