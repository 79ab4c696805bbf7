"""One torch.compile policy for every entry point: the CLI, `python -m benchmarks...`, uvicorn on server.app.routes,
tests.

moshi wraps its hot functions (RoPE, gating, attention helpers) in `torch_compile_lazy`, which compiles them on first
call unless NO_TORCH_COMPILE is set when moshi's modules are imported. Compiled, they recompile for every new
sequence length, i.e. for every span length, and a recompile costs seconds inside an 80 ms frame. So compilation is
off unless the environment opts in with NO_TORCH_COMPILE set to the empty string.
"""

from __future__ import annotations

import os
import sys


def apply_compile_policy() -> None:
    """Run by the packages' __init__ so it precedes any import of moshi through them; if moshi was imported first,
    its wrappers still check a module flag on every call, which is set here."""
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    if not os.environ["NO_TORCH_COMPILE"]:
        return
    compile_module = sys.modules.get("moshi.utils.compile")
    if compile_module is not None:
        compile_module._compile_disabled = True  # type: ignore[attr-defined]
