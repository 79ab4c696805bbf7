"""Startup calibration of what a tick and a span cost: the engine caps spans, the server schedules ticks and admits
sessions by these numbers so that every frame keeps its deadline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from frontend_model.batch_model import BatchedModel
from frontend_model.block import Block
from frontend_model.engine import (
    DEFAULT_MAX_SPAN_FRAMES,
    GREEDY,
    Engine,
    PrefillCost,
    device_sync,
    interpolate,
    time_call,
)
from frontend_model.loading import FRAME_SAMPLES, LoadedModel
from frontend_model.span_block import placeholder_rows


def calibration_sizes(max_frames: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 < max_frames:
        sizes.append(sizes[-1] * 2)
    return [*sizes, max_frames]


def filler_block(model: LoadedModel, frames: int) -> Block:
    text = torch.full((1, frames), model.span.text_pad_id, dtype=torch.long)
    agent, user = placeholder_rows(model.span, frames)
    return Block(torch.cat([text, agent, user]))


@torch.no_grad()
def calibrate_prefill(model: LoadedModel, max_frames: int, repeats: int = 3) -> PrefillCost:
    """Cost of one step and of span(n) + step for power-of-two n, measured on a scratch engine.

    Best of `repeats`, which is robust to a noisy shared machine. Runs while no session holds the model (at
    startup), since an engine owns the model's streaming state.
    """
    sync = device_sync(model.device)
    user = torch.tensor(model.span.sine_codes)
    with Engine(model, GREEDY, max_span_frames=max_frames) as engine:
        for _ in range(3):
            engine.step(user)
        step = min(time_call(lambda: engine.step(user), sync) for _ in range(repeats * 3))
        spans: dict[int, float] = {}
        for n in calibration_sizes(max_frames):
            block = filler_block(model, n)
            engine.inject(block)
            engine.step(user)
            spans[n] = min(
                time_call(lambda b=block: (engine.inject(b), engine.step(user)), sync) for _ in range(repeats)
            )
    return PrefillCost(step_s=step, span_s=spans)


@dataclass(frozen=True)
class TickCost:
    """Measured cost of one tick with every slot stepping, per batch size, and of a span's prefill."""

    tick_s: dict[int, float]
    prefill: PrefillCost

    def tick(self, batch: int) -> float:
        return interpolate(self.tick_s, batch)

    def span(self, frames: int) -> float:
        """What injecting a span of `frames` frames adds to a tick (0 for no span)."""
        if frames <= 0:
            return 0.0
        return max(0.0, self.prefill.predict(frames) - self.prefill.step_s)

    def span_budget(self, budget_s: float, batch: int) -> float:
        """The budget to give an engine's span cap (which counts one plain step) so span + tick fit `budget_s`."""
        return budget_s - self.tick(batch) + self.prefill.step_s


def tick_sizes(max_batch: int) -> list[int]:
    """Powers of two up to `max_batch`, `max_batch` itself and one more, to predict the tick a refusal avoids."""
    return sorted({*calibration_sizes(max_batch), max_batch + 1})


@torch.no_grad()
def calibrate_ticks(model: LoadedModel, sizes: list[int], repeats: int = 9, stop_above_s: float | None = None,
                    max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES) -> dict[int, float]:
    """Seconds of one tick (encode, step, decode) with all `b` slots stepping, for each b in `sizes` (ascending).

    Best of `repeats`, like calibrate_prefill: a noisy neighbour must not shrink the server's capacity. Sizes past
    the first whose tick exceeds `stop_above_s` are not measured: they could not be admitted anyway. The KV rings are
    widened by `max_span_frames` as the served ones are, since a step attends over the whole ring.
    """
    sync = device_sync(model.device)
    pcm = np.zeros(FRAME_SAMPLES, np.float32)
    ticks: dict[int, float] = {}
    for batch in sizes:
        batched = BatchedModel(model, batch, GREEDY, max_span_frames)
        batched.start()
        try:
            batched.warm_up()
            frames = dict.fromkeys(range(batch), pcm)
            ticks[batch] = min(time_call(lambda f=frames, b=batched: b.tick(f), sync) for _ in range(repeats))
        finally:
            batched.close()
        if stop_above_s is not None and ticks[batch] > stop_above_s:
            break
    return ticks
