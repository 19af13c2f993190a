"""``fencing demo``: the same seeded race run twice, naive and with fencing, then judged.

One job per module; each imports only modules listed above it, so there is no circle:

- ``scenario``: the race: the seeded schedule, the two kinds of work and their
  decisions, a run's records and its result;
- ``worker``: what a worker does with one delivery, naive or fencing;
- ``config``: the demo's options and their checks;
- ``broker``: the in-process broker (delays, reordering, duplicates, redeliveries)
  and the pool of worker threads or processes;
- ``queues``: the same race through a real task queue (``--queue``): the producer,
  the worker processes, and one module per queue;
- ``report``: the race as a self-contained HTML page (``--report``);
- ``runner``: the two runs, naive then fencing (:func:`run_demo`);
- ``render``: the terminal output (rich): intro, progress bars, table, verdict;
- ``command``: ``fencing demo``'s arguments, and its JSON output.
"""

from __future__ import annotations

from .command import add_arguments, run
from .config import DemoConfig
from .runner import run_demo
from .scenario import TaskSpec, make_schedule

__all__ = ["DemoConfig", "TaskSpec", "add_arguments", "make_schedule", "run", "run_demo"]
