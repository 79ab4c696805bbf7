"""Streaming Mimi: 80 ms PCM frames <-> one column of codes, for one conversation (FrameCodec) or for every slot
of a batch at once (BatchFrameCodec)."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import torch
from moshi.models.compression import MimiModel

from frontend_model.frame import FRAME_SAMPLES
from frontend_model.moshi_internals.graphs import graph_path, release_graphs, set_up_graphs
from frontend_model.moshi_internals.row_view import active_rows, rows


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
        set_up_graphs(self.mimi, graphed=True)

    def close(self) -> None:
        if self._stream is not None:
            release_graphs(self.mimi)
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
        self.compact = not graph_path(self.device)  # as in BatchEngine
        self._stream: ExitStack | None = None

    def open(self, graphed: bool = True) -> None:
        """`graphed` False: Mimi runs eagerly (the step graphs failed to capture)."""
        if self._stream is not None:
            raise RuntimeError("codec already open")
        self._stream = self.mimi.streaming(self.slots)
        set_up_graphs(self.mimi, graphed)

    def close(self) -> None:
        if self._stream is not None:
            release_graphs(self.mimi)
            self._stream.close()
            self._stream = None

    def reset_slot(self, slot: int) -> None:
        mask = torch.zeros(self.slots, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.mimi.reset_streaming(mask)

    @torch.no_grad()
    def encode(self, pcm: np.ndarray, active: torch.Tensor) -> torch.Tensor:
        """[slots, 1920] PCM -> [slots, codebooks] codes; rows of inactive slots are meaningless."""
        active = active.to(self.device)
        self.mimi.set_exec_mask(active)
        lo, hi = active_rows(active, self.compact)
        x = torch.from_numpy(np.ascontiguousarray(pcm[lo:hi], dtype=np.float32)).to(self.device)[:, None]
        with rows([self.mimi], lo, hi):
            codes = self.mimi.encode(x)[:, :, 0]
        out = torch.zeros((self.slots, codes.shape[1]), dtype=codes.dtype, device=codes.device)
        out[lo:hi] = codes
        return out

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """[slots, codebooks] -> [slots, 1920] float32 PCM, on the device (the tick moves it to the host with its
        other outputs); rows of inactive slots are meaningless."""
        active = active.to(self.device)
        self.mimi.set_exec_mask(active)
        lo, hi = active_rows(active, self.compact)
        with rows([self.mimi], lo, hi):
            pcm = self.mimi.decode(codes[lo:hi].to(self.device)[:, :, None])[:, 0].float()
        out = torch.zeros((self.slots, pcm.shape[1]), dtype=torch.float32, device=self.device)
        out[lo:hi] = pcm
        return out
