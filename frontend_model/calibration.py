"""Startup calibration of what a span costs, so the engine can cap spans to keep the frame slot."""

from __future__ import annotations

import torch

from frontend_model.block import Block
from frontend_model.engine import GREEDY, Engine, PrefillCost, device_sync, time_call
from frontend_model.loading import LoadedModel
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
