"""Streaming Mimi: 80 ms PCM frames <-> one column of codes, for one conversation."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import torch
from moshi.models.compression import MimiModel

from frontend_model.loading import FRAME_SAMPLES


class FrameCodec:
    """Owns the codec's streaming state while open; a model serves one open codec at a time."""

    def __init__(self, mimi: MimiModel) -> None:
        self.mimi = mimi
        self.device = next(mimi.parameters()).device
        self._stream: ExitStack | None = None

    def open(self) -> None:
        if self._stream is not None:
            raise RuntimeError("codec already open")
        self._stream = self.mimi.streaming(1)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    @torch.no_grad()
    def encode(self, pcm: np.ndarray) -> torch.Tensor:
        """One frame of float PCM in [-1, 1] -> [codebooks] int64 codes."""
        if pcm.shape != (FRAME_SAMPLES,):
            raise ValueError(f"expected {FRAME_SAMPLES} samples, got {pcm.shape}")
        x = torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)).to(self.device).view(1, 1, -1)
        return self.mimi.encode(x)[0, :, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """[codebooks] codes -> one frame of float PCM."""
        pcm = self.mimi.decode(codes.to(self.device).view(1, -1, 1))
        return pcm[0, 0].float().cpu().numpy()


class BatchFrameCodec:
    """Streaming Mimi for `slots` conversations at once; masked slots keep their state, as in BatchEngine."""

    def __init__(self, mimi: MimiModel, slots: int) -> None:
        self.mimi = mimi
        self.slots = slots
        self.device = next(mimi.parameters()).device
        self._stream: ExitStack | None = None

    def open(self) -> None:
        if self._stream is not None:
            raise RuntimeError("codec already open")
        self._stream = self.mimi.streaming(self.slots)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def reset_slot(self, slot: int) -> None:
        mask = torch.zeros(self.slots, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.mimi.reset_streaming(mask)

    @torch.no_grad()
    def encode(self, pcm: np.ndarray, active: torch.Tensor) -> torch.Tensor:
        """[slots, 1920] PCM -> [slots, codebooks] codes; rows of inactive slots are meaningless."""
        self.mimi.set_exec_mask(active.to(self.device))
        x = torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)).to(self.device)[:, None]
        return self.mimi.encode(x)[:, :, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, active: torch.Tensor) -> np.ndarray:
        """[slots, codebooks] -> [slots, 1920] PCM; rows of inactive slots are meaningless."""
        self.mimi.set_exec_mask(active.to(self.device))
        return self.mimi.decode(codes.to(self.device)[:, :, None])[:, 0].float().cpu().numpy()
