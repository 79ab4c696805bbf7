"""`voices/*.pt` read and checked against the LM at load time, so a bad voice file stops the server at start
instead of failing the session that asks for it (the files are small: ~8 s of codes or ~100 embeddings)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from moshi.models.lm import LMModel

from frontend_model.loading.checkpoint.errors import ModelLoadError
from frontend_model.loading.checkpoint.state import SAFETENSORS_SUFFIXES, load_pickle, load_safetensors
from frontend_model.span.voice_prompt import VoicePrompt


@dataclass(frozen=True)
class VoiceShape:
    """What a voice file must match: the Context Spanning codes and the PersonaPlex embeddings and ring."""

    agent_codebooks: int
    card: int
    dim: int
    num_codebooks: int  # rows of the token ring, text included (17)
    ring: int  # columns of PersonaPlex's token ring: max delay + 3 (one more than moshi's LMGen keeps)

    @classmethod
    def of(cls, lm: LMModel) -> VoiceShape:
        return cls(lm.n_q // 2, lm.card, lm.dim, lm.num_codebooks, max(lm.delays) + 3)

    def formats(self) -> str:
        return (f"{{'codes': int64 [{self.agent_codebooks}, frames]}} (Context Spanning) or {{'embeddings': "
                f"[frames, 1, 1, {self.dim}], 'cache': int64 [1, {self.num_codebooks}, {self.ring}]}} (PersonaPlex)")


def load_voices(paths: tuple[Path, ...], shape: VoiceShape) -> dict[str, VoicePrompt]:
    return {path.stem: load_voice(path, shape) for path in paths}


def load_voice(path: Path, shape: VoiceShape) -> VoicePrompt:
    data = load_safetensors(path) if path.suffix in SAFETENSORS_SUFFIXES else load_pickle(path)
    keys = sorted(data) if isinstance(data, dict) else None
    if keys == ["codes"]:
        return VoicePrompt(path.stem, codes=_codes(data["codes"], path, shape))
    if keys == ["cache", "embeddings"]:
        embeddings, cache = _embeddings(data["embeddings"], data["cache"], path, shape)
        return VoicePrompt(path.stem, embeddings=embeddings, cache=cache)
    held = f"keys {keys}" if keys is not None else type(data).__name__
    raise ModelLoadError(f"voice prompt {path}: unknown format ({held}); expected {shape.formats()}")


def _codes(codes: object, path: Path, shape: VoiceShape) -> torch.Tensor:
    ok = (isinstance(codes, torch.Tensor) and not codes.dtype.is_floating_point and codes.dim() == 2
          and codes.shape[0] == shape.agent_codebooks and codes.shape[1] > 0)
    if not ok:
        raise ModelLoadError(f"voice prompt {path}: 'codes' must be int64 [{shape.agent_codebooks}, frames], got "
                             f"{_describe(codes)}")
    assert isinstance(codes, torch.Tensor)
    if codes.min() < 0 or codes.max() >= shape.card:
        raise ModelLoadError(f"voice prompt {path}: codes outside [0, {shape.card})")
    return codes.to(torch.long).contiguous()


def _embeddings(embeddings: object, cache: object, path: Path, shape: VoiceShape) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(embeddings, torch.Tensor) and embeddings.dtype.is_floating_point and embeddings.dim() == 4
            and embeddings.shape[0] > 0 and tuple(embeddings.shape[1:]) == (1, 1, shape.dim)):
        raise ModelLoadError(f"voice prompt {path}: 'embeddings' must be float [frames, 1, 1, {shape.dim}], got "
                             f"{_describe(embeddings)}")
    ring = (1, shape.num_codebooks, shape.ring)
    if not (isinstance(cache, torch.Tensor) and not cache.dtype.is_floating_point and tuple(cache.shape) == ring):
        raise ModelLoadError(f"voice prompt {path}: 'cache' must be int64 {list(ring)}, got {_describe(cache)}")
    return embeddings.contiguous(), cache.to(torch.long).contiguous()


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__
