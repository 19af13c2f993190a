"""MySQL's errors, translated where the driver is called (``raise translate(exc) from exc``)::

    pymysql.err.* (and mysqlclient's MySQLdb.*: the same numbers)
    ├── 1062 duplicate key                     -> DuplicateKey (create: AlreadyExists)
    ├── 1213 deadlock (rolled back)            -> Deadlock: the flow starts its
    │                                             transaction again, a few times
    ├── 2002/2003/2006/2013/2055, 1040, 1053,   -> TransientStoreError (outcome unknown:
    │   1205 lock wait, 1317, 1927, 4031,          retry with the same intent)
    │   socket errors
    ├── 1044/1045/1049/1698                    -> ConfigurationError
    ├── 1146 unknown table, 1054 unknown column -> SchemaError
    ├── 1048/1264/1265/1292/1366/1406: a value  -> InvalidState (rolled back: nothing
    │   a user table's column cannot hold          was written)
    ├── 1644 a guard trigger's SIGNAL (``guard``) -> GuardRefused
    ├── UnicodeEncodeError (a lone surrogate)   -> InvalidInput (before sending)
    └── anything else                          -> StoreError

Also here: which errors are the driver's (``is_driver_error``), whether one left the
connection in step (``in_step``), ``translated`` (an exception raised again unless it is
the driver's), and the driver's import (``driver_module``: a missing
driver is ``MissingDependency`` naming the extra).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Final

from ..._checks import is_guard_refusal
from ..._errors import (
    ConfigurationError,
    FencingError,
    GuardRefused,
    InvalidInput,
    InvalidState,
    MissingDependency,
    SchemaError,
    StoreError,
    TransientStoreError,
)

__all__ = [
    "DEADLOCK",
    "NO_SAVEPOINT",
    "Deadlock",
    "DuplicateKey",
    "TransactionRolledBack",
    "driver_module",
    "errno",
    "in_step",
    "is_driver_error",
    "translate",
    "translated",
]

# The server refused what the URL says: retrying cannot fix it.
_CONFIGURATION: Final = frozenset(
    {
        1044,  # access denied for user to database
        1045,  # access denied (user or password)
        1049,  # unknown database
        1698,  # access denied (auth plugin, e.g. unix_socket)
    }
)
# The driver's error numbers (server and client) fencing treats as transient.
_TRANSIENT: Final = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1158,  # network read error
        1159,  # network read timeout
        1160,  # network write error
        1161,  # network write timeout
        1205,  # lock wait timeout exceeded
        1213,  # deadlock; the transaction was rolled back
        1317,  # query execution was interrupted
        1927,  # MariaDB: connection was killed
        2002,  # can't connect (socket)
        2003,  # can't connect (TCP)
        2006,  # server has gone away
        2013,  # lost connection during query
        2055,  # lost connection (system error)
        4031,  # MySQL 8: disconnected by the server for inactivity
    }
)
_SCHEMA_ERRORS: Final = frozenset({1146, 1054})
# A value a user table's column cannot hold (too long, out of range, NULL in NOT NULL,
# not a number, not in the column's character set): the statement failed and the
# transaction is rolled back, so nothing was written.
_DATA_ERRORS: Final = frozenset({1048, 1264, 1265, 1292, 1366, 1406})
_DUPLICATE_KEY: Final = 1062
_DEADLOCK: Final = 1213
DEADLOCK: Final = _DEADLOCK
NO_SAVEPOINT: Final = 1305  # SAVEPOINT ... does not exist (the transaction is gone)
_SIGNAL: Final = 1644  # SIGNAL SQLSTATE '45000' (a guard trigger's refusal, ``guard``)


class Deadlock(TransientStoreError):
    """InnoDB chose this transaction as a deadlock's victim and rolled it all back: the
    flow may start it again (``flows.restarting``)."""


class TransactionRolledBack(TransientStoreError):
    """On a caller's connection (``store.using``): the server rolled back the caller's
    whole transaction (a deadlock's victim, say). Nothing of it remains, fencing's writes
    nor the caller's: the caller rolls back and runs the whole transaction again. Not a
    ``Deadlock``: a flow never starts again on its own inside a caller's transaction."""


class DuplicateKey(StoreError):
    """A duplicate key (1062): ``AlreadyExists`` where the flow knows which record."""


def driver_module(name: str) -> Any:
    """The driver's module ``name``; ``MissingDependency`` naming the extra if missing."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            f"the mysql backend needs {exc.name}: pip install 'fencing[mysql]'"
        ) from exc


def errno(exc: BaseException) -> int | None:
    """The driver error's number (None if it has none)."""
    return _errno(exc)


def _errno(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def in_step(exc: BaseException) -> bool:
    """Whether a driver error raised mid-batch left the connection in step: only an
    error the server sent (an error packet ends the script's results; the 2000s are the
    client library's own codes), and not one the driver made of another exception
    (a signal handler's, raised while it read)."""
    code = _errno(exc)
    server = code is not None and not 2000 <= code < 3000
    return server and exc.__context__ is None and exc.__cause__ is None


def _mysqldb_errors() -> tuple[type[BaseException], ...]:
    """mysqlclient's ``MySQLError`` and ``InterfaceError``, once it is imported (a
    connection of it given to ``store.using``); none before."""
    mysqldb = sys.modules.get("MySQLdb")
    if mysqldb is None or not hasattr(mysqldb, "MySQLError"):
        return ()
    return (mysqldb.MySQLError, mysqldb.InterfaceError)


def is_driver_error(exc: BaseException) -> bool:
    """Whether ``exc`` is PyMySQL's (aiomysql raises PyMySQL's), mysqlclient's, or the
    socket's or codec's under them."""
    pymysql = driver_module("pymysql")
    if isinstance(exc, pymysql.err.MySQLError | OSError | UnicodeError):
        return True
    found = _mysqldb_errors()
    return bool(found) and isinstance(exc, found[0])


def translate(exc: BaseException) -> FencingError:
    """The fencing error for a driver error (``raise translate(exc) from exc``)."""
    code = _errno(exc)
    text = f"mysql: {exc}"
    if isinstance(exc, UnicodeEncodeError):  # raised while escaping: nothing was sent
        return InvalidInput(f"mysql: a value cannot be sent as UTF-8 ({exc})")
    if code == _DUPLICATE_KEY:
        return DuplicateKey(text)
    if code == _DEADLOCK:
        return Deadlock(text)
    if code in _CONFIGURATION:
        return ConfigurationError(f"{text} (the URL's database or credentials)")
    pymysql = driver_module("pymysql")
    interface = (OSError, pymysql.err.InterfaceError, *_mysqldb_errors()[1:])
    if code in _TRANSIENT or isinstance(exc, interface):
        return TransientStoreError(text)
    if code in _SCHEMA_ERRORS:
        return SchemaError(f"{text} (run store.migrate() / fencing migrate URL?)")
    if code in _DATA_ERRORS:
        return InvalidState(f"{text}; nothing was written")
    if code == _SIGNAL and is_guard_refusal(text):
        return GuardRefused(f"{text}; nothing was written")
    return StoreError(text)


def translated(exc: Exception) -> FencingError:
    """``exc`` translated if it is the driver's (``raise translated(exc) from exc``);
    any other exception is raised again as it is."""
    if isinstance(exc, FencingError) or not is_driver_error(exc):
        raise exc
    return translate(exc)
