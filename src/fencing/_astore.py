"""The asynchronous front: ``AsyncStore``, ``AsyncCollection``, ``AsyncTable``, ``AsyncLease``.

This file is the source of truth for both fronts: ``scripts/unasync.py`` rewrites
it into ``_store.py`` (the sync front), and a test fails if the two differ.
Every method is a thin call to the backend around the shared, I/O-free checks of
``_storebase`` and flows of ``_policy``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self

from ._alease import AsyncLease, AsyncLeaseContext, held
from ._aoutbox import AsyncOutbox
from ._borrow import borrow_async
from ._checks import (
    check_declared,
    check_lease_args,
    check_wait,
    effect_ref,
    found_effect,
    guard_target,
    key_query,
    pending_query,
    reconcile_query,
    row_key,
)
from ._effects import Effect
from ._errors import (
    ConfigurationError,
    InvalidInput,
    LeaseHeld,
    StoreClosed,
    WrongEventLoop,
)
from ._flow import Sleep, adrive
from ._observe import HUB, LEVEL, log, now_ns
from ._policy import (
    AcquireStep,
    CommitStep,
    DecideStep,
    Drop,
    ProbeStep,
    ReconcileStep,
    RetakeStep,
    SettleStep,
    StalePolicy,
    apply_flow,
    check_policy,
    lease_wait_flow,
    settle_flow,
)
from ._request import LeaseAnswer, Target
from ._runner import current_loop, maybe_await, sleep_async
from ._storebase import StoreOptions, TargetBase, lease_event
from ._validate import check_column, check_name, check_table, mapped_table
from ._values import Committed, Intent, Outcome, Record
from .backends._contract import AsyncBackend

__all__ = ["AsyncCollection", "AsyncLease", "AsyncLeaseContext", "AsyncStore", "AsyncTable"]

logger = logging.getLogger("fencing.lease")

#: ``decide(record)`` returns the new state or ``fencing.SKIP`` (async stores also
#: accept a coroutine function).
Decision = Callable[[Record], Any]

#: ``apply``'s policy when none is given (a value: one serves every call).
_DROP = Drop()


class _AsyncOps(TargetBase):
    _store: AsyncStore

    @property
    def _backend(self) -> AsyncBackend:
        return self._store._live()

    async def _ready(self) -> None:
        if self.target.kind == "table" and self._columns is None:
            self._set_columns(await self._backend.columns(self.target, self._declared))
            self._store._learned(self)

    def using(self, connection: object) -> Self:
        """This collection or table on ``store.using(connection)``: its reads and
        commits run on your connection or session, inside your transaction."""
        view = self._store.using(connection)
        front: Self = view._front(type(self), self.target, self._declared, self._mapped)
        return front

    async def get(self, key: str | int) -> Record | None:
        """The record as it is now, or None."""
        key = self._key(key)
        await self._ready()
        return await self._backend.read(self.target, key)

    async def intent(
        self, key: str | int, transition: str, *, guard: Mapping[str, Any] | None = None
    ) -> Intent:
        """An intent at the record's current version (reads the record)."""
        transition = check_name(transition, "transition")
        return self._new_intent(await self.get(key), key, transition, guard)

    async def intent_for(
        self, row: object, transition: str, *, guard: Mapping[str, Any] | None = None
    ) -> Intent:
        """An intent for the row ``row`` stands for: a SQLAlchemy mapped object (flushed
        first if it is new), a ``Row`` or mapping with the table's key column, or an
        object with it as an attribute. The row is read where your transaction sees it:
        on a view of ``store.using(session)`` (the session flushed first), or, for a
        mapped object whose session is in a transaction, through that session (an async
        store asks for ``store.using(async_session)``). So the intent carries the
        version the row will have once your transaction commits: enqueue it after the
        commit and it arrives fresh."""
        key, session = row_key(row, self.target)
        front = self
        if session is not None and self._store._parent is None:
            view = self._store._session_view(session)
            front = view._front(type(self), self.target, self._declared, self._mapped)
        return await front.intent(self._key(key), transition, guard=guard)

    async def commit(
        self, intent: Intent, state: Mapping[str, Any], *, lease: AsyncLease | None = None
    ) -> Outcome:
        """One atomic conditional write of ``state`` for ``intent``."""
        if self._columns is None and self.target.kind == "table":
            await self._ready()
        request = self._request(intent, state, lease)
        started = now_ns() if HUB.on else 0
        result = await self._backend.commit(request)
        outcome = self._outcome(result, request.intent, lease)
        if HUB.on or log.isEnabledFor(LEVEL[outcome.committed]):
            self._report("commit", outcome, started, lease)
        if outcome.committed:
            if self._hooks:
                await self._committed(outcome)
            return outcome
        return await self._settled(outcome, result.unsettled)

    async def _committed(self, outcome: Outcome) -> None:
        """Run the ``on_committed`` hooks on a ``Committed`` outcome."""
        if isinstance(outcome, Committed):
            for hook in tuple(self._hooks):
                await maybe_await(hook(outcome, self._store._via))

    async def _settled(self, outcome: Outcome, unsettled: bool) -> Outcome:
        """Settle the intent's effects if ``outcome`` ended it uncommitted (and the store
        did not answer, with it, that there are none: ``unsettled``)."""
        return await adrive(settle_flow(outcome, unsettled), self._settle)

    async def _settle(self, step: SettleStep) -> list[Effect]:
        scope, root = self.target.scope, step.intent.root_id
        return await self._backend.settle_effects(scope, root, step.outcome)

    async def commit_many(
        self,
        items: Iterable[tuple[Intent, Mapping[str, Any]]],
        *,
        lease: AsyncLease | None = None,
    ) -> list[Outcome]:
        """Commit a batch in one transaction (one round trip); one outcome per item, in order."""
        await self._ready()
        requests = self._batch(items, lease)
        started = now_ns() if HUB.on else 0
        results = await self._backend.commit_many(requests) if requests else []
        pairs = zip(results, requests, strict=True)
        outcomes = [self._outcome(res, req.intent, lease) for res, req in pairs]
        # whether to report a refused and a committed outcome: asked once per batch
        report = [HUB.on or log.isEnabledFor(level) for level in LEVEL]
        for o in outcomes:
            if report[o.committed]:
                self._report("commit_many", o, started, lease)
        if self._hooks:
            for o in outcomes:
                await self._committed(o)
        return [
            o if o.committed else await self._settled(o, r.unsettled)
            for o, r in zip(outcomes, results, strict=True)
        ]

    async def apply(
        self,
        intent: Intent,
        decide: Decision,
        *,
        on_stale: StalePolicy | None = None,
        lease: AsyncLease | None = None,
    ) -> Outcome:
        """Run ``decide(record)`` and commit its state; on Stale follow ``on_stale``.

        ``decide`` runs outside any transaction or lock of the store and returns a
        new state, or ``fencing.SKIP``.
        """
        policy = _DROP if on_stale is None else check_policy(on_stale)
        await self._ready()
        probe = self._probe_request(intent, lease)
        started = now_ns() if HUB.on else 0

        probed = False

        async def handle(step: Any) -> Any:
            nonlocal probed
            if isinstance(step, ProbeStep):
                if probed:  # again, under a lease taken again: its new token
                    return await self._backend.probe(self._probe_request(step.intent, lease))
                probed = True
                return await self._backend.probe(probe)
            if isinstance(step, DecideStep):
                return await maybe_await(decide(step.record))
            if isinstance(step, CommitStep):
                return await self._backend.commit(self._request(step.intent, step.state, lease))
            if isinstance(step, Sleep):
                return await sleep_async(step.seconds)
            if isinstance(step, SettleStep):
                return await self._settle(step)
            if isinstance(step, RetakeStep):
                return None if lease is None else await lease._retake()
            if isinstance(step, ReconcileStep) and not isinstance(policy, Drop | type(None)):
                handler = getattr(policy, "handler")  # noqa: B009 - Reconcile only
                return await maybe_await(handler(step.intent, step.record, step.effects))
            raise AssertionError(step)  # pragma: no cover

        outcome = self._seen(await adrive(apply_flow(probe.intent, policy), handle), lease)
        if HUB.on or log.isEnabledFor(LEVEL[outcome.committed]):
            self._report("apply", outcome, started, lease)
        if self._hooks:
            await self._committed(outcome)
        return outcome

    # -- effects ------------------------------------------------------------------
    async def effect(self, intent: Intent, name: str, *, detail: Any = None) -> Effect:
        """Record effect ``name`` of ``intent`` *before* making it.

        Returns the stored effect; pass its ``idempotency_key`` to the provider. It is
        the same for every retry, redelivery and ``Recompute`` of the intent's work:
        recording again returns the effect as stored, whose ``status`` says whether
        it was already ``"done"``. ``detail`` is any JSON value (up to 16 KiB).
        """
        return await self._backend.record_effect(self._new_effect(intent, name, detail))

    async def effect_done(self, effect: Effect, *, detail: Any = None) -> Effect:
        """Mark a recorded effect as made (``detail``: e.g. the provider's reference).

        A ``detail`` given here *replaces* the one recorded by ``effect()`` (it is not
        merged: a detail is any JSON value); pass ``{**effect.detail, ...}`` to keep both.
        Without ``detail`` (None) the recorded detail is kept.
        """
        key, text = self._effect_change(effect, detail)
        return found_effect(await self._backend.mark_effect(key, "done", text, False), key)

    async def effect_failed(self, effect: Effect, *, detail: Any = None) -> Effect:
        """Mark a recorded effect as failed (it did not happen); ``detail`` as for
        ``effect_done``: given, it replaces the recorded detail; None keeps it."""
        key, text = self._effect_change(effect, detail)
        return found_effect(await self._backend.mark_effect(key, "failed", text, False), key)

    async def abandon(self, intent: Intent) -> list[Effect]:
        """Say that ``intent``'s work will not be tried again (its task failed for good):
        its recorded effects not yet settled are settled as ``"abandoned"``, so they are
        listed for reconciliation. Returns the intent's effects. The task-queue
        integrations call it when a task fails without a retry."""
        checked = self._check_intent(intent)
        return await self._settle(SettleStep(checked, "abandoned"))

    async def effects(self, intent: Intent) -> list[Effect]:
        """The effects recorded for ``intent``'s work (any derivation of its root id)."""
        return await self._backend.list_effects(self._effects_query(intent))


class AsyncCollection(_AsyncOps):
    """Library-managed versioned records: ``store.collection("orders")``."""

    async def create(self, key: str, state: Mapping[str, Any]) -> Record:
        """Create a record at version 1; ``AlreadyExists`` if the key is present."""
        checked = self._key(key)
        return await self._backend.create(self.target, checked, self._state_json(state))

    async def delete(self, key: str) -> bool:
        """Delete a record; later commits to it report ``Missing``."""
        return await self._backend.delete(self.target, self._key(key))


class AsyncTable(_AsyncOps):
    """A table the user owns, guarded by its key and version columns."""


class AsyncStore:
    """A store opened by ``fencing.open_async(url)``; share it between the tasks of its loop."""

    def __init__(
        self,
        backend: AsyncBackend,
        url: str,
        options: StoreOptions,
        *,
        parent: AsyncStore | None = None,
    ) -> None:
        self.backend = backend
        self._parent = parent  # the store a view of ``using()`` belongs to
        self._via: object = None  # the connection a view of ``using()`` was given
        self._closed = False
        self._loop = current_loop()  # the loop that opened it (None: a sync store)
        self.url = url
        self.options = options
        self._lock = threading.Lock()
        self._fronts: dict[tuple[Any, ...], _AsyncOps] = {}

    def __repr__(self) -> str:
        closed = " closed" if self._closed else ""
        return f"<fencing.AsyncStore {self.backend.scheme}{closed}>"

    def _live(self) -> AsyncBackend:
        """The backend, for a call: refused after ``close()`` and, for an async store,
        from any event loop but the one that opened it."""
        if self._closed or (self._parent is not None and self._parent._closed):
            self._check_open()  # (raises: one call fewer on every other call)
        if self._loop is not None and current_loop() is not self._loop:
            raise WrongEventLoop(
                f"this async {self.backend.scheme} store belongs to the event loop that"
                " opened it; open one store per event loop (await fencing.open_async in it)"
            )
        return self.backend

    def _check_open(self) -> None:
        if self._closed or (self._parent is not None and self._parent._closed):
            raise StoreClosed(f"this {self.backend.scheme} store is closed: open a new one")

    def using(self, connection: object) -> AsyncStore:
        """A view of this store bound to your connection or session: its collections,
        tables and commits run on ``connection``, inside your transaction.

        ``connection`` is a driver's connection (psycopg 3, PyMySQL, ``sqlite3``) or a
        SQLAlchemy ``Session`` or ``Connection`` (for an async store: their asyncio
        twins, and aiomysql or aiosqlite), on this store's database.
        What a commit writes there is yours to commit or roll back: its outcome is what
        holds once you commit; rolled back, nothing of it remains and the same intent
        can commit later. fencing never commits, rolls back or closes the connection,
        and a refused commit leaves your transaction usable; a refusal is never judged
        on a snapshot older than the latest commit (``SerializationFailure``: run
        your transaction again). Leases, recorded effects and the settlement of a
        refused commit's effects are written at once on the store's own connections (a
        lease token or an effect must never be rolled back); ``migrate``,
        ``guard_table`` and ``prune`` run on the store itself. See
        docs/transactions.md.
        """
        self._check_open()
        bind = getattr(self.backend, "bind", None)
        if bind is None:
            raise ConfigurationError(
                f"a {self.backend.scheme} store has no transaction of yours to join:"
                " store.using() works on PostgreSQL, MySQL/MariaDB and SQLite stores"
            )
        view = AsyncStore(bind(borrow_async(connection)), self.url, self.options, parent=self)
        view._loop = self._loop
        view._via = connection
        return view

    @property
    def outbox(self) -> AsyncOutbox:
        """This store's outbox (on a view of ``using``, written in your transaction)."""
        return AsyncOutbox(self)

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def collection(self, name: str) -> AsyncCollection:
        """The collection ``name`` (created implicitly; records are created explicitly)."""
        target = Target("collection", check_name(name, "collection"))
        front: AsyncCollection = self._front(AsyncCollection, target)
        return front

    def table(
        self,
        name: str | object,
        *,
        key: str = "id",
        version: str | None = "version",
        columns: Iterable[str] | None = None,
    ) -> AsyncTable:
        """Guard a table you own: commits write only the given columns, conditionally.

        ``columns``, when given, are the only columns this table's commits may set;
        they are checked against the table on first use (Redis, which has no schema,
        adds them to the table's declaration instead).

        ``name`` may be ``schema.table``, or a SQLAlchemy mapped class (or ``Table``):
        its name with its schema, its primary key as ``key`` (one column), the mapper's
        ``version_id_col`` as ``version`` when it has one (see docs/sqlalchemy.md).
        """
        mapped = None
        if not isinstance(name, str):
            mapped = name  # its columns bind and update as SQLAlchemy's would
            name, key, version = mapped_table(name, version)
        target = Target(
            "table",
            check_table(name),
            check_column(key, "key column"),
            None if version is None else check_column(version, "version column"),
        )
        front: AsyncTable = self._front(AsyncTable, target, check_declared(target, columns), mapped)
        return front

    def _front(
        self,
        cls: type[Any],
        target: Target,
        declared: frozenset[str] | None = None,
        mapped: object = None,
    ) -> Any:
        self._check_open()
        with self._lock:
            front = self._fronts.get((cls, target, declared, mapped))
            if front is None:
                front = cls(self, self.options, target, declared, mapped)
                if self._parent is not None:  # a view knows what its store knows
                    known = self._parent._front(cls, target, declared, mapped)
                    front._columns = known._columns
                    front._hooks = known._hooks
                self._fronts[(cls, target, declared, mapped)] = front
            return front

    def _session_view(self, session: object) -> AsyncStore:
        """A view on the SQLAlchemy session an object of ``intent_for`` belongs to."""
        try:
            return self.using(session)
        except InvalidInput:
            raise InvalidInput(
                "intent_for(): the object's SQLAlchemy session is in a transaction; read the"
                " row in it: store.using(async_session).table(...).intent_for(obj)"
            ) from None

    def _learned(self, front: _AsyncOps) -> None:
        """A view's front read its table's columns: its store knows them from now on."""
        if self._parent is not None:
            known = self._parent._front(type(front), front.target, front._declared, front._mapped)
            if known._columns is None:
                known._columns = front._columns

    async def acquire(
        self,
        name: str,
        *,
        owner: str,
        ttl: float,
        wait: float | None = None,
        heartbeat: bool = False,
        on_lost: Callable[[AsyncLease], Any] | None = None,
    ) -> AsyncLease:
        """Acquire a lease, waiting up to ``wait`` seconds; ``LeaseHeld`` if still held."""
        name, owner, ttl = check_lease_args(name, owner, ttl)
        wait = check_wait(wait)
        started = now_ns() if HUB.on else 0
        waits = 0

        async def handle(step: Any) -> Any:
            nonlocal waits
            if isinstance(step, AcquireStep):
                return await self._live().acquire(name, owner, ttl)
            waits += 1
            return await sleep_async(step.seconds)

        answer: LeaseAnswer = await adrive(lease_wait_flow(wait), handle)
        if HUB.on or log.isEnabledFor(LEVEL[True]):
            token = answer.row.token if answer.granted and answer.row is not None else None
            outcome = "acquired" if answer.granted else "held"
            lease_event("lease.acquire", self, name, outcome, token, started, waits)
        if not answer.granted:
            raise held(name, answer)
        lease = AsyncLease(self, name, owner, ttl, answer)
        if heartbeat or on_lost is not None:
            lease.start_heartbeat(on_lost=on_lost)
        return lease

    async def try_acquire(self, name: str, *, owner: str, ttl: float) -> AsyncLease | None:
        """Acquire a lease if it is free now; None if it is held."""
        try:
            return await self.acquire(name, owner=owner, ttl=ttl)
        except LeaseHeld:
            return None

    def lease(
        self,
        name: str,
        *,
        owner: str,
        ttl: float,
        wait: float | None = None,
        heartbeat: bool = False,
        on_lost: Callable[[AsyncLease], Any] | None = None,
    ) -> AsyncLeaseContext:
        """``with store.lease(...) as lease:``; the lease is released on exit."""
        self._check_open()
        check_lease_args(name, owner, ttl)
        check_wait(wait)
        kwargs = {"name": name, "owner": owner, "ttl": ttl, "wait": wait}
        return AsyncLeaseContext(self, {**kwargs, "heartbeat": heartbeat, "on_lost": on_lost})

    async def migrate(self) -> None:
        """Create or upgrade fencing's own tables (idempotent)."""
        await self._live().migrate()

    async def guard_table(
        self, name: str, *, version: str = "version", key: str = "id", mode: str = "bump"
    ) -> None:
        """Install the guard trigger ``fencing_guard_<name>`` on a table you own (SQL
        stores; idempotent). Any UPDATE that leaves ``version`` unchanged (a blind ORM
        save, a hand-written UPDATE) then bumps it by one, so every outstanding intent
        on the row is Stale; one that sets it lower is refused by the database
        (``GuardRefused`` inside fencing). ``mode="strict"`` refuses the blind UPDATE
        too, instead of bumping (for staging and tests: it finds blind writers); the
        trigger is replaced when the mode changes. ``key`` is the table's key column
        (SQLite's trigger finds the row by it: it must be unique). ``name`` may be
        ``schema.table``: the trigger, still ``fencing_guard_<table>``, is made in that
        schema. ``fencing migrate URL --guard-table`` does the same.
        """
        await self._live().guard_table(guard_target(name, key, version, mode))

    async def unguard_table(self, name: str) -> None:
        """Remove the guard trigger from table ``name`` (fine if there is none), whatever
        version column it guards."""
        await self._live().unguard_table(guard_target(name, "id", "version"))

    async def effects_to_reconcile(self, *, limit: int = 100) -> list[Effect]:
        """Effects of intents that ended stale, fenced, contended or missing, not yet
        marked reconciled; oldest first. ``fencing reconcile URL`` lists the same."""
        return await self._live().list_effects(reconcile_query(limit))

    async def pending_effects(
        self, *, older_than: float = 3600.0, limit: int = 100
    ) -> list[Effect]:
        """Effects whose work has neither committed nor ended, untouched for ``older_than``
        seconds: a task that made its call and then vanished (killed for good and never
        redelivered, or failed while the store was unreachable). Oldest first; marking
        one reconciled takes it off this list too. Reads every effect: for a check, not
        a hot path."""
        return await self._live().list_effects(pending_query(older_than, limit))

    async def get_effect(self, idempotency_key: str) -> Effect | None:
        """One effect by its idempotency key, or None."""
        found = await self._live().list_effects(key_query(idempotency_key))
        return found[0] if found else None

    async def mark_reconciled(self, effect: Effect | str) -> Effect:
        """Mark an effect (or its idempotency key) reconciled. Idempotent: marking it
        again changes nothing and returns it; ``RecordNotFound`` if there is none."""
        key = effect_ref(effect)
        return found_effect(await self._live().mark_effect(key, None, None, True), key)

    async def prune(self, older_than: float | None = None) -> int:
        """Forget what is older than the retention horizon; returns how many rows.

        Applied intent ids (a replay after that is refused as ``Stale``, no longer
        recognised as ``Duplicate``), and effects finished with: never settled (their
        work committed) and untouched since, or reconciled since. An effect that needs
        reconciling is kept, however old.
        """
        age = self.options.retention if older_than is None else older_than
        # effects first: whether one's work committed is told by its applied id
        effects = await self._live().prune_effects(age)
        return effects + await self._live().prune(age)

    async def close(self) -> None:
        """Close the store (idempotent); every later call on it raises ``StoreClosed``."""
        self._closed = True
        await self.backend.close()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
