"""Testing tools: record a history of intents and outcomes, and judge it.

::

    from fencing.testing import HistoryWriter, Recorder, check_file

    with HistoryWriter("history.jsonl") as sink:
        orders = Recorder(store.collection("orders"), sink, worker="w1")
        orders.apply(intent, decide)          # the same outcome, and one event written
        orders.write_final(["o-1", "o-2"])   # the store's final content
    report = check_file("history.jsonl")
    assert report.ok, report.summary()

The history format is described in ``fencing.testing._history``; what the checker
reports in ``fencing.testing._checker``. ``fencing check HISTORY.jsonl`` runs the
checker from the command line.

Linearizability: record every store operation with its invocation and response
times (``Operation``, written as ``lin`` events by ``lin_event``), then judge the
history against the sequential model of a versioned record store::

    report = check_linearizable(operations)     # or read_lin_file("ops.jsonl")
    assert report.ok, report.summary()          # ok: True, False, or None (budget)

The format and the search are described in ``fencing.testing._linear``; the model
in ``fencing.testing._linear_model``.

Blind writers: ``WriteAudit`` reads the UPDATEs a test sends (SQLAlchemy, Django, an
``sqlite3`` connection) and reports each one that wrote a watched table without moving
its version; ``fencing.testing.pytest_plugin`` makes it a fixture and a marker
(``fencing_audit``). See ``fencing.testing._audit`` and docs/guard.md.
"""

from __future__ import annotations

from ._audit import BlindWrite, BlindWriteError, WriteAudit, blind_updates
from ._checker import ANOMALY_KINDS, LABELS, Anomaly, Report, check_file, check_history, iter_file
from ._history import (
    LEASE_ACTIONS,
    OUTCOMES,
    EventSink,
    HistoryError,
    HistoryWriter,
    MemoryHistory,
    Recorder,
    final_event,
    outcome_event,
    write_final,
)
from ._linear import (
    DEFAULT_BUDGET,
    LinReport,
    PartitionResult,
    check_linearizable,
    lin_event,
    read_lin_file,
    write_lin,
)
from ._linear_model import Operation

__all__ = [
    "ANOMALY_KINDS",
    "DEFAULT_BUDGET",
    "LABELS",
    "LEASE_ACTIONS",
    "OUTCOMES",
    "Anomaly",
    "BlindWrite",
    "BlindWriteError",
    "EventSink",
    "HistoryError",
    "HistoryWriter",
    "LinReport",
    "MemoryHistory",
    "Operation",
    "PartitionResult",
    "Recorder",
    "Report",
    "WriteAudit",
    "blind_updates",
    "check_file",
    "check_history",
    "check_linearizable",
    "final_event",
    "iter_file",
    "lin_event",
    "outcome_event",
    "read_lin_file",
    "write_final",
    "write_lin",
]
