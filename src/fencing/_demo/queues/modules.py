"""The queue's demo module, once its extra is installed and its broker answers."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

from ..config import DemoConfig
from ._broker import broker_url, check

MODULES: Final = {
    "celery": "celery_app",
    "rq": "rq_jobs",
    "dramatiq": "dramatiq_actors",
    "arq": "arq_worker",
}


def preflight(config: DemoConfig) -> ModuleType:
    """The queue's module, once its extra is installed and its broker answers (else exit 2)."""
    assert config.queue is not None
    module = queue_module(config.queue)
    check(config.queue, broker_url(config), module.BROKERS)
    return module


def queue_module(queue: str) -> ModuleType:
    """The queue's demo module; ``MissingDependency`` (with the extra to install) if absent."""
    return importlib.import_module(f".{MODULES[queue]}", __package__)


def crashes(queue: str) -> bool:
    """Does the queue run again the message of a worker killed before its ack (``CRASH``)?"""
    return bool(queue_module(queue).CRASH)
