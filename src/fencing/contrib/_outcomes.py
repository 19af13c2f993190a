"""What a run of a fenced task comes to: the queue's :class:`Action`, the :class:`TaskReport`,
and the one ``fencing.task`` log record of each run.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any, Final

from .._errors import InvalidInput, LeaseExpired, LeaseHeld, LeaseLost, TransientStoreError
from .._values import Fenced, Intent, Outcome

logger = logging.getLogger("fencing.task")


class Action(enum.StrEnum):
    """What the queue must do with the message after a run."""

    ACK = "ack"  #: done (committed, duplicate, skipped, or a recorded stale result)
    RETRY = "retry"  #: transient: retry the same payload later, bounded, with backoff
    REFUSE = "refuse"  #: a bad message: fail it, never retry
    FAIL = "fail"  #: decide raised, or retries ran out: fail with the error, no retry


@dataclass(frozen=True, slots=True)
class TaskReport:
    """The result of one run of a fenced task; ``to_dict()`` is its JSON-safe form."""

    task: str
    action: Action
    #: the outcome kind, or "transient", "lease_held", "lease_expired", "retryable",
    #: "invalid", "error"; a retryable one ends in "_exhausted" when the retries are used up
    kind: str
    attempt: int
    intent: Intent | None = None  #: the intent the message carried
    outcome: Outcome | None = None
    error: Exception | None = None
    token: int | None = None  #: the lease token the commit was made under, if any

    @property
    def judged(self) -> Intent | None:
        """The intent the store judged: a ``Recompute`` attempt's derived one, if any."""
        judged = getattr(self.outcome, "intent", None)
        return judged if isinstance(judged, Intent) else self.intent

    @property
    def fence_reason(self) -> str | None:
        """``"newer_owner"`` or ``"expired"`` for a fenced outcome (``FenceReason``), else None:
        another worker did the work, or nobody did (the run is retried)."""
        outcome = self.outcome
        return outcome.reason.value if isinstance(outcome, Fenced) else None

    @property
    def current_version(self) -> int | None:
        current = self.outcome.current if self.outcome is not None else None
        return None if current is None else current.version

    def log_fields(self) -> dict[str, Any]:
        """The ``extra`` fields of the ``fencing.task`` log record."""
        judged = self.judged
        return {
            "fencing_task": self.task,
            "fencing_collection": None if judged is None else judged.collection,
            "fencing_key": None if judged is None else judged.key,
            "fencing_intent_id": None if judged is None else judged.id,
            "fencing_root_id": None if judged is None else judged.root_id,
            "fencing_expected_version": None if judged is None else judged.expected_version,
            "fencing_current_version": self.current_version,
            "fencing_outcome": self.kind,
            "fencing_fence_reason": self.fence_reason,
            "fencing_action": self.action.value,
            "fencing_attempt": self.attempt,
            "fencing_token": self.token,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: what a task returns to its queue's result store."""
        fields = self.log_fields()
        data = {name.removeprefix("fencing_"): value for name, value in fields.items()}
        data["error"] = None if self.error is None else f"{type(self.error).__name__}: {self.error}"
        return data


def classify(error: Exception, retry_on: tuple[type[Exception], ...] = ()) -> tuple[Action, str]:
    """The action for an error raised by a run (outcomes are always ``ack``)."""
    if isinstance(error, InvalidInput):
        return Action.REFUSE, "invalid"  # never retried, whatever retry_on says
    if isinstance(error, TransientStoreError):
        return Action.RETRY, "transient"
    if isinstance(error, LeaseHeld):
        return Action.RETRY, "lease_held"
    if isinstance(error, LeaseExpired):
        return Action.RETRY, "lease_expired"
    if isinstance(error, LeaseLost):  # decide found it lost (current_lease().renew())
        return Action.RETRY, "lease_lost"
    if retry_on and isinstance(error, retry_on):
        return Action.RETRY, "retryable"
    return Action.FAIL, "error"


_LEVELS: Final = {
    "committed": logging.INFO,
    "duplicate": logging.INFO,
    "skipped": logging.INFO,
}


def _level(report: TaskReport) -> int:
    if report.action is Action.ACK:
        return _LEVELS.get(report.kind, logging.WARNING)
    return logging.WARNING if report.action is Action.RETRY else logging.ERROR


def emit(report: TaskReport) -> None:
    """Log the run's one record on the ``fencing.task`` logger (``extra``: ``fencing_*``)."""
    fields = report.log_fields()
    message = "%s: %s %s/%s intent=%s expected=%s current=%s -> %s"
    args: tuple[object, ...] = (
        report.task,
        report.kind,
        fields["fencing_collection"],
        fields["fencing_key"],
        fields["fencing_intent_id"],
        fields["fencing_expected_version"],
        fields["fencing_current_version"],
        report.action.value,
    )
    if report.fence_reason is not None:
        message += " fenced=%s"
        args += (report.fence_reason,)
    if report.error is not None:
        message += " (%s: %s)"
        args += (type(report.error).__name__, report.error)
    logger.log(_level(report), message, *args, extra=fields)


def not_abandoned(report: TaskReport, why: Exception) -> None:
    """Warn that a failed intent's effects could not be settled as abandoned."""
    logger.warning(
        "%s: could not settle the effects of failed intent %s (%s: %s); they stay pending",
        report.task,
        report.intent.id if report.intent is not None else None,
        type(why).__name__,
        why,
    )
