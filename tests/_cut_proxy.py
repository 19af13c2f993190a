"""A TCP proxy in front of one Redis server that can lose a reply on purpose.

``CutProxy`` forwards bytes both ways between its clients and the server. Armed with
``cut(marker)``, it passes the next request that holds ``marker`` (a script's SHA) on
to the server, lets the server run it, takes the server's reply and, instead of handing
it over, closes the client's connection: the command ran, and its caller cannot know.
It counts how many times each watched marker went to the server, so a test can tell a
command sent once from one sent again. Test scaffolding, not part of fencing.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from typing import Any


class CutProxy:
    def __init__(self, host: str, port: int, watch: tuple[bytes, ...] = ()) -> None:
        self.target = (host, port)
        self.watch = watch
        self.sent: Counter[bytes] = Counter()  # marker -> times it went to the server
        self.cuts = 0  # replies lost on purpose
        self._armed: bytes | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, name="cut-proxy", daemon=True)
        self._thread.start()

    def cut(self, marker: bytes) -> None:
        """Lose the reply to the next request holding ``marker``."""
        with self._lock:
            self._armed = marker

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._armed is not None

    def close(self) -> None:
        _close(self._listener)  # shutdown wakes the accept()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)
        self._thread.join(10)

    def __enter__(self) -> CutProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            pair = _Pair()
            for args in ((client, server, pair, True), (server, client, pair, False)):
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: _Pair, request: bool) -> None:
        tail = b""
        longest = max((len(m) for m in self.watch), default=1)
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                if request:
                    seen = tail + chunk
                    with self._lock:
                        for marker in self.watch:  # the tail is too short to hold one
                            self.sent[marker] += seen.count(marker)
                        if self._armed is not None and self._armed in seen:
                            self._armed = None
                            pair.cutting.set()  # before the server can answer
                    tail = seen[-(longest - 1) :] if longest > 1 else b""
                elif pair.cutting.is_set():
                    with self._lock:
                        self.cuts += 1
                    break  # the reply is dropped: close both ends
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


class _Pair:
    def __init__(self) -> None:
        self.cutting = threading.Event()


def _close(sock: Any) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
