"""Load a speech model, its codec, its tokenizer, its voices and its span configuration, by profile.

Checkpoint profiles read the files through `frontend_model.loading.checkpoint`, whatever layout they come in; the random
tiny checkpoints (`tiny-personaplex`, `tiny-contextspan`) go through the same path from the cache directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import sentencepiece
import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel

from frontend_model.frame import FRAME_SAMPLES as FRAME_SAMPLES
from frontend_model.frame import SAMPLE_RATE as SAMPLE_RATE
from frontend_model.loading.checkpoint.errors import ModelLoadError
from frontend_model.loading.checkpoint.files import CheckpointFiles, resolve_checkpoint
from frontend_model.loading.checkpoint.lm_config import check_tokenizer, check_weights, lm_config, trained_dep_q
from frontend_model.loading.checkpoint.own_config import SpanOverrides, read_overrides
from frontend_model.loading.checkpoint.state import context_spanning_state, load_state, read_keys, stored_keys
from frontend_model.loading.checkpoint.voices import VoiceShape, load_voices
from frontend_model.loading.profiles import (
    PROFILE_LAYOUTS,
    PROFILES,
    TINY_CHECKPOINT_PROFILES,
    TINY_LM_CONFIG,
    TINY_MIMI_CONFIG,
    TRAINED_PROFILE,
    Layout,
    full_mimi_config,
    moshi_7b_lm_config,
    reduced_width,
)
from frontend_model.loading.random_weights import random_models
from frontend_model.loading.tiny_files import cached_tiny_checkpoint
from frontend_model.loading.tiny_tokenizer import padded_tokenizer_path, tiny_tokenizer_path
from frontend_model.moshi_internals.depformer import run_depformer_for_agent_only
from frontend_model.span.config import (
    CONTEXT_SPANNING_PREFIX_SILENCE_FRAMES,
    PERSONAPLEX_SILENCE_CODES,
    PERSONAPLEX_SINE_CODES,
    PREFIX_SILENCE_FRAMES,
    SpanConfig,
)
from frontend_model.span.contract import CONTRACTS, SpanContract
from frontend_model.span.placeholders import placeholder_fields
from frontend_model.span.text_ids import AgentText
from frontend_model.span.voice_prompt import VoicePrompt

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    profile: str
    lm: LMModel
    mimi: MimiModel
    tokenizer: sentencepiece.SentencePieceProcessor
    span: SpanConfig
    random_weights: bool
    description: str  # what clients are told (/readyz, session.ready): never a path of this host
    voice_prompts: dict[str, VoicePrompt] = field(default_factory=dict)
    # Random weights would sample `<ret>` and the span markers by chance; such a model must never do that.
    suppressed_text_ids: frozenset[int] = frozenset()
    layout: Layout | None = None  # the file layout the weights were read in; None for in-memory random weights
    source: str = ""  # where the weights were read from (a folder of this host, or a repo id), for the operator's log

    @property
    def device(self) -> torch.device:
        return self.lm.device

    @cached_property
    def agent_text(self) -> AgentText:
        """Which of this checkpoint's text ids are text; built once, since it walks the vocabulary."""
        return AgentText(self.tokenizer, self.span)


def public_name(checkpoint: str) -> str:
    """A checkpoint as clients may see it: a Hugging Face repo id as it is, a local folder by its name alone."""
    path = Path(checkpoint).expanduser()
    return path.resolve().name if path.exists() else checkpoint


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    profile: str,
    checkpoint: str | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    context: int | None = None,
    seed: int = 0,
    reduced: bool = False,
) -> LoadedModel:
    """`context` overrides the LM's attention context (in frames); tests use a small one to wrap rings early.

    `reduced` (random profiles only) builds the profile's architecture at the tiny widths, keeping its vocabulary,
    codebooks, dep_q and delays, so that a CPU test can step `moshi-7b`.
    """
    if profile not in PROFILES:
        raise ModelLoadError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    device = device or default_device()
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if profile in ("tiny", "moshi-7b"):
        return _load_random(profile, device, dtype, context, seed, reduced)
    if reduced:
        raise ModelLoadError(f"reduced width applies to the random profiles tiny and moshi-7b, not {profile!r}")
    if profile in TINY_CHECKPOINT_PROFILES:
        path = cached_tiny_checkpoint(TINY_CHECKPOINT_PROFILES[profile], seed)
        model = _load_checkpoint(profile, str(path), device, dtype, context)
        model.random_weights = True
        model.description = f"{profile}: random weights (seed {seed}) in the {model.layout} layout"
        model.suppressed_text_ids = frozenset({model.span.ret_id, model.span.open_id, model.span.close_id})
        return model
    if profile == TRAINED_PROFILE:
        if not checkpoint:
            raise ModelLoadError(f"profile {TRAINED_PROFILE!r} loads the directory `contextspan train` wrote: "
                                 "frontend_model.training.profile.profile_checkpoint finds or makes it")
        model = _load_checkpoint(profile, checkpoint, device, dtype, context)
        model.description = f"{profile}: the tiny Context Spanning model trained here (seed {seed})"
        return model
    if not checkpoint:
        raise ModelLoadError(
            f"profile {profile!r} needs --checkpoint: a Hugging Face repo id (e.g. kyutai/moshiko-pytorch-bf16) "
            "or a local directory with the LM weights, the Mimi weights and the SentencePiece model"
        )
    return _load_checkpoint(profile, checkpoint, device, dtype, context)


def _load_random(
    profile: str, device: str, dtype: torch.dtype, context: int | None, seed: int, reduced: bool
) -> LoadedModel:
    if profile == "tiny":
        tokenizer_path = tiny_tokenizer_path()
        tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path))
        lm_config = dict(TINY_LM_CONFIG, text_card=tokenizer.vocab_size())
        mimi_config = TINY_MIMI_CONFIG
    else:
        lm_config = reduced_width(moshi_7b_lm_config()) if reduced else moshi_7b_lm_config()
        mimi_config = TINY_MIMI_CONFIG if reduced else full_mimi_config()
        tokenizer_path = padded_tokenizer_path(lm_config["text_card"])
        tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path))
    check_tokenizer(lm_config, tokenizer.vocab_size(), str(tokenizer_path))
    if context is not None:
        lm_config["context"] = context
    lm, mimi = random_models(lm_config, mimi_config, device, dtype, seed)
    span = _span_config(lm, SpanOverrides(**placeholder_fields(mimi)), "random weights")
    width = " at reduced width" if reduced else ""
    description = f"{profile}: random weights (seed {seed}){width}, the audio is noise"
    return LoadedModel(profile, lm, mimi, tokenizer, span, random_weights=True, description=description,
                       suppressed_text_ids=frozenset({span.ret_id, span.open_id, span.close_id}))


def _load_checkpoint(
    profile: str, checkpoint: str, device: str, dtype: torch.dtype, context: int | None
) -> LoadedModel:
    files = resolve_checkpoint(checkpoint)
    state = _lm_state(files)
    config = lm_config(files.config, trained_dep_q(list(state)))
    layout: Layout = "contextspan" if files.overlay else "personaplex" if config["dep_q"] == config["n_q"] else "kyutai"
    if context is not None:
        config["context"] = context
    lm = _assign_lm(state, config, files, device, dtype)
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(files.tokenizer))
    check_tokenizer(config, tokenizer.vocab_size(), str(files.tokenizer))
    trained = run_depformer_for_agent_only(lm) if lm.dep_q > lm.n_q // 2 else lm.dep_q
    mimi = _load_mimi(files, device, lm.n_q // 2)
    overrides = read_overrides(files.own_config)
    if overrides.silence_codes is None and layout == "kyutai":
        overrides = overrides.model_copy(update=placeholder_fields(mimi))
    span = _span_config(lm, overrides, str(files.own_config or files.source), dep_q=trained,
                        prefix_silence_frames=PREFIX_SILENCE_FRAMES[layout], contract=CONTRACTS[layout])
    voices = load_voices(files.voices, VoiceShape.of(lm))
    if PROFILE_LAYOUTS[profile] != layout:
        logger.warning("profile %s, but %s holds a %s checkpoint", profile, checkpoint, layout)
    logger.info("loaded a %s checkpoint from %s: depformer %d codebooks (stepping %d), %d voice(s)", layout,
                checkpoint, trained, lm.dep_q, len(voices))
    return LoadedModel(profile, lm, mimi, tokenizer, span, random_weights=False,
                       description=f"{profile}: {public_name(checkpoint)} ({layout} layout)", voice_prompts=voices,
                       layout=layout, source=checkpoint)


def _lm_state(files: CheckpointFiles) -> dict[str, torch.Tensor]:
    """The LM weights: the base file's, or the Context Spanning checkpoint's with whatever it lacks from the base
    (read lazily from a safetensors base, so a complete fine-tune does not read the 16 GB base at all)."""
    if files.overlay is None:
        return load_state(files.lm)
    state = context_spanning_state(files.overlay)
    return {**read_keys(files.lm, stored_keys(files.lm) - set(state)), **state}


def _assign_lm(state: dict[str, torch.Tensor], config: dict, files: CheckpointFiles, device: str,
               dtype: torch.dtype) -> LMModel:
    lm = loaders.get_moshi_lm(None, lm_kwargs=config, device="meta", dtype=dtype)
    check_weights(lm, state, str(files.overlay or files.lm), config)
    converted = {
        k: (v.float() if k.startswith(("condition_provider.", "fuser.")) else v.to(dtype))
        if v.dtype.is_floating_point else v
        for k, v in state.items()
    }
    lm.load_state_dict(converted, assign=True)
    return lm.to(device).eval()


def _load_mimi(files: CheckpointFiles, device: str, num_codebooks: int) -> MimiModel:
    mimi = loaders.get_mimi(None, files.mimi_config, device=device, num_codebooks=num_codebooks)
    state = load_state(files.mimi)
    try:
        mimi.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelLoadError(f"{files.mimi} does not fit the Mimi architecture"
                             f"{' of ' + 'config.json mimi_config_name' if files.mimi_config else ''}: {exc}") from exc
    mimi.set_num_codebooks(num_codebooks)
    return mimi.to(device)


def _span_config(lm: LMModel, overrides: SpanOverrides, source: str, dep_q: int | None = None,
                 prefix_silence_frames: int = CONTEXT_SPANNING_PREFIX_SILENCE_FRAMES,
                 contract: SpanContract | None = None) -> SpanConfig:
    agent = lm.n_q // 2
    silence = overrides.silence_codes or PERSONAPLEX_SILENCE_CODES
    sine = overrides.sine_codes or PERSONAPLEX_SINE_CODES
    try:
        return SpanConfig(
            ret_id=overrides.ret_id, open_id=overrides.open_id, close_id=overrides.close_id,
            text_pad_id=lm.existing_text_padding_id, silence_codes=tuple(silence), sine_codes=tuple(sine),
            agent_codebooks=agent, user_codebooks=lm.n_q - agent, dep_q=dep_q or lm.dep_q, context=lm.context or 0,
            prefix_silence_frames=prefix_silence_frames, contract=overrides.contract(contract or SpanContract()),
        )
    except ValueError as exc:
        raise ModelLoadError(f"{source}: {exc}") from exc
