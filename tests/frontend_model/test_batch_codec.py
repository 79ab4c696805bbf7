"""Batched streaming Mimi: each slot encodes and decodes exactly as a codec of its own would."""

from __future__ import annotations

import numpy as np
import torch

from frontend_model.engine.codec import BatchFrameCodec, FrameCodec
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import load_model
from tests.support.engine import TEST_DEVICE

TICKS = 40


def test_batched_codec_equals_one_codec_per_session() -> None:
    model = load_model("tiny", device=TEST_DEVICE, dtype=torch.float32)
    rng = np.random.default_rng(0)
    pcm = (0.2 * rng.standard_normal((3, TICKS, FRAME_SAMPLES))).astype(np.float32)
    codes = torch.from_numpy(rng.integers(0, 2048, (3, TICKS, 8)))
    joins, idle = [0, 0, 15], {0: {5, 6}, 1: set(), 2: {30}}

    alone = []
    for s in range(3):
        codec = FrameCodec(model.mimi)
        codec.open()
        got = [(codec.encode(pcm[s, t]), codec.decode(codes[s, t])) for t in range(joins[s], TICKS) if t not in idle[s]]
        codec.close()
        alone.append(got)

    batch = BatchFrameCodec(model.mimi, 3)
    batch.open()
    together: list[list] = [[], [], []]
    for t in range(TICKS):
        for s in range(3):
            if t == joins[s] and t > 0:
                batch.reset_slot(s)
        active = torch.tensor([joins[s] <= t and t not in idle[s] for s in range(3)])
        enc = batch.encode(pcm[:, t], active)
        dec = batch.decode(codes[:, t], active)
        for s in range(3):
            if active[s]:
                together[s].append((enc[s], dec[s]))
    batch.close()

    for s in range(3):
        assert len(together[s]) == len(alone[s])
        for (be, bd), (ae, ad) in zip(together[s], alone[s], strict=True):
            assert torch.equal(be, ae)
            np.testing.assert_allclose(bd.cpu(), ad, atol=1e-5)  # the batch's PCM stays on the device
