"""The queue demo's worker processes: started, replaced after a crash, and all stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from ..._errors import ConfigurationError
from ._tasks import ENV_PREFIX


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def run_processes(run_id: str) -> list[int]:
    """Live processes whose environment carries this run's id (Linux; [] elsewhere)."""
    marker = f"{ENV_PREFIX}RUN_ID={run_id}".encode()
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and not _gone(int(entry.name)):
            found.append(int(entry.name))
    return found


class Workers:
    """The queue's worker commands, each in its own session, logging to the control dir.

    A worker process killed by SIGKILL is replaced by a new one running the same
    command, at most ``restarts`` times in all: on Dramatiq and arq the demo's crash
    after commit kills a whole worker process (a supervisor would restart it), where
    Celery's and RQ's worker commands replace their own killed child. Any other exit
    of a worker process ends the demo with its log.
    """

    def __init__(
        self,
        run_id: str,
        commands: list[list[str]],
        env: dict[str, str],
        logs: Path,
        restarts: int = 0,
    ):
        self.run_id = run_id
        self.commands = commands
        self.env = env
        self.logs = logs
        self.restarts = restarts
        self.restarted = 0
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for n in range(len(self.commands)):
            self.procs.append(self._spawn(n))

    def _spawn(self, n: int) -> subprocess.Popen[bytes]:
        with open(self.logs / f"worker-{n + 1}.log", "ab") as out:
            return subprocess.Popen(
                self.commands[n],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check(self) -> None:
        for n, proc in enumerate(self.procs):
            if proc.poll() is None:
                continue
            if proc.returncode == -signal.SIGKILL and self.restarted < self.restarts:
                self.restarted += 1
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # anything it started goes too
                self.procs[n] = self._spawn(n)
                continue
            raise ConfigurationError(
                f"a worker process exited (status {proc.returncode}):\n{self.tail(n)}"
            )

    def tail(self, n: int, lines: int = 15) -> str:
        path = self.logs / f"worker-{n + 1}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    def stop(self) -> None:
        """SIGKILL every process group, then any process of the run left (work horses)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        deadline = time.monotonic() + 10.0
        while (left := run_processes(self.run_id)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
