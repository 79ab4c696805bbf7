"""A loopback TCP proxy that a test can cut: every connection through it dropped at once, as a lost network drops
them (no WebSocket close frame: the browser sees 1006, the server a vanished client)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.connections = 0  # accepted so far
        self._live: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._live += [client, upstream]
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Bytes one way until either side ends; then both ends are shut, so the other direction ends too."""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        with self._lock:
            if source in self._live:
                self._live.remove(source)
        source.close()

    def cut(self) -> int:
        """Drop every connection open now; returns how many sockets were open."""
        with self._lock:
            live = list(self._live)
        for end in live:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)  # wakes the pumps' recv(); they close their sockets
        return len(live)


@contextlib.contextmanager
def tcp_proxy(target_port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(target_port)
    try:
        yield proxy
    finally:
        with contextlib.suppress(OSError):
            proxy.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        proxy.listener.close()
        proxy.cut()
