"""State dicts read from disk without ever running a pickle's code, and the Context Spanning weights over the base.

`.pt` files go through `torch.load(weights_only=True)` only: a pickle that needs anything but tensors and plain
containers is refused, before any of its code can run.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from frontend_model.loading.checkpoint.errors import ModelLoadError

SAFETENSORS_SUFFIXES = (".safetensors", ".sft", ".sfts")
_COMPILED = re.compile(r"(^|\.)_orig_mod\.")  # torch.compile wraps a module as `<name>._orig_mod`


def load_pickle(path: Path) -> Any:
    """Tensors, dicts, lists and numbers only; a zip-format file is memory-mapped so 16 GB are not read twice."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        raise ModelLoadError(f"refusing to load {path}: it holds more than tensors ({exc})") from exc
    except (RuntimeError, EOFError, OSError) as exc:
        raise ModelLoadError(f"cannot read {path} as a torch checkpoint: {exc}") from exc


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError for a bad header or a short file
        raise ModelLoadError(f"cannot read {path} as safetensors: {exc}") from exc


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from safetensors, or from a `.pt` holding it bare, under `model`, or under Kyutai's
    `fsdp_best_state.model`."""
    if path.suffix in SAFETENSORS_SUFFIXES:
        return load_safetensors(path)
    package = load_pickle(path)
    if isinstance(package, dict) and "fsdp_best_state" in package:
        package = package["fsdp_best_state"]
    if isinstance(package, dict) and "model" in package:
        package = package["model"]
    return _tensor_dict(package, path)


def _tensor_dict(package: object, path: Path) -> dict[str, torch.Tensor]:
    if not isinstance(package, dict) or not all(isinstance(v, torch.Tensor) for v in package.values()):
        raise ModelLoadError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return package


def stored_keys(path: Path) -> set[str]:
    """The tensor names of a weights file; for safetensors from its header alone."""
    if path.suffix not in SAFETENSORS_SUFFIXES:
        return set(load_state(path))
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


def read_keys(path: Path, keys: set[str]) -> dict[str, torch.Tensor]:
    """Only `keys` of a safetensors file, read lazily: the base weights a Context Spanning checkpoint lacks."""
    if path.suffix not in SAFETENSORS_SUFFIXES:
        state = load_state(path)
        return {k: state[k] for k in keys if k in state}
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in keys & set(f.keys())}


def uncompiled(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys as the plain module names them: a state dict saved from a compiled model has `_orig_mod.` in them."""
    return {_COMPILED.sub(r"\1", k): v for k, v in state.items()}


def context_spanning_state(path: Path) -> dict[str, torch.Tensor]:
    """`context_spanning_7b.pt` = {"model": state_dict, optional "lora": {r, alpha}} -> plain LM weights.

    LoRA-adapted Linears are stored as `<name>.base.weight`, `<name>.lora_A` [r, in] and `<name>.lora_B`
    [out, r]; they are merged here into `<name>.weight` = W + (alpha / r) B @ A, computed in float32.
    """
    package = load_pickle(path)
    if not isinstance(package, dict) or "model" not in package:
        raise ModelLoadError(f"{path} does not hold a Context Spanning checkpoint: expected a dict with a 'model' "
                             "state dict")
    state = uncompiled(_tensor_dict(package["model"], path))
    adapted = sorted(k.removesuffix(".lora_A") for k in state if k.endswith(".lora_A"))
    if not adapted:
        return state
    lora = package.get("lora")
    if not isinstance(lora, dict) or "r" not in lora or "alpha" not in lora:
        raise ModelLoadError(f"{path} holds LoRA adapters ({adapted[0]}.lora_A, ...) but no 'lora': {{'r', 'alpha'}} "
                             "entry giving their scale")
    return merge_lora(state, adapted, float(lora["alpha"]) / float(lora["r"]), path)


def merge_lora(state: dict[str, torch.Tensor], adapted: list[str], scale: float, path: Path) -> dict[str, torch.Tensor]:
    merged = dict(state)
    for name in adapted:
        parts = {part: merged.pop(f"{name}.{part}", None) for part in ("base.weight", "lora_A", "lora_B")}
        missing = [f"{name}.{part}" for part, tensor in parts.items() if tensor is None]
        if missing:
            raise ModelLoadError(f"{path}: LoRA layer {name} lacks {', '.join(missing)}")
        base, a, b = parts["base.weight"], parts["lora_A"], parts["lora_B"]
        if a.shape[1] != base.shape[1] or b.shape[0] != base.shape[0] or a.shape[0] != b.shape[1]:
            raise ModelLoadError(f"{path}: LoRA layer {name} has A {list(a.shape)} and B {list(b.shape)}, which do "
                                 f"not fit its weight {list(base.shape)}")
        merged[f"{name}.weight"] = base.float() + scale * (b.float() @ a.float())
        bias = merged.pop(f"{name}.base.bias", None)
        if bias is not None:
            merged[f"{name}.bias"] = bias
    return merged
