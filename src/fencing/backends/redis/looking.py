"""Redis's reads for looking (``fencing inspect``, ``fencing stats``): read-only.

``applied`` reads one record's applied set (one command, in the record's slot). ``stats``
walks the keyspace with SCAN, on every primary of a Cluster: collection records
(``<prefix>:c:<name>:{tag}:rec``), applied sets (``...:applied``), the effect rows (their
one hash, a page at a time, by the ``scan_effects`` script), declared tables
(``<prefix>:table:<name>``) and their rows (``<table_prefix><table>:<key>`` hashes), and
lease hashes (``<prefix>:lease:{name}``, each read by ``lease_state``). It is a walk, not
a snapshot: counts made while workers write are each true at some moment of it. A table
row's lease is counted under either name: ``<table>/<key>`` or the one that shares the
row's Cluster slot, ``<table_prefix><table>:<key>``.
"""

from __future__ import annotations

from collections import Counter

from ..._flow import Flow
from ..._request import AppliedIntent, StoreStats, Target, scope_stats, stats_scopes
from .effects import EffectFlows
from .replies import as_int, as_list, as_text, effect_reply, lease_answer
from .scripts import run_calls, script_call, send
from .steps import Scan

__all__ = ["LookFlows"]


def _scope_of(key: str, start: int) -> tuple[str, str]:
    """``(kind letter, name)`` of ``<prefix>:<c|t>:<name>:{tag}:...`` (``start``: the
    length of ``<prefix>:``). A name holds no ``{``, so the first ``:{`` ends it."""
    return key[start], key[start + 2 : key.index(":{", start + 2)]


class LookFlows(EffectFlows):
    """The flows ``applied`` and ``stats`` of ``_contract.Flows`` for Redis."""

    __slots__ = ()

    def applied(self, target: Target, key: str | int, limit: int) -> Flow[list[AppliedIntent]]:
        name = self.settings.layout.applied(target, key)
        (found,) = yield from send([("ZREVRANGE", name, 0, limit - 1, "WITHSCORES")])
        items = as_list(found)
        pairs = zip(items[0::2], items[1::2], strict=True)
        return [AppliedIntent(as_text(i), float(as_text(at)) / 1e6) for i, at in pairs]

    def _keys(self, match: str, kind: str) -> Flow[list[str]]:
        """Every key matching ``match`` of type ``kind``, on every primary."""
        found: list[str] = []
        state: tuple[int, int] | None = (0, 0)
        while state is not None:
            state, keys = yield Scan(state, match, kind)
            found += [as_text(k) for k in keys]
        return found

    def stats(self) -> Flow[StoreStats]:
        settings = self.settings
        layout = settings.layout
        start = len(layout.prefix) + 1
        counted: Counter[str] = Counter()
        for key in (yield from self._keys(f"{layout.prefix}:c:*:rec", "hash")):
            counted[f"c:{_scope_of(key, start)[1]}"] += 1
        records: dict[str, int | None] = dict(counted)
        applied: Counter[str] = Counter()
        applied_keys = yield from self._keys(layout.applied_pattern, "zset")
        for i in range(0, len(applied_keys), 500):
            page = applied_keys[i : i + 500]
            sizes = yield from send([("ZCARD", k) for k in page])
            for key, size in zip(page, sizes, strict=True):
                letter, name = _scope_of(key, start)
                applied[f"{letter}:{name}"] += as_int(size)
        effects: dict[str, Counter[str]] = {}
        cursor, now_us = "0", 0
        while True:
            call = script_call(layout, "scan_effects", [layout.effect_rows], [cursor, "200"])
            page_reply = as_list((yield from run_calls(settings, [call], write=False))[0])
            cursor, now_us = as_text(page_reply[0]), as_int(page_reply[1])
            for row in page_reply[2:]:
                effect = effect_reply(row)
                counts = effects.setdefault(effect.scope, Counter())
                counts[effect.status] += 1
                counts["reconcile"] += effect.needs_reconcile
            if cursor == "0":
                break
        tables_at = f"{layout.prefix}:table:"
        declared = {
            key[len(tables_at) :] for key in (yield from self._keys(f"{tables_at}*", "set"))
        }
        tables = {s[2:] for s in stats_scopes(records, applied, effects) if s[0] == "t"}
        for table in sorted(tables | declared):
            rows = None
            if table in declared:  # its rows: the hashes ``<table_prefix><table>:<key>``
                rows = len((yield from self._keys(f"{layout.table_prefix}{table}:*", "hash")))
            records[f"t:{table}"] = rows
        lease_keys = yield from self._keys(f"{layout.prefix}:lease:*", "hash")
        held: list[str] = []
        now = now_us / 1e6
        for i in range(0, len(lease_keys), 500):
            page = lease_keys[i : i + 500]
            calls = [script_call(layout, "lease_state", [k], []) for k in page]
            replies = yield from run_calls(settings, calls, write=False)
            for key, reply in zip(page, replies, strict=True):
                name = key[len(layout.lease("")) - 1 : -1]  # ``<prefix>:lease:{name}``
                answer = lease_answer(name, reply)
                if answer.row is not None and answer.row.held_at(answer.now):
                    held.append(name)
        # a lease named after its record: ``<collection>/<key>``, and for a table row
        # also ``<table_prefix><table>:<key>``, the name that shares the row's slot
        by_scope = {}
        for scope in stats_scopes(records, applied, effects):
            starts = [f"{scope[2:]}/"]
            if scope.startswith("t:"):
                starts.append(f"{layout.table_prefix}{scope[2:]}:")
            by_scope[scope] = sum(1 for name in held if name.startswith(tuple(starts)))
        return StoreStats(scope_stats(records, applied, effects, by_scope), len(held), now)
