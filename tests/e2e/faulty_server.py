"""`contextspan serve` with faults injected, in its own process as in production: `python -m tests.e2e.faulty_server
serve ...` with FAULTS set, e.g. `step_raise@20` (the first session's step raises at frame 20) or `asr_raise`
(Whisper's worker process raises on every call)."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from server.cli import main
from server.model_session import FrameOutput, ModelSession, SpanRequest


def raising_transcribe(audio: np.ndarray) -> str:
    """Runs in the ASR worker process, which imports this module by name."""
    raise RuntimeError("injected ASR fault")


def break_first_session_step(at_frame: int) -> None:
    """Only the first session to reach `at_frame` (warm-up steps stop at frame 3)."""
    original = ModelSession.step
    fired: list[ModelSession] = []

    def step(self: ModelSession, frame: Any, span: SpanRequest | None) -> FrameOutput:
        if frame.index == at_frame and not fired:
            fired.append(self)
            raise RuntimeError("injected step fault")
        return original(self, frame, span)

    ModelSession.step = step  # type: ignore[method-assign]


def install(faults: str) -> None:
    for fault in filter(None, faults.split(",")):
        name, _, argument = fault.partition("@")
        if name == "step_raise":
            break_first_session_step(int(argument))
        elif name == "asr_raise":
            import server.backend

            server.backend.transcribe = raising_transcribe  # type: ignore[assignment]
        else:
            raise SystemExit(f"unknown fault {fault!r}")


if __name__ == "__main__":
    install(os.environ.get("FAULTS", ""))
    sys.exit(main())
