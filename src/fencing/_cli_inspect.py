"""``fencing inspect URL NAME KEY``: one record of a collection, or one row of a guarded
table, with what the store knows about it: its version and fence, the lease named
after it (``<name>/<key>``, the record-lease convention of ``docs/leases.md``) and the
last intent ids recorded as applied to it.

Without ``--table`` it looks for a collection record first, then a table row, and says
which it found. Exit status: 0 found, 1 not found, 2 bad input (``FencingError``: no
such table with ``--table``, a key of the wrong type, a bad URL).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._url import URL_HELP

if TYPE_CHECKING:
    from ._request import Target
    from ._store import Store
    from ._values import Record

__all__ = ["add_arguments", "run"]

_INT = re.compile(r"-?[0-9]+")
MAX_APPLIED = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="store URL, e.g. sqlite:///app.db" + URL_HELP)
    parser.add_argument(
        "name", metavar="NAME", help="a collection, or a guarded table (see --table)"
    )
    parser.add_argument(
        "key",
        metavar="KEY",
        help="the record's key (a table's key is an integer when it looks like one;"
        " see --key-type)",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="NAME is a guarded table: do not look for a collection record first",
    )
    parser.add_argument(
        "--key-type",
        choices=("auto", "int", "str"),
        default="auto",
        help="a table key's type: auto (an integer when KEY is one), int or str",
    )
    parser.add_argument(
        "--key-column", default="id", metavar="COLUMN", help="the table's key column (id)"
    )
    versions = parser.add_mutually_exclusive_group()
    versions.add_argument(
        "--version-column",
        default="version",
        metavar="COLUMN",
        help="the table's version column (version)",
    )
    versions.add_argument(
        "--no-version-column",
        dest="version_column",
        action="store_const",
        const=None,
        help="the table has no version column (its intents carry a guard instead)",
    )
    parser.add_argument(
        "--lease",
        default=None,
        metavar="NAME",
        help="the lease to show (default NAME/KEY, the record-lease convention)",
    )
    parser.add_argument(
        "--applied",
        type=int,
        default=10,
        metavar="N",
        help="show the last N intents recorded as applied to the key (10; 0: none)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON even on a terminal (always parseable)"
    )


def _table_key(key: str, key_type: str) -> str | int:
    from ._errors import InvalidInput

    if key_type == "str" or (key_type == "auto" and _INT.fullmatch(key) is None):
        return key
    try:
        return int(key)
    except ValueError:
        raise InvalidInput(f"key {key!r} is not an integer (--key-type int)") from None


def _find(store: Store, args: argparse.Namespace) -> tuple[Record | None, Target | None, str]:
    """The record and where it is, or None and what was looked at (the message)."""
    from ._errors import InvalidIdentifier, SchemaError

    looked: list[str] = []
    if not args.table:
        try:
            collection = store.collection(args.name)
        except InvalidIdentifier:
            pass  # not a collection's name: a table's, perhaps
        else:
            record = collection.get(args.key)
            if record is not None:
                return record, collection.target, ""
            looked.append(f"no record {args.key!r} in collection {args.name!r}")
    try:
        table = store.table(args.name, key=args.key_column, version=args.version_column)
    except InvalidIdentifier:
        if not looked:
            raise  # a name neither a collection nor a table can have
        return None, None, looked[0]
    key = _table_key(args.key, args.key_type)
    try:
        record = table.get(key)
    except SchemaError as exc:
        if args.table:
            raise
        looked.append(f"no table {args.name!r} to look in ({exc})")
    else:
        if record is not None:
            return record, table.target, ""
        looked.append(f"no row {key!r} in table {args.name!r}")
    return None, None, ", and ".join(looked)


def _lease(store: Store, name: str, given: bool) -> dict[str, Any] | None:
    """The lease ``name`` as the store holds it, or None; a name by convention that no
    lease can have (the key holds a character a name cannot) is None, a ``given`` one
    is refused (``InvalidIdentifier``)."""
    from ._errors import InvalidIdentifier
    from ._validate import check_name

    try:
        name = check_name(name, "lease")
    except InvalidIdentifier:
        if given:
            raise
        return None
    answer = store.backend.lease_state(name)
    row = answer.row
    if row is None:
        return None
    held = row.held_at(answer.now)
    return {
        "name": name,
        "token": row.token,
        "owner": row.owner,
        "held": held,
        "expires_in": round(row.expires_at - answer.now, 3) if held else None,
    }


def _lease_names(store: Store, target: Target, record: Record) -> list[str]:
    """The names a record's lease has by convention: ``<name>/<key>``; on Redis a table
    row's may also be the one that shares the row's Cluster slot (``layout.tag``)."""
    names = [f"{record.collection}/{record.key}"]
    layout = getattr(store.backend, "layout", None)
    if target.kind == "table" and layout is not None:
        names.append(layout.tag(target, record.key))
    return names


def inspect(store: Store, args: argparse.Namespace) -> dict[str, Any] | str:
    """What ``fencing inspect`` shows, or the not-found message."""
    record, target, looked = _find(store, args)
    if record is None or target is None:
        return looked
    shown = record.to_dict()
    given = args.lease is not None
    names = [args.lease] if given else _lease_names(store, target, record)
    shown["lease"] = next(filter(None, (_lease(store, name, given) for name in names)), None)
    applied = store.backend.applied(target, record.key, args.applied) if args.applied else []
    shown["applied"] = [{"intent_id": a.intent_id, "applied_at": a.applied_at} for a in applied]
    return shown


def run(args: argparse.Namespace) -> int:
    import fencing

    from ._errors import InvalidInput

    if not 0 <= args.applied <= MAX_APPLIED:
        raise InvalidInput(f"--applied takes a count from 0 to {MAX_APPLIED}, not {args.applied}")
    with fencing.open(args.url, migrate="check") as store:
        shown = inspect(store, args)
    if isinstance(shown, str):
        print(shown, file=sys.stderr)
        return 1
    if shown["kind"] == "table" and not args.table:
        print(f"found in table {args.name!r} (no collection record)", file=sys.stderr)
    if args.json or not sys.stdout.isatty() or not _panel(shown):
        print(json.dumps(strict(shown), indent=2, sort_keys=True, allow_nan=False))
    return 0


def strict(value: Any) -> Any:
    """``value`` as strict JSON holds it (any parser reads it): a table's column value
    beyond JSON as its tag in the intent format (``{"$bytes": <base64>}``,
    ``{"$decimal": "9.50"}``... docs/types.md), a NaN or infinite float as ``{"$float":
    "nan"}`` (``"inf"``, ``"-inf"``), anything else unknown as its text."""
    from ._types import EXTENDED, encode_tagged

    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if isinstance(value, EXTENDED):
        return encode_tagged(value)
    return str(value)


def _panel(shown: dict[str, Any]) -> bool:
    """Print ``shown`` as a rich panel; False if rich is not installed."""
    try:
        from rich.console import Console, Group
        from rich.panel import Panel
        from rich.table import Table
    except ModuleNotFoundError:
        return False
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("version", str(shown["version"]))
    facts.add_row("fence", str(shown["fence"]) if shown["fence"] else "0 (no lease wrote it)")
    lease = shown["lease"]
    if lease is None:
        facts.add_row("lease", "none")
    else:
        holding = (
            f"held by {lease['owner']}, {lease['expires_in']:g} s left"
            if lease["held"]
            else "not held"
        )
        facts.add_row("lease", f"{lease['name']} token {lease['token']} ({holding})")
    state = Table("column" if shown["kind"] == "table" else "field", "value", box=None)
    for field, value in sorted(shown["state"].items()):
        state.add_row(str(field), json.dumps(value, default=str))
    applied = Table("applied intent", "applied", box=None)
    for item in shown["applied"]:
        applied.add_row(item["intent_id"], _when(item["applied_at"]))
    if not shown["applied"]:
        applied.add_row("(none recorded)", "")
    title = f"{shown['kind']} {shown['collection']!r}, key {shown['key']!r}"
    Console(highlight=False).print(Panel(Group(facts, state, applied), title=title))
    return True


def _when(at: float) -> str:
    seconds = time.time() - at
    if not 0 <= seconds < 10 * 365 * 86400:
        return f"{at:.3f}"  # a clock that is not wall time (memory://)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"{stamp} ({seconds:.0f} s ago)"
