"""The trained tiny Context Spanning weights committed with the code, so that no machine has to train them.

Training takes about 42 minutes on the 2-core machines the suite runs on (over the 15 the project allows), so the
weights the default recipe produced are committed, as `weights/contextspan-tiny-<cache key>.safetensors`: the
tensors training changed (the temporal transformer, the embeddings, the text head: the depformer and everything
else are the random base's, rebuilt from the seed; the codec is its own release, `training.codec.release`) and the
agent voice, with the training report as metadata.
`contextspan train --release` writes that file from the cached checkpoint, replacing the previous release.

A recipe whose key has no release (its data, trainer, convention or router code changed) is trained here as
before: the key is `checkpoint.cache_key`, so a stale release is never used.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from frontend_model.loading.checkpoint.files import CONTEXT_SPANNING_WEIGHTS
from frontend_model.loading.loader import load_model
from frontend_model.loading.tiny_files import cached_tiny_checkpoint
from frontend_model.training.cache import cached
from frontend_model.training.checkpoint import (
    PREFIX,
    REPORT,
    VOICE_NAME,
    base_checkpoint,
    cache_dir_of,
    cache_key,
    trained_checkpoint,
    write_checkpoint,
)
from frontend_model.training.trainer import TrainConfig, Trained

logger = logging.getLogger(__name__)
WEIGHTS_DIR = Path(__file__).with_name("weights")
VOICE_KEY = "voice.codes"


def released_file(key: str, weights_dir: Path = WEIGHTS_DIR) -> Path:
    return weights_dir / f"{PREFIX}{key}.safetensors"


def tiny_contextspan_checkpoint(train_config: TrainConfig, cache_dir: Path | None = None,
                                progress: bool = True, weights_dir: Path = WEIGHTS_DIR) -> Path:
    """The checkpoint of `train_config` in the cache: restored from its release if there is one (seconds), else
    trained here (`checkpoint.trained_checkpoint`)."""
    key = cache_key(train_config)
    release = released_file(key, weights_dir)
    target = cache_dir_of(key, cache_dir)
    if release.is_file():
        return cached(target, lambda directory: restore(release, train_config, directory, key, cache_dir))
    if not target.is_dir():
        logger.warning("no released weights for this training recipe (key %s): training here (the default "
                       "recipe: about 42 minutes on 2 cores); `contextspan train --release` commits the result", key)
    return trained_checkpoint(train_config, cache_dir, progress)


def restore(release: Path, train_config: TrainConfig, directory: Path, key: str,
            cache_dir: Path | None = None) -> Path:
    """The released tensors over the random base of the same seed, written as training writes its checkpoint."""
    with safe_open(str(release), framework="pt") as file:
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (a safe_open, not a dict)
        report = json.loads((file.metadata() or {})["training"])
    if report["cache_key"] != key:
        raise ValueError(f"{release} holds the weights of recipe {report['cache_key']}, not {key}")
    base = base_checkpoint(train_config, cache_dir)
    lm = load_model("contextspan", str(base), device="cpu", dtype=torch.float32).lm
    state = {name: value.detach().clone() for name, value in lm.state_dict().items()}
    voice = tensors.pop(VOICE_KEY)
    unknown = set(tensors) - set(state)
    if unknown:
        raise ValueError(f"{release} has tensors the tiny Context Spanning model does not: {sorted(unknown)[:3]}")
    state.update(tensors)
    trained = Trained(state, voice, report["metrics"], report["seconds"])
    write_checkpoint(base, trained, train_config, directory, key)
    (directory / REPORT).write_text(json.dumps({**report, "released": release.name}, indent=2))
    return directory


def release(directory: Path, weights_dir: Path = WEIGHTS_DIR) -> Path:
    """Write the release of the trained checkpoint in `directory` (what `restore` needs, nothing the seed rebuilds)
    into `weights_dir`, and remove the releases of other recipes."""
    report = json.loads((directory / REPORT).read_text())
    seed = report["config"]["seed"]
    trained = torch.load(directory / CONTEXT_SPANNING_WEIGHTS, map_location="cpu", weights_only=True)["model"]
    base = load_model("contextspan", str(cached_tiny_checkpoint("contextspan", seed)), device="cpu",
                      dtype=torch.float32).lm.state_dict()
    changed = {name: value.contiguous() for name, value in trained.items() if not torch.equal(value, base[name])}
    voice = torch.load(directory / "voices" / f"{VOICE_NAME}.pt", map_location="cpu", weights_only=True)["codes"]
    weights_dir.mkdir(parents=True, exist_ok=True)
    target = released_file(report["cache_key"], weights_dir)
    save_file({**changed, VOICE_KEY: voice.contiguous()}, target, metadata={"training": json.dumps(report)})
    for old in weights_dir.glob(f"{PREFIX}*.safetensors"):
        if old != target:
            old.unlink()
    return target
