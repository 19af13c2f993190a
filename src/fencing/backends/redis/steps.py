"""The steps Redis's flows yield and its drivers carry out (``fencing._flow``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Command", "Each", "Load", "Scan", "Send", "Step"]

#: One Redis command: its name and arguments.
Command = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Send:
    """Send these commands in one round trip; replies come back in order, error
    replies as exception values."""

    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True)
class Load:
    """SCRIPT LOAD every script (on every primary of a Cluster)."""


@dataclass(frozen=True, slots=True)
class Scan:
    """One SCAN step over keys of type ``kind`` (applied sets unless told): ``state`` is
    (node index, cursor). Its result is ``(the next state or None at the end, the keys
    found)``: see ``replies.scan_reply``."""

    state: tuple[int, int]
    match: str
    kind: str = "zset"


@dataclass(frozen=True, slots=True)
class Each:
    """Send these commands to every primary of a Cluster (to the server when standalone);
    the replies come back as one list per node, error replies raised."""

    commands: tuple[Command, ...]


Step = Send | Load | Scan | Each
