"""Per-row sampling: every row of a batched step samples with its own temperature, top-k and seed, in one call.

moshi's `LMGen` samples the whole batch with one scalar setting through `moshi.models.lm.sample_token`. The engine
builds its `LMGen` with `TEXT` and `AUDIO` in place of the text and audio temperatures, and `RowSampler.installed`
routes the module's `sample_token` to the sampler for the calls made on this thread inside the block; anywhere
else those markers make moshi's own sampler fail loudly rather than sample with a wrong setting.

Noise is a counter-based hash of (row seed, row draw count, token id), not a shared `torch.Generator`: a row's draws
depend on its own seed and on how many times it has sampled, never on its neighbours. The whole batch samples in a
few tensor ops (one top-k at the widest k of the rows, per-row temperature, Gumbel-max over the hashed noise) with
no per-row kernel and no host sync, which also holds inside the CUDA graph LMGen captures for its depformer (a
graph replays the sampler's tensors, so every update to them is in place).

The sampler also flags, per row and on the device, logits holding a NaN or +inf (a row's max that is not finite):
every logit LMGen samples from passes here, so the flag of a step is read with its outputs, in the same copy.
"""

from __future__ import annotations

import enum
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import moshi.models.lm
import moshi.utils.sampling
import torch

from frontend_model.moshi_internals.graphs import graph_path

SEED_LIMIT = 2**32
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingConfig:
    """An engine's default sampling, the checkpoint's: temperature 0.8 audio / 0.7 text, top-k 250 / 25."""

    use_sampling: bool = True
    temp: float = 0.8
    temp_text: float = 0.7
    top_k: int = 250
    top_k_text: int = 25


class Stream(enum.Enum):
    """Which of a row's settings a `sample_token` call from LMGen uses: passed as LMGen's temperatures."""

    TEXT = "text"
    AUDIO = "audio"


@dataclass(frozen=True)
class RowSampling:
    """One session's sampling. Temperature 0 or top-k 1 is greedy; top-k 0 keeps the whole vocabulary."""

    text_temperature: float
    text_topk: int
    audio_temperature: float
    audio_topk: int
    text_seed: int
    audio_seed: int

    @classmethod
    def from_config(cls, config: SamplingConfig, text_seed: int | None = None,
                    audio_seed: int | None = None) -> RowSampling:
        """The checkpoint's defaults; a seed left out is drawn at random (report it to make a run repeatable)."""
        greedy = not config.use_sampling
        return cls(0.0 if greedy else config.temp_text, config.top_k_text, 0.0 if greedy else config.temp,
                   config.top_k, random_seed() if text_seed is None else text_seed,
                   random_seed() if audio_seed is None else audio_seed)


def random_seed() -> int:
    return secrets.randbelow(SEED_LIMIT)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors: multipliers below 2**31 keep every product inside int64."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x1B873593) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(seed: torch.Tensor, draw: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Uniform (0, 1) float32 for each token id [rows, n] of each row, a function of (seed, draw, token) only."""
    key = _mix32((seed * 0x5BD1E995) ^ (draw * 0x165667B1))  # seed < 2**32, draw small: products inside int64
    bits = _mix32(key[:, None] ^ (token * 0x27D4EB2F))
    return ((bits >> 8).float() + 0.5) / float(1 << 24)


class RowSampler:
    """Settings as [slots] tensors; `sample` draws a [rows..] batch, each row with its own settings."""

    def __init__(self, slots: int, default: RowSampling, device: torch.device) -> None:
        _install()
        self.slots = slots
        self.temperature = {s: torch.zeros(slots, device=device) for s in Stream}
        self.topk = {s: torch.zeros(slots, dtype=torch.long, device=device) for s in Stream}
        self.seed = {s: torch.zeros(slots, dtype=torch.long, device=device) for s in Stream}
        self.draws = torch.zeros(slots, dtype=torch.long, device=device)
        self.active = torch.ones(slots, dtype=torch.bool, device=device)
        self.finite = torch.ones(slots, dtype=torch.bool, device=device)  # since `installed`: no NaN or +inf drawn from
        # Candidates each slot keeps (0: all), host side: eager calls rank only the most any slot keeps; a CUDA graph
        # replays the width it was captured with, so there every call ranks the whole vocabulary.
        self._keep = {s: [0] * slots for s in Stream}
        self._graphed = graph_path(device)
        self._rows = (0, slots)
        for slot in range(slots):
            self.set_row(slot, default)

    def set_row(self, slot: int, sampling: RowSampling, restart: bool = True) -> None:
        """A session's settings for `slot`. `restart` puts its draw count back to 0: the same seed repeats the same
        draws; without it the row goes on with its draws under the new temperatures and top-k."""
        if not 0 <= sampling.text_seed < SEED_LIMIT or not 0 <= sampling.audio_seed < SEED_LIMIT:
            raise ValueError(f"seeds must be in 0..{SEED_LIMIT - 1}")
        if min(sampling.text_temperature, sampling.audio_temperature, sampling.text_topk, sampling.audio_topk) < 0:
            raise ValueError("temperatures and top-k must not be negative")
        values = {Stream.TEXT: (sampling.text_temperature, sampling.text_topk, sampling.text_seed),
                  Stream.AUDIO: (sampling.audio_temperature, sampling.audio_topk, sampling.audio_seed)}
        for stream, (temperature, topk, seed) in values.items():
            self.temperature[stream][slot] = temperature
            self.topk[stream][slot] = topk
            self.seed[stream][slot] = seed
            self._keep[stream][slot] = 1 if temperature <= 0 else topk
        if restart:
            self.draws[slot] = 0

    @contextmanager
    def installed(self, active: torch.Tensor, lo: int = 0, hi: int | None = None) -> Iterator[None]:
        """LMGen's sampling on this thread goes through this sampler for rows lo..hi-1; only `active` rows draw."""
        self.active.copy_(active)
        self.finite.fill_(True)
        self._rows = (lo, self.slots if hi is None else hi)
        previous = getattr(_current, "sampler", None)
        _current.sampler = self
        try:
            yield
        finally:
            _current.sampler = previous

    def sample(self, logits: torch.Tensor, stream: Stream) -> torch.Tensor:
        """logits [rows, ..., vocab] -> token ids [rows, ...]: top-k by rank, then Gumbel-max."""
        lo, hi = self._rows
        rows = hi - lo
        if logits.shape[0] != rows:
            raise ValueError(f"logits for {logits.shape[0]} rows, the sampler is set for rows {lo}..{hi - 1}")
        self.draws[lo:hi] += self.active[lo:hi].long()
        vocab = logits.shape[-1]
        flat = logits.reshape(rows, -1, vocab).float()
        # A row's max is NaN if any logit is, +inf if any is; -inf everywhere (nothing left to sample) fails too.
        self.finite[lo:hi] &= torch.isfinite(flat.amax(dim=-1)).all(dim=-1) | ~self.active[lo:hi]
        temperature = self.temperature[stream][lo:hi]
        topk = self.topk[stream][lo:hi]
        # Greedy rows keep the best token only; top-k 0 means no limit.
        greedy = (temperature <= 0) | (topk == 1)
        keep = torch.where(topk <= 0, vocab, topk.clamp(max=vocab))
        keeps = self._keep[stream][lo:hi]
        width = vocab if self._graphed or 0 in keeps else min(vocab, max(keeps))
        ranked, order = torch.topk(flat, width, dim=-1)
        noise = uniform_noise(self.seed[stream][lo:hi, None].expand(-1, flat.shape[1]).reshape(-1),
                              self.draws[lo:hi, None].expand(-1, flat.shape[1]).reshape(-1),
                              order.reshape(-1, width)).view_as(ranked)
        scale = torch.where(greedy, 1.0, temperature)[:, None, None]
        score = ranked / scale - torch.log(-torch.log(noise))
        rank = torch.arange(width, device=logits.device)
        score = torch.where(rank < keep[:, None, None], score, float("-inf"))
        sampled = order.gather(-1, score.argmax(dim=-1, keepdim=True))[..., 0]
        # A greedy row takes argmax's pick (the first best id) over its own logits, whatever the width ranked.
        return torch.where(greedy[:, None], flat.argmax(dim=-1), sampled).view(logits.shape[:-1])


_current = threading.local()
_moshi_sample_token = moshi.utils.sampling.sample_token


def _sample_token(logits: torch.Tensor, use_sampling: bool = False, temp: object = 1.0, top_k: int = 0,
                  top_p: float = 0.0) -> torch.Tensor:
    sampler: RowSampler | None = getattr(_current, "sampler", None)
    if sampler is None or not isinstance(temp, Stream):
        return _moshi_sample_token(logits, use_sampling, temp, top_k, top_p)  # type: ignore[arg-type]
    return sampler.sample(logits, temp)


def _install() -> None:
    moshi.models.lm.sample_token = _sample_token  # type: ignore[assignment]
