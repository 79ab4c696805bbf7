"""scripts/gpu_check.sh end to end on this CPU: `prep` downloads the wheels (for this Python, so that the dry run can
resolve them), then `run --dry-run` resolves them offline from the folder alone and runs every phase at tiny sizes.
A device machine is lent for minutes; this keeps its script from rotting between loans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["environment", "engine, batch and codec tests (float32, TF32 off)", "bf16 tolerance tests",
          "one-pass vs stepwise, graphed vs eager", "bench span", "bench batch, CUDA graphs", "bench batch, eager",
          "bench load (real server)"]
MAX_WHEELS_MIB = 64  # what one run may carry to the device machine


def test_prep_then_dry_run_exercises_every_phase(tmp_path: Path) -> None:
    wheels, out = tmp_path / "wheels", tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, GPU_WHEELS=str(wheels), OUT=str(out),
               GPU_CHECK_PYTHON_VERSION=f"{sys.version_info.major}.{sys.version_info.minor}")
    script = str(ROOT / "scripts" / "gpu_check.sh")
    subprocess.run([script, "prep"], env=env, check=True, timeout=600)
    assert sum(f.stat().st_size for f in wheels.rglob("*") if f.is_file()) < MAX_WHEELS_MIB * 2**20
    assert any(w.name.startswith("moshi-0.2.13") for w in (wheels / "wheels").iterdir())
    assert not any(w.name.startswith(("torch-", "faster_whisper")) for w in (wheels / "wheels").iterdir())

    done = subprocess.run([script, "run", "--dry-run"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"gpu_check.log", "install.log"} <= set(files)
    [results] = [f for f in files if f.startswith("gpu_check-") and f.endswith(".json")]
    report = json.loads((out / results).read_text())
    assert report["dry_run"] is True and report["device"] == "cpu"
    assert [(p["name"], p["outcome"]) for p in report["phases"]] == [(name, "passed") for name in PHASES]
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["environment"]["data"]["torch"]
    assert all(row["passed"] for row in phases["one-pass vs stepwise, graphed vs eager"]["data"]["rows"])
    assert phases["bench span"]["data"]["rows"][0]["frames"] == 0
    assert phases["bench load (real server)"]["data"]["sessions"] == 2
    assert len(report["targets"]) == 4 and all(t["p99_ms"] is not None for t in report["targets"])
    log = (out / "gpu_check.log").read_text().splitlines()
    summary = log[log.index(next(line for line in log if line.startswith("=== summary"))):]
    assert sum(line.strip().startswith("passed") for line in summary) == len(PHASES)
    assert sum(line.startswith("target ") for line in summary) == 4 and log[-1].startswith(f"results: {results}")
