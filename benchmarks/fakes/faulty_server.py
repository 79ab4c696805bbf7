"""`contextspan serve` with faults injected, in its own process as in production: `python -m
benchmarks.fakes.faulty_server serve ...` with FAULTS set, e.g. `step_raise@20` (the first session to reach frame 20
fails in its own part of the tick, before the batched step), `forward_raise@20` / `forward_nan@20` (from that frame
on, that session's row raises, or turns NaN, inside the batched step's transformer forward), `slow_prefill@12` (every
session's prefill takes 12 s longer), `asr_raise` (Whisper's worker process raises on every call) or
`agent_listens@6` (not a fault: the agent is silent while its user speaks and 6 frames after, as a full-duplex model
listens, where the tiny model's random weights babble through every frame)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from benchmarks.fakes.forward_fault import ForwardFault
from frontend_model.engine.batch_model import BatchedModel
from server.batching.batcher import Batcher
from server.cli import main
from server.session.spans import FrameOutput
from server.wire.frame_clock import InputFrame


def raising_transcribe(audio: np.ndarray) -> str:
    """Runs in the ASR worker process, which imports this module by name."""
    raise RuntimeError("injected ASR fault")


def break_slot_frame(at_frame: int, fault: Callable[[], None]) -> Callable[[Batcher, InputFrame], np.ndarray]:
    """A `Batcher._slot_frame` that runs `fault` once, in the tick where the first session reaches `at_frame`
    (calibration and warm-up ticks do not pass through it). Install it with monkeypatch or setattr."""
    original = Batcher._slot_frame
    fired: list[int] = []

    def slot_frame(self: Batcher, frame: InputFrame) -> np.ndarray:
        if frame.index == at_frame and not fired:
            fired.append(frame.index)
            fault()
        return original(self, frame)

    return slot_frame


def break_forward(at_frame: int, kind: str) -> None:
    """Patch BatchedModel so that the first session to reach `at_frame` has its row fault inside the batched step
    (benchmarks/fakes/forward_fault.py) until its slot is opened again. Calibration and warm-up ticks (no session
    opened) do not arm it."""
    original_tick, original_open = BatchedModel.tick, BatchedModel.open_slot
    faults: dict[int, ForwardFault] = {}  # id(model) -> its fault
    opened: set[int] = set()
    fired: list[int] = []

    def tick(self: BatchedModel, frames: dict[int, np.ndarray]) -> dict:
        if id(self) not in faults:
            faults[id(self)] = ForwardFault(self.engine, kind)
        fault = faults[id(self)]
        for slot in frames:
            if not fired and slot in opened and self.frames_stepped[slot] == at_frame:
                fired.append(slot)
                fault.arm(slot)
        return original_tick(self, frames)

    def open_slot(self: BatchedModel, slot: int, *args: object) -> float:
        if id(self) in faults:
            faults[id(self)].disarm(slot)
        opened.add(slot)
        return original_open(self, slot, *args)  # type: ignore[arg-type]

    BatchedModel.tick = tick  # type: ignore[method-assign]
    BatchedModel.open_slot = open_slot  # type: ignore[method-assign]


def injected_step_fault() -> None:
    raise RuntimeError("injected step fault")


def slow_open(delay_s: float) -> Callable[..., Coroutine[Any, Any, float]]:
    """A `Batcher.open` that takes `delay_s` longer, as a long voice and persona prefill or a busy worker would:
    the session waits without its handshake while the event loop, and the other sessions, go on."""
    original = Batcher.open

    async def open_slot(self: Batcher, *args: Any) -> float:
        await asyncio.sleep(delay_s)
        return await original(self, *args)

    return open_slot


# A user frame louder than this (-40 dBFS RMS) is the user speaking.
USER_SPEAKS_RMS = 10 ** (-40 / 20)


def listening_step(hangover_frames: int) -> Callable[..., Coroutine[Any, Any, FrameOutput]]:
    """A `Batcher.step` whose agent output is silence without text while the frame's user audio is audible, and
    for `hangover_frames` after."""
    original = Batcher.step
    since_user: dict[int, int] = {}  # slot -> frames since its user was last heard

    async def step(self: Batcher, slot: int, frame: InputFrame) -> FrameOutput:
        out = await original(self, slot, frame)
        heard = float(np.sqrt(np.mean(np.square(frame.pcm, dtype=np.float64)))) > USER_SPEAKS_RMS
        since = since_user[slot] = 0 if heard else 1 + (hangover_frames if frame.index == 0 else since_user[slot])
        if since > hangover_frames or out.agent_pcm is None:
            return out
        return dataclasses.replace(out, agent_pcm=np.zeros_like(out.agent_pcm), text_token=None)

    return step


def install(faults: str) -> None:
    for fault in filter(None, faults.split(",")):
        name, _, argument = fault.partition("@")
        if name == "step_raise":
            Batcher._slot_frame = break_slot_frame(int(argument), injected_step_fault)  # type: ignore[method-assign]
        elif name in ("forward_raise", "forward_nan"):
            break_forward(int(argument), name.removeprefix("forward_"))
        elif name == "slow_prefill":
            Batcher.open = slow_open(float(argument))  # type: ignore[method-assign]
        elif name == "agent_listens":
            Batcher.step = listening_step(int(argument))  # type: ignore[method-assign]
        elif name == "asr_raise":
            import server.session.backend

            server.session.backend.transcribe = raising_transcribe  # type: ignore[assignment]
        else:
            raise SystemExit(f"unknown fault {fault!r}")


if __name__ == "__main__":
    install(os.environ.get("FAULTS", ""))
    sys.exit(main())
