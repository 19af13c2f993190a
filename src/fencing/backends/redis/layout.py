"""Where fencing's keys live in Redis, and which Cluster hash slot a key is in: pure
string building (the layout itself is described in ``docs/backends/redis.md``)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from ..._errors import ConfigurationError, InvalidIdentifier
from ..._request import Target

__all__ = ["Layout", "key_slot"]

_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
_TABLE_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{0,128}")
#: The kinds of fencing's own keys, ``<prefix>:<kind>:...`` (and ``<prefix>:schema``):
#: each is followed by ``:``, so no two kinds share a key (see ``Layout.check_table``).
_KINDS: Final = ("c", "lease", "table", "t", "fx")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where fencing's keys live; pure string building (see ``docs/backends/redis.md``)."""

    prefix: str = "fencing"
    table_prefix: str = ""
    cluster: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or _PREFIX.fullmatch(self.prefix) is None:
            raise ConfigurationError(
                f"redis prefix {self.prefix!r}: use 1 to 64 letters, digits and '_ . : -'"
            )
        if not isinstance(self.table_prefix, str) or not _TABLE_PREFIX.fullmatch(self.table_prefix):
            raise ConfigurationError(
                f"redis table_prefix {self.table_prefix!r}: use up to 128 letters, digits"
                " and '_ . : -'"
            )

    def check_table(self, name: str) -> str:
        """Refuse a table whose rows could be named like one of fencing's own keys.

        A row is ``<table_prefix><table>:<key>`` with any key, so it could be any key
        that starts with ``<table_prefix><table>:``; fencing's keys are ``<prefix>:schema``
        and ``<prefix>:<kind>:...`` for the kinds in ``_KINDS``. With the default empty
        ``table_prefix`` the table named like the prefix would address them all (a
        commit to its row ``lease:{name}`` set that lease's token back to 0).
        """
        rows = f"{self.table_prefix}{name}:"
        own = f"{self.prefix}:"
        if own.startswith(rows) or any(rows.startswith(f"{own}{kind}:") for kind in _KINDS):
            raise InvalidIdentifier(
                f"redis: table {name!r} with table_prefix {self.table_prefix!r} would name"
                f" its rows like fencing's own keys (prefix {self.prefix!r}): choose another"
                " table name or table_prefix"
            )
        return name

    def tag(self, target: Target, key: str | int) -> str:
        """The hash tag of a record: also the name of a lease that shares its slot."""
        if target.kind == "collection":
            return f"{target.name}/{key}"
        return f"{self.table_prefix}{self.check_table(target.name)}:{key}"

    def record_keys(self, target: Target, key: str | int) -> tuple[str, str, str]:
        """A record's own key, its applied set and its fence key (all in one hash slot).

        A collection keeps its fence in the record (field ``f``): its fence key is the
        record's. A table row is the user's hash ``<table_prefix><table>:<key>``.
        """
        tag = self.tag(target, key)
        if target.kind == "collection":
            base = f"{self.prefix}:c:{target.name}:{{{tag}}}"
            return f"{base}:rec", f"{base}:applied", f"{base}:rec"
        base = f"{self.prefix}:t:{target.name}:{{{tag}}}"
        return self.row(target.name, key), f"{base}:applied", f"{base}:fence"

    def record(self, target: Target, key: str | int) -> str:
        return self.record_keys(target, key)[0]

    def tombstone(self, target: Target, key: str | int) -> str:
        """A deleted collection record's last version (same slot as the record)."""
        return f"{self.prefix}:c:{target.name}:{{{self.tag(target, key)}}}:tomb"

    def applied(self, target: Target, key: str | int) -> str:
        return self.record_keys(target, key)[1]

    def fence(self, target: Target, key: str | int) -> str:
        return self.record_keys(target, key)[2]

    def row(self, table: str, key: str | int) -> str:
        """The hash holding a guarded table's row (owned by the user)."""
        return f"{self.table_prefix}{self.check_table(table)}:{key}"

    def lease(self, name: str) -> str:
        return f"{self.prefix}:lease:{{{name}}}"

    def table(self, name: str) -> str:
        return f"{self.prefix}:table:{self.check_table(name)}"

    @property
    def schema(self) -> str:
        return f"{self.prefix}:schema"

    @property
    def effects(self) -> str:
        """The start of every effects key: one hash tag (one slot) for all of them."""
        return f"{self.prefix}:fx:{{{self.prefix}}}"

    @property
    def effect_rows(self) -> str:
        """The hash of every effect: idempotency key -> its row as JSON."""
        return f"{self.effects}:rows"

    @property
    def effects_open(self) -> str:
        """The keys of the effects that need reconciling, scored by recorded_at."""
        return f"{self.effects}:open"

    def effect_intent(self, scope: str, intent_id: str) -> str:
        """The keys of one intent's effects, scored by recorded_at.

        Named by a digest: scopes and intent ids may hold ``:``, and the name must never
        end in ``:applied`` (``prune`` scans those).
        """
        digest = hashlib.sha256(f"{scope}\n{intent_id}".encode()).hexdigest()[:40]
        return f"{self.effects}:intent:{digest}"

    @property
    def applied_pattern(self) -> str:
        return f"{self.prefix}:*:applied"


def key_slot(key: str) -> int:
    """The Redis Cluster hash slot of ``key`` (CRC16 of its hash tag, mod 16384)."""
    from redis.crc import key_slot as crc_slot

    return int(crc_slot(key.encode()))
