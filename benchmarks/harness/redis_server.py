"""A private redis-server on a free loopback port in a temporary folder: the resume store that replicas share, for
the benchmarks and the tests."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.servers import free_port


class RedisMissing(RuntimeError):
    """Debian's redis-server is not installed: the tests skip on it, the benchmarks stop on it."""


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Gone at once, as a crashed Redis is: SIGKILL."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")
    return False


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    """No persistence, loopback only; RedisMissing where redis-server is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisMissing("redis-server is not installed (apt-get install redis-server; scripts/dev.sh test does)")
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                                "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, process)
    try:
        deadline = time.monotonic() + 10
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield server
    finally:
        server.stop()
