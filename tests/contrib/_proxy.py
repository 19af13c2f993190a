"""A TCP proxy the test can cut: a broker outage without stopping the shared broker.

``TcpProxy(host, port)`` listens on a free local port and forwards every connection to
``host:port`` (a thread per direction). ``cut()`` is the outage: the listening socket
is closed (new connections are refused) and every open connection is torn down, both
ways, at once; ``restore()`` listens again on the same port. The machine's RabbitMQ or
Redis, which other test runs use, is never touched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.connections = 0  # accepted since the start, for the test's own checks
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> TcpProxy:
        self.restore()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def up(self) -> bool:
        return self._listener is not None

    def restore(self) -> None:
        """Listen (again, on the same port once it had one)."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept, listener)

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            dropped, self._open = self._open, set()
        for sock in dropped:
            _drop(sock)

    def close(self) -> None:
        self.cut()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener is closed
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _drop(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    _drop(client)
                    _drop(server)
                    return
                self._open |= {client, server}
                self.connections += 1
            self._spawn(self._pump, client, server)
            self._spawn(self._pump, server, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {src, dst}
            _drop(src)
            _drop(dst)


def _drop(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
