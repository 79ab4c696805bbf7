"""`contextspan health` probes the port the serving process was told, by flag or variable, not a fixed one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.ops.health import Listen, find_server, serve_address

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (["contextspan", "serve", "--port", "8999"], {"CONTEXTSPAN_PORT": "8998"}, Listen("127.0.0.1", 8999)),
    (["contextspan", "serve", "--port=9001", "--host=0.0.0.0"], {}, Listen("0.0.0.0", 9001)),
    (["contextspan", "serve"], {"CONTEXTSPAN_PORT": "9002", "CONTEXTSPAN_HOST": "0.0.0.0"}, Listen("0.0.0.0", 9002)),
    (["contextspan", "serve", "--profile", "tiny"], {}, Listen("127.0.0.1", 8998)),
])
def test_the_flag_wins_over_the_variable_which_wins_over_the_default(argv: list[str], environ: dict[str, str],
                                                                    expected: Listen) -> None:
    assert serve_address(argv, environ) == expected


def test_a_wildcard_bind_is_probed_on_loopback() -> None:
    assert Listen("0.0.0.0", 8999).health_url == "http://127.0.0.1:8999/healthz"
    assert Listen("::1", 8999).health_url == "http://[::1]:8999/healthz"


def test_the_server_process_is_told_apart_from_other_processes() -> None:
    others = [(["/sbin/tini", "--", "contextspan", "serve", "--port", "7000"], {}),
              (["python3", "-c", "serve"], {})]
    server = [(["/opt/venv/bin/python3", "/opt/venv/bin/contextspan", "serve", "--port", "8999"], {})]
    assert find_server(others[1:] + server) == Listen("127.0.0.1", 8999)
    assert find_server([(["python3", "-m", "server.cli", "serve"], {"CONTEXTSPAN_PORT": "8100"})]) == Listen(
        "127.0.0.1", 8100)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(pid: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", "health", "--pid", str(pid)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_health_probes_a_server_started_on_a_port_of_its_own_and_fails_once_it_is_gone() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--profile", "tiny", "--port", str(port)],
                              cwd=ROOT, env={**os.environ, "CONTEXTSPAN_PORT": "1"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while (result := health(server.pid)).returncode != 0:
            assert server.poll() is None and time.monotonic() < deadline, result.stdout
            time.sleep(0.5)
        assert f"127.0.0.1:{port}/healthz: ok" in result.stdout
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert health(server.pid).returncode == 1
