"""``fencing demo --queue celery|rq|dramatiq|arq``: the demo's race through a real task queue.

The same seeded schedule as ``fencing demo`` (``scenario.make_schedule``), the same
naive and fencing decisions, the same history checker and table; what changes is
the delivery. This process is the producer: it captures each task's intent when the
schedule says the task is decided, and sends it after the task's delivery delay, so
tasks reach the broker out of order; a duplicate delivery is the same message sent
twice; the takeover of a paused task is sent once that task's worker has paused. The
tasks run in N real worker processes of the queue, started here against the demo's
store and broker: the fencing run's through the ``fencing.contrib`` integration, the
naive run's through a plain task of the same queue.

Crash after commit is real on every queue: the first delivery of a crashing task
SIGKILLs its own worker process right after its commit, before the queue's
acknowledgement, and the queue runs the message again. Celery's prefork pool and
RQ's work horse are children of the worker command, which survives and redelivers
(``reject_on_worker_lost``, ``Retry``). On Dramatiq and arq the process killed is a
whole worker: the demo starts a new one in its place (``processes.Workers.check``),
and the queue gives the message back by itself: RabbitMQ when the dead worker's
connection closes, Dramatiq's Redis broker once the dead worker's heartbeat is older
than its ``heartbeat_timeout``, arq once the job's in-progress key expired (each
queue's module sets these to seconds).

Isolation: the run id names every queue, broker key prefix and worker; only those are
deleted afterwards (never a whole database), and every worker process started here
(its whole process group, and any process carrying the run's id in its environment)
is killed on the way out: at the end, on an error or on Ctrl-C.

The package: ``runner`` is the producer and the bookkeeping of a run; ``processes``
starts, replaces and stops the worker processes; ``modules`` picks the queue's module
(``celery_app``, ``rq_jobs``, ``dramatiq_actors``, ``arq_worker``), which the worker
processes import by its module path; ``_tasks`` is what those workers run, whatever the
queue; ``_broker`` checks the broker and deletes the run's keys. With ``--outbox``, ``outbox``
runs the schedule twice through the fenced tasks, the send after the commit naive and
through the transactional outbox, and ``relay`` runs the relay processes it kills. With
``--chain`` too, ``chain`` ships orders through a two-step chain, ship -> notify, naive and
in the worker's transaction, its workers killed before and after their commit; ``_chain``
is what those workers run.
"""

from __future__ import annotations

from ._broker import broker_url, shown_broker
from .modules import crashes, preflight, queue_module
from .processes import run_processes
from .runner import run_queue_demo

__all__ = [
    "broker_url",
    "crashes",
    "preflight",
    "queue_module",
    "run_processes",
    "run_queue_demo",
    "shown_broker",
]
