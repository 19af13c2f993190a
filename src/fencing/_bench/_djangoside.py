"""The django-concurrency side of ``fencing bench --contention``'s one-call-at-a-time table.

Django's settings are process-wide (and a test process may already run pytest-django's),
so the side runs in a spawned process that configures its own: PostgreSQL through
psycopg 3, ``concurrency`` installed, a model with ``IntegerVersionField``. The process
waits for a round, times it itself (wall and its own ``time.process_time``) and answers,
so its rounds alternate with the other sides' like theirs do.

``IntegerVersionField`` writes time-based versions (``time.time()`` in microseconds, less
an offset; at least the old one + 1), not the +1 the other sides write: the side gets its
own copy of the records, ``contention_dj_records`` in the same schema. Its applied rows go
to ``contention_applied``.
The job's decide and its timer come from ``_contention`` as arguments (picklable module
functions), so this module does not import it back.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable
from typing import Any, Final

from .._url import StoreURL
from .._values import new_intent_id

#: django-concurrency's own copy of the records (see the module docstring)
TABLE: Final = "contention_dj_records"

Decide = Callable[[Any, float], dict[str, Any]]
Timed = Callable[[Callable[[str], bool], tuple[str, ...], int, float], tuple[float, float]]


class DjangoSide:
    """The spawned process, from the parent: ``round(r)`` is (wall, CPU) µs per op."""

    def __init__(self, proc: Any, pipe: Any, seconds: float) -> None:
        self.proc, self.pipe, self.seconds = proc, pipe, seconds
        self.timeout = 120 + seconds  # spawn, import Django, connect; or one round

    @classmethod
    def start(
        cls,
        url: str,
        admin: Any,
        scratch: str,
        keys: tuple[str, ...],
        seconds: float,
        decide: Decide,
        timed: Timed,
    ) -> DjangoSide | str:
        """The running side (its records copied from ``contention_records``), or why it
        is skipped."""
        from importlib.util import find_spec

        for module, name in (("django", "Django"), ("concurrency", "django-concurrency")):
            if find_spec(module) is None:
                return f"{name} is not installed"
        s = f'"{scratch}"'
        admin.execute(f"CREATE TABLE {s}.{TABLE} (LIKE {s}.contention_records INCLUDING ALL)")
        admin.execute(
            f"INSERT INTO {s}.{TABLE} SELECT * FROM {s}.contention_records WHERE key = ANY(%s)",
            (list(keys),),
        )
        ctx = multiprocessing.get_context("spawn")
        pipe, child_end = ctx.Pipe()
        args = (url, scratch, keys, decide, timed, child_end)
        proc = ctx.Process(target=_child, args=args, daemon=True)
        proc.start()
        child_end.close()
        side = cls(proc, pipe, seconds)
        try:
            side.answer("ready")
        except Exception as exc:
            side.close()
            return f"failed: {type(exc).__name__}: {exc}"
        return side

    def answer(self, want: str) -> Any:
        if not self.pipe.poll(self.timeout):
            raise TimeoutError(f"no answer from the Django process in {self.timeout:g} s")
        what, value = self.pipe.recv()
        if what != want:
            raise RuntimeError(f"the Django process: {value}")
        return value

    def round(self, r: int) -> tuple[float, float]:
        self.pipe.send((r, self.seconds))
        wall, cpu = self.answer("round")
        return float(wall), float(cpu)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the process has gone already
            self.pipe.send(None)
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.pipe.close()


def _child(
    url: str, scratch: str, keys: tuple[str, ...], decide: Decide, timed: Timed, pipe: Any
) -> None:
    """The spawned process: settings, the models, then rounds until ``None``."""
    try:
        save = _save(url, scratch, decide)
        pipe.send(("ready", None))
        while (asked := pipe.recv()) is not None:
            r, seconds = asked
            pipe.send(("round", timed(save, keys, r, seconds)))
    except Exception as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))


def _save(url: str, scratch: str, decide: Decide) -> Callable[[str], bool]:
    """Django configured here, then the job: ``get``, change ``state``, ``save()``, the
    applied row, in ``transaction.atomic()``; a ``RecordModifiedError`` is not completed."""
    import os

    os.environ.pop("DJANGO_SETTINGS_MODULE", None)  # a pytest-django parent's
    from django.conf import settings
    from psycopg.conninfo import conninfo_to_dict

    import django

    from ._postgres import conninfo

    params: dict[str, Any] = conninfo_to_dict(conninfo(StoreURL.parse(url)))
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname", ""),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": str(params.pop("port", "")),
        "OPTIONS": params,
    }
    settings.configure(DATABASES={"default": database}, INSTALLED_APPS=["concurrency"])
    django.setup()
    from concurrency.exceptions import RecordModifiedError
    from concurrency.fields import IntegerVersionField
    from django.db import models, transaction

    class Row(models.Model):  # type: ignore[misc]
        key = models.TextField(primary_key=True)
        version = IntegerVersionField()
        state = models.JSONField()

        class Meta:
            app_label = "fencing_bench"
            db_table = f'"{scratch}"."{TABLE}"'  # quoted whole: Django keeps it as is

    class Applied(models.Model):  # type: ignore[misc]
        intent_id = models.TextField(primary_key=True)
        key = models.TextField()

        class Meta:
            app_label = "fencing_bench"
            db_table = f'"{scratch}"."contention_applied"'

    def save(key: str) -> bool:
        try:
            with transaction.atomic():
                row = Row.objects.get(pk=key)
                row.state = decide(row.state, 0.0)
                row.save()
                Applied.objects.create(intent_id=new_intent_id(), key=key)
        except RecordModifiedError:
            return False
        return True

    return save
