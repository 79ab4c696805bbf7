"""Load a speech model, its codec, its tokenizer and its span configuration, by profile."""

from __future__ import annotations

import json
import logging
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece
import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from safetensors.torch import load_file

from frontend_model.profiles import (
    PROFILES,
    TINY_LM_CONFIG,
    TINY_MIMI_CONFIG,
    full_mimi_config,
    moshi_7b_lm_config,
)
from frontend_model.span_config import PERSONAPLEX_SILENCE_CODES, PERSONAPLEX_SINE_CODES, SpanConfig
from frontend_model.tiny_tokenizer import tiny_tokenizer_path

logger = logging.getLogger(__name__)

FRAME_SAMPLES = 1920
SAMPLE_RATE = 24000
DEFAULT_SPAN_IDS = {"ret_id": 4, "open_id": 12, "close_id": 13}


class ModelLoadError(RuntimeError):
    """Raised with a message naming exactly what is missing and how to provide it."""


@dataclass
class LoadedModel:
    profile: str
    lm: LMModel
    mimi: MimiModel
    tokenizer: sentencepiece.SentencePieceProcessor
    span: SpanConfig
    random_weights: bool
    description: str
    voice_prompts: dict[str, Path] = field(default_factory=dict)
    # Random weights would sample `<ret>` and the span markers by chance; such a model must never do that.
    suppressed_text_ids: frozenset[int] = frozenset()

    @property
    def device(self) -> torch.device:
        return self.lm.device


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    profile: str,
    checkpoint: str | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    context: int | None = None,
    seed: int = 0,
) -> LoadedModel:
    """`context` overrides the LM's attention context (in frames); tests use a small one to wrap rings early."""
    if profile not in PROFILES:
        raise ModelLoadError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    device = device or default_device()
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if profile in ("tiny", "moshi-7b"):
        return _load_random(profile, device, dtype, context, seed)
    if not checkpoint:
        raise ModelLoadError(
            f"profile {profile!r} needs --checkpoint: a Hugging Face repo id (e.g. kyutai/moshiko-pytorch-bf16) "
            "or a local directory with the LM weights, the Mimi weights and the SentencePiece model"
        )
    return _load_checkpoint(profile, checkpoint, device, dtype, context)


def _load_random(profile: str, device: str, dtype: torch.dtype, context: int | None, seed: int) -> LoadedModel:
    tokenizer_path = tiny_tokenizer_path()
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path))
    if profile == "tiny":
        lm_config = dict(TINY_LM_CONFIG, text_card=tokenizer.vocab_size())
        mimi_config = TINY_MIMI_CONFIG
    else:
        lm_config = moshi_7b_lm_config()
        mimi_config = full_mimi_config()
    if context is not None:
        lm_config["context"] = context
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        mimi = loaders.get_mimi(None, mimi_config, device=device, num_codebooks=lm_config["n_q"] // 2)
        _randomise_codebooks(mimi)
        lm = loaders.get_moshi_lm(None, lm_kwargs=lm_config, device=device, dtype=dtype)
    finally:
        torch.random.set_rng_state(generator_state)
    span = _span_config(lm, mimi, DEFAULT_SPAN_IDS, computed_placeholders=True)
    description = f"{profile}: random weights (seed {seed}), the audio is noise"
    return LoadedModel(profile, lm, mimi, tokenizer, span, random_weights=True, description=description,
                       suppressed_text_ids=frozenset({span.ret_id, span.open_id, span.close_id}))


def _randomise_codebooks(mimi: MimiModel) -> None:
    """Untrained codebooks are all zeros, which would map every frame to code 0 and hide codec bugs.

    Each residual stage gets random codewords at the scale of the residual it quantises, measured on a fixed
    probe signal, so that different sounds get different codes as with a trained codec.
    """
    t = torch.arange(FRAME_SAMPLES * 8, dtype=torch.float32) / SAMPLE_RATE
    probe = torch.stack([0.3 * torch.randn_like(t), 0.5 * torch.sin(2 * math.pi * 440 * t), torch.zeros_like(t)])
    device = next(mimi.parameters()).device
    with torch.no_grad():
        latent = mimi._encode_to_unquantized_latent(probe[:, None].to(device))
        for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
            residual = rvq.input_proj(latent)
            for layer in rvq.vq.layers:
                codebook = layer._codebook
                x = layer.project_in(residual.transpose(1, 2))
                scale = x.std().clamp(min=1e-6)
                codebook.embedding_sum.copy_(torch.randn_like(codebook.embedding_sum) * scale)
                codebook.cluster_usage.fill_(1.0)
                codebook._initialized.fill_(1.0)
                codebook._cached_initialized = False
                codebook.register_buffer("_embedding", None, persistent=False)
                residual = residual - layer.decode(layer.encode(residual))


def _load_checkpoint(
    profile: str, checkpoint: str, device: str, dtype: torch.dtype, context: int | None
) -> LoadedModel:
    files = _resolve_files(profile, checkpoint)
    raw_config = json.loads(files["config"].read_text()) if files.get("config") else {}
    lm_config = _lm_config(profile, raw_config)
    if context is not None:
        lm_config["context"] = context
    span_ids = dict(DEFAULT_SPAN_IDS, **raw_config.get("context_span", {}))
    num_codebooks = max(lm_config["dep_q"], lm_config["n_q"] - lm_config["dep_q"])
    mimi_config = json.loads(files["mimi_config"].read_text()) if files.get("mimi_config") else None
    mimi = _load_mimi(files["mimi"], mimi_config, device, num_codebooks)
    lm = _load_lm(files["lm"], lm_config, device, dtype)
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(files["tokenizer"]))
    span = _span_config(lm, mimi, span_ids, computed_placeholders=profile == "moshi")
    voices = {p.stem: p for p in sorted(files["lm"].parent.glob("voices/*")) if p.suffix in (".pt", ".safetensors")}
    return LoadedModel(
        profile, lm, mimi, tokenizer, span, random_weights=False,
        description=f"{profile}: {checkpoint}", voice_prompts=voices,
    )


def _lm_config(profile: str, raw_config: dict[str, Any]) -> dict[str, Any]:
    if raw_config:
        skip = {"moshi_name", "mimi_name", "mimi_config_name", "tokenizer_name", "lora_name", "model_type",
                "lm_gen_config", "tts_config", "stt_config", "model_id", "context_span"}
        return {k: v for k, v in raw_config.items() if k not in skip}
    config = moshi_7b_lm_config()
    if profile in ("personaplex", "contextspan"):
        config["dep_q"] = 16
        config["text_card"] = 32001
    return config


_NAMES = {
    "lm": ("model.safetensors", "model.pt", "lm.safetensors", "lm.pt"),
    "mimi": (loaders.MIMI_NAME, "mimi.safetensors", "mimi.pt"),
    "tokenizer": (loaders.TEXT_TOKENIZER_NAME, "tokenizer.model"),
}


def _resolve_files(profile: str, checkpoint: str) -> dict[str, Path]:
    root = Path(checkpoint).expanduser()
    if root.is_dir():
        return _local_files(root)
    if root.suffix or "/" not in checkpoint or checkpoint.count("/") > 1:
        raise ModelLoadError(f"checkpoint {checkpoint!r} is neither a local directory nor a Hugging Face repo id")
    return _hub_files(profile, checkpoint)


def _local_files(root: Path) -> dict[str, Path]:
    config = root / "config.json"
    raw = json.loads(config.read_text()) if config.exists() else {}
    found: dict[str, Path] = {"config": config} if config.exists() else {}
    missing = []
    for role, names in _NAMES.items():
        key = {"lm": "moshi_name", "mimi": "mimi_name", "tokenizer": "tokenizer_name"}[role]
        candidates = (raw[key], *names) if key in raw else names
        path = next((root / n for n in candidates if (root / n).exists()), None)
        if path is None:
            missing.append(f"{role} ({' or '.join(candidates)})")
        else:
            found[role] = path
    if "mimi_config_name" in raw:
        found["mimi_config"] = root / raw["mimi_config_name"]
    if missing:
        raise ModelLoadError(f"checkpoint directory {root} is missing: {'; '.join(missing)}")
    return found


def _hub_files(profile: str, repo: str) -> dict[str, Path]:
    try:
        info = loaders.CheckpointInfo.from_hf_repo(repo)
    except Exception as exc:  # the hub client raises many unrelated types for one cause: not reachable/not found
        raise ModelLoadError(
            f"could not fetch {repo!r} from the Hugging Face hub ({type(exc).__name__}: {exc}). Where the hub is "
            f"reachable run `huggingface-cli download {repo} --local-dir DIR`, then pass --checkpoint DIR"
        ) from exc
    found = {"lm": info.moshi_weights, "mimi": info.mimi_weights, "tokenizer": info.tokenizer}
    if info.raw_config is not None:
        cfg = info.moshi_weights.parent / "config.json"
        if cfg.exists():
            found["config"] = cfg
    return found


def _load_state(path: Path, device: str) -> dict[str, torch.Tensor]:
    if path.suffix in (".safetensors", ".sft", ".sfts"):
        return load_file(str(path), device=device)
    # Pickled checkpoints may come from anywhere: never let them run code.
    try:
        package = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ModelLoadError(f"refusing to load {path}: it holds more than tensors ({exc})") from exc
    for key in ("fsdp_best_state", "model"):
        if isinstance(package, dict) and key in package:
            package = package[key]
            if key == "fsdp_best_state":
                package = package["model"]
    if not isinstance(package, dict):
        raise ModelLoadError(f"{path} does not hold a state dict")
    return package


def _load_mimi(path: Path, config: dict[str, Any] | None, device: str, num_codebooks: int) -> MimiModel:
    mimi = loaders.get_mimi(None, config, device=device, num_codebooks=num_codebooks)
    mimi.load_state_dict(_load_state(path, device))
    mimi.set_num_codebooks(num_codebooks)
    return mimi


def _load_lm(path: Path, lm_config: dict[str, Any], device: str, dtype: torch.dtype) -> LMModel:
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_config, device="meta", dtype=dtype)
    state = {
        k: (v.float() if k.startswith(("condition_provider.", "fuser.")) else v.to(dtype))
        if v.dtype.is_floating_point else v
        for k, v in _load_state(path, device).items()
    }
    lm.load_state_dict(state, assign=True)
    return lm.to(device).eval()


def placeholder_signals() -> tuple[torch.Tensor, torch.Tensor]:
    """80 ms of silence and of a 440 Hz sine at amplitude 0.5: what span frames stand in for on each side."""
    t = torch.arange(FRAME_SAMPLES, dtype=torch.float32) / SAMPLE_RATE
    return torch.zeros(FRAME_SAMPLES), 0.5 * torch.sin(2 * math.pi * 440.0 * t)


@torch.no_grad()
def compute_placeholder_codes(mimi: MimiModel, warmup_frames: int = 3) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Codes of one frame of steady silence and of the sine, read after the codec's causal state has filled."""
    silence, sine = placeholder_signals()
    frames = warmup_frames + 1
    pcm = torch.stack([silence.repeat(frames), sine.repeat(frames)])[:, None]
    codes = mimi.encode(pcm.to(next(mimi.parameters()).device))[:, :, -1].tolist()
    return tuple(codes[0]), tuple(codes[1])


def _span_config(lm: LMModel, mimi: MimiModel, ids: dict[str, int], computed_placeholders: bool) -> SpanConfig:
    agent = lm.n_q // 2
    if computed_placeholders:
        silence, sine = compute_placeholder_codes(mimi)
    else:
        silence, sine = PERSONAPLEX_SILENCE_CODES, PERSONAPLEX_SINE_CODES
    return SpanConfig(
        ret_id=ids["ret_id"], open_id=ids["open_id"], close_id=ids["close_id"],
        text_pad_id=lm.existing_text_padding_id,
        silence_codes=tuple(silence[:agent]), sine_codes=tuple(sine[: lm.n_q - agent]),
        agent_codebooks=agent, user_codebooks=lm.n_q - agent, dep_q=lm.dep_q, context=lm.context or 0,
    )
