"""Helpers for e2e tests: `contextspan serve` in a subprocess on a free loopback port, espeak-ng speech."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from server.client import free_port

ARTIFACTS = Path(__file__).parent / "artifacts"


@dataclass
class RunningServer:
    http: str
    ws: str
    recordings: Path
    process: subprocess.Popen[bytes]
    log: Path

    def rss_bytes(self) -> int:
        import psutil

        return int(psutil.Process(self.process.pid).memory_info().rss)

    def metrics(self) -> str:
        return httpx.get(f"{self.http}/metrics", timeout=5).text


def start_server(tmp: Path, *flags: str, ready_timeout: float = 120.0) -> RunningServer:
    port = free_port()
    recordings = tmp / "recordings"
    log = tmp / "server.log"
    env = dict(os.environ, NO_TORCH_COMPILE="1")
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--recordings-dir", str(recordings),
           "--log-level", "info", *flags]
    process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                               cwd=Path(__file__).resolve().parents[2])
    http = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{http}/readyz", timeout=1).status_code == 200:
                return RunningServer(http, f"ws://127.0.0.1:{port}", recordings, process, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"server not ready in {ready_timeout} s:\n{log.read_text()[-3000:]}")


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def espeak_wav(path: Path, text: str) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    return path
