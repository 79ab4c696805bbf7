"""Every entry point runs moshi uncompiled (frontend_model.compile_policy), whatever imports moshi first, and the
environment can still opt in; and a server without speech recognition never imports faster-whisper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# True when moshi's RoPE would be torch.compiled on its first call.
COMPILES = (
    "import moshi.modules.rope as r, moshi.utils.compile as c; "
    "print(hasattr(r.apply_rope, '__wrapped__') and not c._compile_disabled)"
)


def python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "NO_TORCH_COMPILE"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("entry", ["server.cli", "server.app.routes", "server.offline.infer", "benchmarks.span_latency",
                                   "benchmarks.batch_ticks", "frontend_model.engine.engine"])
def test_entry_points_run_moshi_uncompiled(entry: str) -> None:
    assert python(f"import {entry}; {COMPILES}") == "False"


def test_moshi_imported_first_is_still_uncompiled() -> None:
    assert python(f"import moshi.models.lm; {COMPILES}") == "True"  # the hazard the policy removes
    assert python(f"import moshi.models.lm, frontend_model.loading.loader; {COMPILES}") == "False"


def test_an_empty_no_torch_compile_opts_in() -> None:
    assert python(f"import frontend_model.engine.engine; {COMPILES}", NO_TORCH_COMPILE="") == "True"


def test_server_imports_no_faster_whisper() -> None:
    code = "import sys, server.app.routes, server.session.backend; print('faster_whisper' in sys.modules)"
    assert python(code) == "False"
