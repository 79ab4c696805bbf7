"""scripts/gpu_check.sh end to end on this CPU, from a Python laid out as the lent GPU machine's is: `prep` downloads
the wheels that machine lacks (for this Python, so that the dry run can install them), then `run --dry-run`, started
from a fake machine (a venv's interpreter holding this machine's torch and the lent machine's packages, nothing else),
installs them offline with `pip --target` and runs every phase at tiny sizes. A device machine is lent for minutes;
this keeps its script from rotting between loans."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "gpu_check.sh")
PHASES = ["environment", "engine, batch and codec tests (float32, TF32 off)", "bf16 tolerance tests",
          "one-pass vs stepwise, graphed vs eager", "Context Spanning layout at 7B (checkpoint path)", "bench span",
          "bench batch, CUDA graphs", "Kyutai's per-frame work (moshi LMGen, batch 1)", "bench load (real server)",
          "window refill and history replay", "bench batch, eager", "profile of a span + step"]
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_machine import LIMIT_MIB, lacking, wheel_name  # noqa: E402


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpu") / "wheels"
    subprocess.run([SCRIPT, "prep"], env=_env(folder), check=True, timeout=900)
    return folder


def _env(wheels: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "GPU_WHEELS": str(wheels),
            "GPU_CHECK_PYTHON_VERSION": f"{sys.version_info.major}.{sys.version_info.minor}", **extra}


def test_prep_carries_only_what_the_machine_lacks_within_the_limit(wheels: Path) -> None:
    names = {wheel_name(w) for w in (wheels / "wheels").glob("*.whl")}
    assert {"moshi", "sphn", "fastapi", "pydantic-settings", "num2words", "docopt", "pytest-asyncio"} <= names
    assert {"safetensors", "typing-extensions"} <= names  # there, but at a version past moshi's pin / not known
    assert not names & {"torch", "numpy", "httpx", "huggingface-hub", "pytest", "iniconfig", "sentencepiece",
                        "faster-whisper", "ctranslate2"}
    assert all(lacking(name) for name in names)
    assert sum(f.stat().st_size for f in wheels.rglob("*") if f.is_file()) < 30 * 2**20


def test_prep_fails_when_what_a_call_would_carry_passes_the_limit(tmp_path: Path) -> None:
    done = subprocess.run([SCRIPT, "prep"], env=_env(tmp_path / "wheels", GPU_CHECK_CARRY_LIMIT_MIB="5"),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode != 0 and "OVER the limit" in done.stderr and "of 5 MiB allowed" in done.stderr
    assert LIMIT_MIB == 60


def test_dry_run_from_a_python_laid_out_as_the_machines_exercises_every_phase(wheels: Path, tmp_path: Path) -> None:
    machine = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_machine.py"), "fake-machine",
                              str(tmp_path / "machine")], capture_output=True, text=True, check=True, timeout=300)
    python = machine.stdout.strip()
    probe = "import sys, torch; print(sys.prefix != sys.base_prefix); import fastapi"
    seen = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=_clean_env(), timeout=120)
    assert seen.stdout.strip() == "True" and "No module named 'fastapi'" in seen.stderr  # a venv's, torch only

    out = tmp_path / "out"
    env = _env(wheels, PYTHON=python, OUT=str(out), GPU_CHECK_SITE=str(tmp_path / "site"))
    env.pop("PYTHONPATH", None)
    done = subprocess.run([SCRIPT, "run", "--dry-run"], env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"from {tmp_path / 'site'}/safetensors" in (out / "install.log").read_text()  # the carried one wins
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"gpu_check.log", "install.log"} <= set(files)
    [results] = [f for f in files if f.startswith("gpu_check-") and f.endswith(".json")]
    report = json.loads((out / results).read_text())
    assert report["dry_run"] is True and report["device"] == "cpu"
    assert [(p["name"], p["outcome"]) for p in report["phases"]] == [(name, "passed") for name in PHASES]
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["environment"]["data"]["torch"]
    assert all(row["passed"] for row in phases["one-pass vs stepwise, graphed vs eager"]["data"]["rows"])
    layout = phases["Context Spanning layout at 7B (checkpoint path)"]["data"]
    assert layout["layout"] == "contextspan" and layout["equivalence"]["passed"]
    assert phases["bench span"]["data"]["rows"][0]["frames"] == 0
    assert phases["bench load (real server)"]["data"]["sessions"] in (1, 2)  # chosen from the batch phase
    [window] = phases["window refill and history replay"]["data"]["rows"]
    assert phases["window refill and history replay"]["data"]["decoder_warmup"]["runs"]
    assert window["replay"]["runs"] and window["refill"]["runs"] and 0 < window["refill_keep_frames"] < window["frames"]
    assert len(report["targets"]) == 4 and all(t["p99_ms"] is not None for t in report["targets"])
    anchor = report["anchor"]
    assert anchor["capacity_ratio"] == pytest.approx(anchor["ours_frames_per_s"] / anchor["kyutai_frames_per_s"])
    table = (out / results.replace(".json", ".md")).read_text()
    assert "| sessions x frames per second (capacity) |" in table and "| 0.5 min (375 frames) |" in table
    assert table.count("| passed |") == len(PHASES)
    log = (out / "gpu_check.log").read_text().splitlines()
    summary = log[log.index(next(line for line in log if line.startswith("=== summary"))):]
    assert sum(line.strip().startswith("passed") for line in summary) == len(PHASES)
    assert sum(line.startswith("target ") for line in summary) == 4 and log[-1].startswith(f"results: {results}")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_second_call_runs_the_phases_asked_for_in_the_order_asked_after_the_environment() -> None:
    import gpu_check

    every = gpu_check.phases(argparse.Namespace(device="cpu"),
                             gpu_check.Sizes.for_run(dry_run=True))
    names = [p.name for p in gpu_check.selected(every, ["CUDA graphs", "Kyutai", "codec tests"])]
    assert names == ["environment", "bench batch, CUDA graphs", "Kyutai's per-frame work (moshi LMGen, batch 1)",
                     "engine, batch and codec tests (float32, TF32 off)"]
    assert gpu_check.selected(every, []) == every


def test_merging_calls_keeps_a_later_run_but_never_hides_an_earlier_pass_behind_a_later_failure() -> None:
    import gpu_check

    def report(*phases: tuple[str, str, str]) -> dict[str, object]:
        return {"dry_run": False, "budget_s": 100, "elapsed_s": 50, "environment": {"device": "cuda"},
                "phases": [{"name": n, "outcome": o, "seconds": 1.0, "returncode": None, "why": w, "data": {}}
                           for n, o, w in phases]}

    first = report(("environment", "passed", ""), ("bench span", "passed", ""), ("bench load (real server)",
                                                                                 "failed", "429"))
    second = report(("environment", "passed", ""), ("bench span", "failed", "AssertionError"),
                    ("bench load (real server)", "passed", ""))
    phases = {p["name"]: p for p in gpu_check.merged([first, second])["phases"]}
    assert (phases["bench span"]["outcome"], phases["bench span"]["run"]) == ("passed", 1)
    assert phases["bench span"]["why"] == "call 2 failed: AssertionError"
    assert (phases["bench load (real server)"]["outcome"], phases["bench load (real server)"]["run"]) == ("passed", 2)
