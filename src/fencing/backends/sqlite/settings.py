"""SQLite's options: ``sqlite:///path.db?synchronous=normal&busy_timeout=30``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from ..._errors import ConfigurationError
from ..._url import StoreURL

__all__ = ["Settings", "settings_from_url"]

_SYNC_MODES: Final = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}


@dataclass(frozen=True, slots=True)
class Settings:
    """``path`` (``:memory:`` for a private in-memory database), ``synchronous`` (SQLite's
    PRAGMA: FULL by default; NORMAL trades the last commits on power loss for speed) and
    ``busy_timeout`` (seconds another process's write lock is waited for). ``create``
    False (``fencing.open(url, migrate="check")``): a file that does not exist is not
    made, and an existing one is not switched to WAL (fencing's own already is)."""

    path: str
    synchronous: str = "FULL"
    busy_timeout: float = 30.0
    create: bool = True

    @property
    def memory(self) -> bool:
        return self.path == ":memory:"


def settings_from_url(url: StoreURL, options: dict[str, Any]) -> Settings:
    synchronous = str(options.pop("synchronous", url.option("synchronous", "full")))
    mode = _SYNC_MODES.get(synchronous.lower())
    if mode is None:
        raise ConfigurationError(
            f"sqlite synchronous={synchronous!r}: use full (default), normal or extra"
        )
    try:
        busy = float(options.pop("busy_timeout", url.option("busy_timeout", "30")))
    except ValueError:
        busy = math.nan
    if not 0 <= busy <= 3600:  # also refuses nan and inf
        raise ConfigurationError("sqlite busy_timeout must be 0 to 3600 seconds")
    create = options.pop("create", True)
    if not isinstance(create, bool):
        raise ConfigurationError("sqlite create must be True or False")
    unknown = (set(url.options) - {"synchronous", "busy_timeout"}) | set(options)
    if unknown:
        raise ConfigurationError(f"unknown sqlite option(s) {sorted(unknown)}")
    return Settings(url.path, mode, busy, create)
