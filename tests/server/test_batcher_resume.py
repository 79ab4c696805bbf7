"""A session resumed through the batcher from its saved bytes gets its slot's decoder back: the decoder's streaming
state after `Batcher.resume` (the path both `/api/chat` and `/v1/realtime` resumes take) is the one the uninterrupted
session's decoder had when the bytes were saved, next to a neighbour that streams on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
import torch

from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.costs import PrefillCost, TickCost
from frontend_model.engine.engine import GREEDY
from frontend_model.engine.history import SessionHistory
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from server.batching.batcher import Batcher
from server.batching.tick_scheduler import Capacity
from server.batching.worker import ModelWorker
from server.ops.metrics import Metrics
from server.wire.frame_clock import InputFrame
from tests.support.engine import state_rows

BEFORE = 30  # frames before the history is saved: within the decoder's receptive field, so all of it is rebuilt
TOLERANCE = 1e-6  # the decoder's convolution buffers, keys and values


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model("tiny", device="cpu", dtype=torch.float32)


def frame(i: int) -> InputFrame:
    pcm = np.random.default_rng([3, i]).uniform(-0.3, 0.3, FRAME_SAMPLES).astype(np.float32)
    return InputFrame(i, pcm, time.perf_counter())


def served(model: LoadedModel, body: Callable[[Batcher], Awaitable[list[torch.Tensor]]]) -> list[torch.Tensor]:
    batched = BatchedModel(model, 2, GREEDY, 64, record=True)
    batched.start()
    batched.warm_up()
    cost = TickCost({1: 0.001, 2: 0.001}, PrefillCost(step_s=0.001, span_s={1: 0.001, 64: 0.001}))
    batcher = Batcher(batched, ModelWorker("cpu"), cost, Capacity(2, "test"), 0.080, 30.0, Metrics())

    async def go() -> list[torch.Tensor]:
        batcher.start()
        try:
            return await body(batcher)
        finally:
            await batcher.stop(RuntimeError("test over"))
            batcher.worker.shutdown()

    try:
        return asyncio.run(go())
    finally:
        batched.close()


def decoder(batcher: Batcher, slot: int) -> list[torch.Tensor]:
    mimi = batcher.model.codec.mimi
    return state_rows([mimi.decoder, mimi.decoder_transformer, mimi.upsample], slot)


def test_a_session_resumed_through_the_batcher_gets_the_decoder_it_had(model: LoadedModel) -> None:
    saved: list[bytes] = []

    async def uninterrupted(batcher: Batcher) -> list[torch.Tensor]:
        await batcher.open(0, None)
        for i in range(BEFORE):
            await batcher.step(0, frame(i))
        saved.append((await batcher.saved(0))[0])
        return decoder(batcher, 0)

    async def resumed(batcher: Batcher) -> list[torch.Tensor]:
        await batcher.open(0, None)  # a neighbour that streams on
        await batcher.step(0, frame(0))
        await batcher.resume(1, SessionHistory.from_bytes(saved[0]), None)
        state = decoder(batcher, 1)
        await batcher.step(0, frame(1))
        return state

    expected = served(model, uninterrupted)
    got = served(model, resumed)
    assert any(bool((t != 0).any()) for t in expected if t.is_floating_point()), "a decoder that heard nothing"
    assert all(torch.allclose(a.float(), b.float(), rtol=0, atol=TOLERANCE) for a, b in zip(got, expected, strict=True))
