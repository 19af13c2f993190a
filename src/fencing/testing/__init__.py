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
"""

from __future__ import annotations

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

__all__ = [
    "ANOMALY_KINDS",
    "LABELS",
    "LEASE_ACTIONS",
    "OUTCOMES",
    "Anomaly",
    "EventSink",
    "HistoryError",
    "HistoryWriter",
    "MemoryHistory",
    "Recorder",
    "Report",
    "check_file",
    "check_history",
    "final_event",
    "iter_file",
    "outcome_event",
    "write_final",
]
