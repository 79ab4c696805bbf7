"""`contextspan serve` with a model that cannot load exits non-zero with the reason, so that an orchestrator sees
it; `--wait-for-model` keeps it up, saying why on /readyz."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("--profile", "personaplex", "--checkpoint", "/nonexistent", "--no-asr")


def test_serve_exits_non_zero_with_the_reason(tmp_path: Path) -> None:
    # The process itself, not the harness: on a busy host its /readyz may name the load error before it exits.
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(harness.free_port()), *FLAGS,
           "--recordings-dir", str(tmp_path / "rec")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert re.search(r"exiting: the model did not load: .*/nonexistent does not exist", done.stdout + done.stderr)


def test_wait_for_model_keeps_serving_not_ready(tmp_path: Path) -> None:
    port = harness.free_port()
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), *FLAGS, "--wait-for-model",
           "--recordings-dir", str(tmp_path / "rec")]
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        body: dict = {}
        while not body.get("load_error"):
            assert time.monotonic() < deadline and process.poll() is None
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                body = response.json()
            except httpx.HTTPError:
                time.sleep(0.2)
        assert response.status_code == 503 and "/nonexistent does not exist" in body["load_error"]
        time.sleep(0.5)  # several of uvicorn's 0.1 s ticks: it must still be up
        assert process.poll() is None
    finally:
        harness.stop_server(process)
