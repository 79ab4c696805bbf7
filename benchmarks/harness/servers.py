"""`contextspan serve` in a subprocess on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import server


def free_port() -> int:
    """A loopback port free right now, for servers started by tests and benchmarks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def code_root() -> Path:
    """The folder holding the packages this process runs: a checkout, or site-packages for an installed wheel. A
    child run with it first on its path runs this same code, not what an editable install elsewhere points at."""
    return Path(server.__file__).resolve().parents[1]


def start_server(workdir: Path, *flags: str, ready_timeout: float = 300.0, module: str = "server.cli",
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m module serve *flags` (`contextspan serve`) on a free loopback port, in `workdir` (relative paths,
    such as the default recordings folder, land there), logging to workdir/server.log; returns the process and its
    http:// URL once /readyz says ready (`wait_ready`)."""
    port = free_port()
    cmd = [sys.executable, "-m", module, "serve", "--port", str(port), *flags]
    log = workdir / "server.log"
    path = os.pathsep.join(filter(None, [str(code_root()), os.environ.get("PYTHONPATH")]))
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                   env=dict(os.environ, NO_TORCH_COMPILE="1", PYTHONPATH=path, **(env or {})))
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, url, log, ready_timeout)
    return process, url


def wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    """Returns once the server at `url` says ready on /readyz. Fails (and stops it) as soon as the process exits,
    /readyz reports a model load error, or `timeout` passes; the error carries the end of its `log`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            ready = httpx.get(f"{url}/readyz", timeout=1)
        except httpx.HTTPError:
            ready = None
        if ready is not None and ready.status_code == 200:
            return
        if ready is not None and ready.json().get("load_error"):  # the model will not load: waiting cannot help
            stop_server(process)
            raise RuntimeError(f"server could not load its model: {ready.json()['load_error']}")
        time.sleep(0.3)
    stop_server(process)
    raise RuntimeError(f"server not ready within {timeout:.0f} s: {log.read_text()[-2000:]}")


def stop_server(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM lets uvicorn close the sessions and the ASR process; SIGKILL only if that hangs."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
