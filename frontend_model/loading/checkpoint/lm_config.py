"""The LM architecture of a checkpoint: Moshi 7B's, with the keys of its config.json we know, checked against the
weights before they are assigned, so that a mismatch names the tensor and the setting instead of failing deep in
torch."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from moshi.models import loaders
from moshi.models.lm import LMModel

from frontend_model.loading.checkpoint.errors import ModelLoadError
from frontend_model.loading.profiles import moshi_7b_lm_config

logger = logging.getLogger(__name__)

# LMModel keyword arguments a Moshi-family config.json may set; anything else is never passed to LMModel.
LM_KEYS = frozenset(loaders._lm_kwargs) | {"depformer_causal"}
# Keys of Kyutai's config.json that name files or configure other tools (see moshi.models.loaders.CheckpointInfo).
FILE_KEYS = frozenset({"moshi_name", "mimi_name", "mimi_config_name", "tokenizer_name", "lora_name", "model_type",
                       "lm_gen_config", "tts_config", "stt_config", "model_id"})
_DEPFORMER_HEAD = re.compile(r"^linears\.(\d+)\.weight$")
_TEXT_TENSORS = ("text_emb.weight", "text_linear.weight")


def trained_dep_q(keys: set[str] | list[str]) -> int | None:
    """How many codebooks the depformer predicts: one output head (`linears.i`) each."""
    steps = [int(m[1]) for k in keys if (m := _DEPFORMER_HEAD.match(k))]
    return max(steps) + 1 if steps else None


def lm_config(raw: dict[str, Any], dep_q: int | None) -> dict[str, Any]:
    """Moshi 7B overridden by the known keys of `raw`; `dep_q` read from the weights unless the config sets it.

    Refused rather than half-loaded: other Kyutai model types (TTS, STT, Hibiki) and Kyutai LoRA adapters.
    """
    if raw.get("model_type", "moshi") != "moshi":
        raise ModelLoadError(f"config.json model_type is {raw['model_type']!r}: this server serves full-duplex "
                             "speech models of the Moshi family (model_type 'moshi')")
    if raw.get("lora_name") or raw.get("lora"):
        raise ModelLoadError("config.json names a Kyutai LoRA adapter (lora_name / lora), which is not supported: "
                             "merge it into the weights first")
    config = moshi_7b_lm_config()
    config.update({k: v for k, v in raw.items() if k in LM_KEYS})
    ignored = sorted(set(raw) - LM_KEYS - FILE_KEYS)
    if ignored:
        logger.info("config.json: ignoring keys this server does not use: %s", ", ".join(ignored))
    if "dep_q" not in raw and dep_q is not None:
        config["dep_q"] = dep_q
    return config


def check_weights(model: LMModel, state: dict[str, torch.Tensor], source: str, config: dict[str, Any]) -> None:
    """Every tensor present with the shape the config gives; the message names the first offenders."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if not (missing or unexpected or wrong):
        return
    problems = []
    text = [k for k in wrong if k in _TEXT_TENSORS]
    if text:
        rows = state["text_linear.weight"].shape[0] if "text_linear.weight" in state else None
        problems.append(f"text_card: the config says {config['text_card']}, the weights' text head has {rows}")
    if "dep_q" in config and trained_dep_q(list(state)) not in (None, config["dep_q"]):
        problems.append(f"dep_q: the config says {config['dep_q']}, the weights have {trained_dep_q(list(state))} "
                        "depformer heads")
    for label, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            problems.append(f"{len(keys)} {label} tensor(s): {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}")
    for k in wrong[:4]:
        problems.append(f"{k} is {list(state[k].shape)}, the config needs {list(expected[k].shape)}")
    raise ModelLoadError(f"{source} does not fit the LM architecture: {'; '.join(problems)}")


def check_tokenizer(config: dict[str, Any], vocab_size: int, source: str) -> None:
    """A text head larger than the tokenizer samples ids the tokenizer cannot decode (SentencePiece raises)."""
    if config["text_card"] != vocab_size:
        raise ModelLoadError(f"text_card mismatch: the LM's text head has {config['text_card']} entries but the "
                             f"tokenizer {source} has {vocab_size} pieces")
