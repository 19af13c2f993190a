"""The public surface: ``fencing.__all__`` is exactly what is documented, and nothing leaks."""

from __future__ import annotations

import importlib
import inspect
import types

import pytest

import fencing

# The documented public surface. Adding a name is a decision: add it here too.
PUBLIC = [
    "DEFAULT_RETENTION",
    "SKIP",
    "AlreadyExists",
    "AsyncCollection",
    "AsyncLease",
    "AsyncOutbox",
    "AsyncStore",
    "AsyncTable",
    "Collection",
    "Committed",
    "ConfigurationError",
    "Contended",
    "Drop",
    "Duplicate",
    "Effect",
    "FenceReason",
    "Fenced",
    "FencingError",
    "GuardRefused",
    "Intent",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidIntent",
    "InvalidLeaseRequest",
    "InvalidState",
    "Lease",
    "LeaseError",
    "LeaseHeld",
    "LeaseExpired",
    "LeaseLost",
    "LockTimeout",
    "Missing",
    "MissingDependency",
    "Outbox",
    "OutboxClaim",
    "OutboxMessage",
    "OutboxRow",
    "OutboxRowError",
    "OutboxRowNotDead",
    "OutboxStats",
    "Outcome",
    "Recompute",
    "Reconcile",
    "Record",
    "RecordNotFound",
    "SchemaError",
    "SelfDeadlock",
    "SerializationFailure",
    "Signer",
    "SkipType",
    "Skipped",
    "Stale",
    "StalePolicy",
    "Store",
    "StoreClosed",
    "StoreError",
    "StoreNotMigrated",
    "Table",
    "TransientStoreError",
    "UnknownOutboxRow",
    "WrongEventLoop",
    "__version__",
    "open_async",
]

# Public, but left out of ``__all__`` so that ``from fencing import *`` does not shadow
# the builtin of the same name.
PUBLIC_NOT_STARRED = ["open"]

# The names DESIGN.md makes the contract ("add more freely, rename none").
DESIGN_NAMES = [
    "open",
    "open_async",
    "Intent",
    "Record",
    "Signer",
    "Drop",
    "Recompute",
    "Reconcile",
    "SKIP",
    "Committed",
    "Stale",
    "Duplicate",
    "Fenced",
    "Missing",
    "Skipped",
    "Contended",
    "FencingError",
    "LeaseHeld",
    "InvalidIntent",
    "AlreadyExists",
]

# Submodules are attributes of the package once imported; they are not re-exports.
SUBPACKAGES = {"backends", "contrib", "testing"}


def test_all_is_exactly_the_documented_surface() -> None:
    assert sorted(fencing.__all__) == sorted(PUBLIC)
    assert len(fencing.__all__) == len(set(fencing.__all__))


def test_every_exported_name_exists() -> None:
    for name in fencing.__all__:
        assert hasattr(fencing, name), name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from fencing import *", namespace)
    namespace.pop("__builtins__")
    assert sorted(namespace) == sorted(fencing.__all__)


def test_nothing_private_is_exported() -> None:
    private = [n for n in fencing.__all__ if n.startswith("_") and n != "__version__"]
    assert private == []


def test_nothing_public_is_left_out_of_all() -> None:
    leaked = []
    for name, value in vars(fencing).items():
        if name.startswith("_") or name in fencing.__all__ or name in PUBLIC_NOT_STARRED:
            continue
        if isinstance(value, types.ModuleType) and name in SUBPACKAGES:
            continue
        if name == "annotations" and value.__class__.__name__ == "_Feature":
            continue  # ``from __future__ import annotations``
        leaked.append(name)
    assert leaked == []


def test_exported_objects_come_from_fencing() -> None:
    for name in fencing.__all__:
        value = getattr(fencing, name)
        module = getattr(value, "__module__", None)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert module is not None and module.startswith("fencing"), (name, module)


def test_design_contract_names_exist() -> None:
    for name in DESIGN_NAMES:
        if name in PUBLIC_NOT_STARRED:
            assert callable(getattr(fencing, name)), name
        else:
            assert name in fencing.__all__, name


def test_star_import_does_not_shadow_builtins() -> None:
    import builtins

    namespace: dict[str, object] = {}
    exec("from fencing import *", namespace)
    shadowed = [n for n in namespace if n != "__builtins__" and hasattr(builtins, n)]
    assert shadowed == []
    for name in PUBLIC_NOT_STARRED:
        assert name not in fencing.__all__
        assert getattr(fencing, name).__module__.startswith("fencing"), name


def test_every_error_derives_from_fencing_error() -> None:
    errors = [
        getattr(fencing, n)
        for n in fencing.__all__
        if inspect.isclass(getattr(fencing, n)) and issubclass(getattr(fencing, n), Exception)
    ]
    assert len(errors) >= 15
    for error in errors:
        assert issubclass(error, fencing.FencingError), error
    assert issubclass(fencing.InvalidInput, ValueError)
    for bad_input in ("InvalidIntent", "InvalidState", "InvalidIdentifier", "InvalidLeaseRequest"):
        assert issubclass(getattr(fencing, bad_input), fencing.InvalidInput)
    assert issubclass(fencing.MissingDependency, fencing.ConfigurationError)
    assert issubclass(fencing.MissingDependency, ImportError)
    assert issubclass(fencing.LeaseHeld, fencing.LeaseError)
    assert issubclass(fencing.LeaseLost, fencing.LeaseError)
    assert issubclass(fencing.LeaseExpired, fencing.LeaseLost)
    assert issubclass(fencing.TransientStoreError, fencing.StoreError)
    assert issubclass(fencing.LockTimeout, fencing.TransientStoreError)
    assert issubclass(fencing.SelfDeadlock, fencing.LockTimeout)
    assert issubclass(fencing.SerializationFailure, fencing.TransientStoreError)
    assert issubclass(fencing.StoreClosed, fencing.StoreError)
    assert issubclass(fencing.StoreNotMigrated, fencing.SchemaError)
    assert issubclass(fencing.WrongEventLoop, fencing.StoreError)
    assert issubclass(fencing.RecordNotFound, LookupError)
    for outbox_error in ("UnknownOutboxRow", "OutboxRowNotDead"):
        assert issubclass(getattr(fencing, outbox_error), fencing.OutboxRowError)
    assert issubclass(fencing.OutboxRowError, fencing.InvalidInput)
    assert issubclass(fencing.UnknownOutboxRow, LookupError)


OUTCOMES = ("Committed", "Stale", "Duplicate", "Fenced", "Missing", "Skipped", "Contended")


def test_outcomes_share_a_base() -> None:
    for name in OUTCOMES:
        assert issubclass(getattr(fencing, name), fencing.Outcome), name


def test_outcome_is_the_closed_union_of_the_seven() -> None:
    import typing

    assert set(typing.get_args(fencing.Outcome)) == {getattr(fencing, n) for n in OUTCOMES}
    assert not isinstance(object(), fencing.Outcome)
    assert isinstance(fencing.Missing(), fencing.Outcome)


def test_skip_type_is_exported() -> None:
    assert isinstance(fencing.SKIP, fencing.SkipType)


@pytest.mark.parametrize(
    ("cls", "methods"),
    [
        ("Store", ["collection", "table", "lease", "acquire", "try_acquire", "migrate", "close"]),
        ("Store", ["effects_to_reconcile", "get_effect", "mark_reconciled"]),
        ("Collection", ["create", "get", "delete", "intent", "commit", "commit_many", "apply"]),
        ("Collection", ["effect", "effect_done", "effect_failed", "effects", "abandon"]),
        ("Table", ["get", "intent", "commit", "commit_many", "apply"]),
        ("Table", ["effect", "effect_done", "effect_failed", "effects", "abandon"]),
        ("Effect", ["to_dict"]),
        ("Lease", ["renew", "release", "start_heartbeat", "stop_heartbeat"]),
        ("Record", ["intent", "to_dict"]),
        ("Intent", ["to_json", "from_json", "to_dict", "from_dict", "new", "derive"]),
        ("Signer", ["sign", "verify"]),
    ],
)
def test_design_methods_exist(cls: str, methods: list[str]) -> None:
    target = getattr(fencing, cls)
    for method in methods:
        assert callable(getattr(target, method, None)), f"{cls}.{method}"


@pytest.mark.parametrize(
    ("sync", "asynchronous"),
    [
        ("Store", "AsyncStore"),
        ("Collection", "AsyncCollection"),
        ("Table", "AsyncTable"),
        ("Lease", "AsyncLease"),
    ],
)
def test_sync_and_async_fronts_have_the_same_methods(sync: str, asynchronous: str) -> None:
    def public(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    s, a = getattr(fencing, sync), getattr(fencing, asynchronous)
    assert public(s) == public(a)


def test_async_store_calls_are_awaitable_and_factories_are_not() -> None:
    factories = {"collection", "table", "lease"}
    effects = ("effects_to_reconcile", "get_effect", "mark_reconciled")
    for name in ("acquire", "try_acquire", "migrate", "prune", "close", *effects):
        assert inspect.iscoroutinefunction(getattr(fencing.AsyncStore, name)), name
    for name in ("effect", "effect_done", "effect_failed", "effects", "abandon"):
        assert inspect.iscoroutinefunction(getattr(fencing.AsyncCollection, name)), name
        assert not inspect.iscoroutinefunction(getattr(fencing.Collection, name)), name
    for name in factories:
        assert not inspect.iscoroutinefunction(getattr(fencing.AsyncStore, name)), name
    for name in ("create", "get", "delete", "intent", "commit", "commit_many", "apply"):
        assert inspect.iscoroutinefunction(getattr(fencing.AsyncCollection, name)), name
    for name in ("renew", "release", "stop_heartbeat"):
        assert inspect.iscoroutinefunction(getattr(fencing.AsyncLease, name)), name
    for name in ("collection", "table", "lease", "acquire", "try_acquire", "migrate", "close"):
        assert not inspect.iscoroutinefunction(getattr(fencing.Store, name)), name
    for name in ("create", "get", "delete", "intent", "commit", "commit_many", "apply"):
        assert not inspect.iscoroutinefunction(getattr(fencing.Collection, name)), name


def test_outcome_committed_and_lease_token_are_attributes() -> None:
    assert fencing.Committed.committed is True
    for name in ("Stale", "Duplicate", "Fenced", "Missing", "Skipped", "Contended"):
        assert getattr(fencing, name).committed is False, name
    slots = [getattr(c, "__slots__", ()) for c in fencing.Lease.__mro__]
    assert any("token" in s for s in slots)
    assert any("lost" in s for s in slots)


def test_testing_module_is_public_and_complete() -> None:
    testing = importlib.import_module("fencing.testing")
    names = getattr(testing, "__all__", [])
    assert names, "fencing.testing must declare its public names"
    for name in names:
        assert hasattr(testing, name), name
        assert not name.startswith("_"), name
