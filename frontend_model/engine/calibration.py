"""Startup calibration of what a tick and a span cost: the engine caps spans, the server schedules ticks and admits
sessions by these numbers so that every frame keeps its deadline."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.chunked_prefill import SpanPrefill, chunk_sizes
from frontend_model.engine.costs import PrefillCost, TickCost, assumed_cost
from frontend_model.engine.device_memory import drop_streaming_state, release_memory
from frontend_model.engine.engine import DEFAULT_MAX_SPAN_FRAMES, GREEDY, NO_FRAME_BUDGET, Engine
from frontend_model.engine.optimisations import Optimisations
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel
from frontend_model.span.block import Block
from frontend_model.span.build import MIN_SPAN_FRAMES, placeholder_rows

logger = logging.getLogger(__name__)


def no_span_budget_warning(cost: PrefillCost, budget_s: float) -> str:
    """Why a span cap is 0, for the startup log: every span will be dropped with reason `no_frame_budget`."""
    return (f"no span fits the frame: a {MIN_SPAN_FRAMES}-frame span and the next step were measured at "
            f"{cost.predict(MIN_SPAN_FRAMES) * 1e3:.1f} ms, over the {budget_s * 1e3:.1f} ms left of the frame budget; "
            f"every span will be dropped ({NO_FRAME_BUDGET}). Use a faster device, fewer sessions, or --span-cap fixed")




def time_call(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def device_sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


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
def calibrate_prefill(model: LoadedModel, max_frames: int, repeats: int = 3,
                      optimisations: Optimisations | None = None) -> PrefillCost:
    """Cost of one step, of a one-pass span(n) + step for power-of-two n, and of a chunked span of one chunk of each
    size + step (none where the chunks failed to start), measured on a scratch engine, so that the served one writes
    each span the faster way.

    Best of `repeats`, which is robust to a noisy shared machine. Runs while no session holds the model (at
    startup), since an engine owns the model's streaming state.
    """
    sync = device_sync(model.device)
    user = torch.tensor(model.span.sine_codes)
    with Engine(model, GREEDY, max_span_frames=max_frames, prefill=SpanPrefill.CHUNKED,
                optimisations=optimisations) as engine:
        for _ in range(3):
            engine.step(user)
        step = min(time_call(lambda: engine.step(user), sync) for _ in range(repeats * 3))

        def span_cost(frames: int, mode: SpanPrefill) -> float:
            engine.prefill_mode = mode
            block = filler_block(model, frames)
            engine.inject(block)
            engine.step(user)
            return min(time_call(lambda: (engine.inject(block), engine.step(user)), sync) for _ in range(repeats))

        spans = {n: span_cost(n, SpanPrefill.ONE_PASS) for n in calibration_sizes(max_frames)}
        chunks = {n: span_cost(n, SpanPrefill.CHUNKED) for n in chunk_sizes(max_frames)} if engine.chunked else {}
    return PrefillCost(step_s=step, span_s=spans, chunk_s=chunks)


def calibrate_costs(model: LoadedModel, sizes: list[int], tick_limit_s: float, max_span_frames: int,
                    optimisations: Optimisations) -> TickCost:
    """What a span (calibrate_prefill) and a tick of each batch size (calibrate_ticks, stopping past `tick_limit_s`)
    cost. Where measuring fails, calibration goes off and every tick is assumed to take `tick_limit_s`."""
    def measure() -> TickCost:
        prefill = calibrate_prefill(model, max_span_frames, optimisations=optimisations)
        ticks = calibrate_ticks(model, sizes, stop_above_s=tick_limit_s, max_span_frames=max_span_frames,
                                optimisations=optimisations)
        return TickCost(ticks.ticks, prefill, ticks.memory_slots)

    cost = optimisations.attempt("calibration", measure)
    if cost is not None:
        return cost
    drop_streaming_state(model.lm, model.mimi)  # an engine that failed to start may have left some
    release_memory(model.device)
    return assumed_cost(tick_limit_s)


def tick_sizes(max_batch: int) -> list[int]:
    """Powers of two up to `max_batch`, and `max_batch`: never more rows than the server may serve, so calibration
    needs no memory that serving would not (the tick of one more is extrapolated where a refusal reports it)."""
    return sorted(set(calibration_sizes(max_batch)))


@dataclass(frozen=True)
class TickCalibration:
    ticks: dict[int, float]
    memory_slots: int | None  # the largest batch that fits the device's memory; None when every size fitted


@torch.no_grad()
def calibrate_ticks(model: LoadedModel, sizes: list[int], repeats: int = 9, stop_above_s: float | None = None,
                    max_span_frames: int = DEFAULT_MAX_SPAN_FRAMES,
                    optimisations: Optimisations | None = None) -> TickCalibration:
    """Seconds of one tick (encode, step, decode) with all `b` slots stepping, for each b in `sizes` (ascending).

    Best of `repeats`, like calibrate_prefill: a noisy neighbour must not shrink the server's capacity. Sizes past
    the first whose tick exceeds `stop_above_s` are not measured: they could not be admitted anyway. A size that
    runs out of device memory ends the calibration at the largest batch that fits, found between the last size that
    fitted and that one, instead of failing the load. One batch is alive at a time, on the model's own weights.
    The KV rings are widened by `max_span_frames` as the served ones are, since a step attends over the whole ring.
    """
    def batch_of(rows: int) -> BatchedModel:
        return BatchedModel(model, rows, GREEDY, max_span_frames, optimisations=optimisations)

    ticks: dict[int, float] = {}
    fits = 0
    for batch in sizes:
        tick = _tick_or_oom(batch_of(batch), repeats)
        if tick is None:
            return _memory_bound(model.device, batch_of, ticks, fits, batch, repeats)
        ticks[batch], fits = tick, batch
        if stop_above_s is not None and tick > stop_above_s:
            break
    return TickCalibration(ticks, None)


def _memory_bound(device: torch.device, batch_of: Callable[[int], BatchedModel], ticks: dict[int, float], fits: int,
                  too_many: int, repeats: int) -> TickCalibration:
    """Bisect between a batch that fitted and one that did not, measuring the ones that fit."""
    while too_many - fits > 1:
        batch = (fits + too_many) // 2
        tick = _tick_or_oom(batch_of(batch), repeats)
        if tick is None:
            too_many = batch
        else:
            ticks[batch], fits = tick, batch
    if fits == 0:
        raise torch.OutOfMemoryError(f"not even one session fits the memory of {device}")
    logger.warning("a batch of %d session(s) does not fit the memory of %s: calibrated up to %d", too_many, device,
                   fits)
    return TickCalibration(ticks, fits)


def _tick_or_oom(batched: BatchedModel, repeats: int) -> float | None:
    """Best tick of the batch's rows, or None when they do not fit the device's memory (everything they took freed)."""
    model = batched.model
    sync = device_sync(model.device)
    pcm = np.zeros(FRAME_SAMPLES, np.float32)
    try:
        batched.start()
        batched.warm_up()
        frames = dict.fromkeys(range(batched.slots), pcm)
        return min(time_call(lambda: batched.tick(frames), sync) for _ in range(repeats))
    except torch.OutOfMemoryError:
        pass  # freed below, once the exception and the frames it holds are gone
    finally:
        batched.close()
    drop_streaming_state(model.lm, model.mimi)  # entering streaming may have stopped half way
    release_memory(model.device)
    return None
