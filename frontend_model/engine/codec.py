"""Streaming Mimi: 80 ms PCM frames <-> one column of codes, for one conversation (FrameCodec) or for every slot
of a batch at once (BatchFrameCodec)."""

from __future__ import annotations

import math
from contextlib import ExitStack

import numpy as np
import torch
from moshi.models.compression import MimiModel
from moshi.modules.conv import StreamingConv1d, StreamingConvTranspose1d

from frontend_model.frame import FRAME_SAMPLES
from frontend_model.moshi_internals.graphs import graph_path, release_graphs, set_up_graphs
from frontend_model.moshi_internals.kv_ring import attention_layers
from frontend_model.moshi_internals.row_view import active_rows, rows

# Frames a warm-up decodes per call where it runs eagerly: on the tiny Mimi 16 to 32 were fastest (100 ms for 130
# frames, against 520 ms one at a time, 2-core CPU). A chunk's earliest positions see up to 31 fewer keys of their
# attention window (the ring holds `context`), which moved the next PCM by 2.4e-7 against frame by frame.
WARM_CHUNK_FRAMES = 16


def decoder_receptive_field(mimi: MimiModel) -> int:
    """Frames of codes back that the decoder's next PCM can still depend on, read from the model: the upsampling
    convolution's, then each transformer layer's `context - 1` positions, then the SEANet decoder's convolutions
    (each one's span at its own rate). A decoder fed that many frames holds the state of one that heard them all."""
    per_frame = mimi.encoder_frame_rate / mimi.frame_rate  # transformer positions a frame of codes becomes
    upsample = getattr(mimi, "upsample", None)  # only where the transformer runs faster than the codes
    frames = _conv_reach(upsample) if upsample is not None else 0.0
    positions = 0.0
    if mimi.decoder_transformer is not None:
        positions += sum((attn.context or 0) - 1 for attn in attention_layers(mimi.decoder_transformer))
    positions += _conv_reach(mimi.decoder)
    return math.ceil(frames + positions / per_frame)


def _conv_reach(module: torch.nn.Module) -> float:
    """Input steps back that the causal convolutions under `module`, in order, reach: a bound, each one's reach added
    at the rate it runs at (`unit`: one of its steps in input steps)."""
    reach, unit = 0.0, 1.0
    for conv in module.modules():
        if isinstance(conv, StreamingConv1d):
            inner = conv.conv.conv
            reach += (inner.kernel_size[0] - 1) * inner.dilation[0] * unit
            unit *= inner.stride[0]
        elif isinstance(conv, StreamingConvTranspose1d):
            inner = conv.convtr.convtr
            reach += (math.ceil(inner.kernel_size[0] / inner.stride[0]) - 1) * unit
            unit /= inner.stride[0]
    return reach


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
    def warm_decoder(self, slot: int, frames: torch.Tensor) -> None:
        """Decode `frames` [codebooks, n] in `slot` and drop the PCM, so that its decoder holds the state of one that
        decoded them (a resumed session's agent audio, engine/history.py `spoken_frames`); the other slots are
        masked, as in a tick. Eagerly, `slot`'s row alone in chunks; on the graph path one frame a call through the
        tick's own decode (the one shape a graph replays)."""
        one = torch.zeros(self.slots, dtype=torch.bool, device=self.device)
        one[slot] = True
        frames = frames.to(self.device)
        if self.compact:
            self.mimi.set_exec_mask(one)
            with rows([self.mimi], slot, slot + 1):
                for chunk in frames.split(WARM_CHUNK_FRAMES, dim=1) if frames.shape[1] else ():  # nothing said yet
                    self.mimi.decode(chunk[None])
            return
        codes = torch.zeros((self.slots, frames.shape[0]), dtype=torch.long, device=self.device)
        for column in frames.T:
            codes[slot] = column
            self.decode(codes, one)

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
