"""The trained model on disk in the Context Spanning file layout, and the per-machine cache of it.

Layout: the tiny base files (random base LM, tokenizer, configs; the Mimi and its config the distilled codec's,
`training.codec`, when the recipe hears through it), `contextspan.json` (the base's, with the
trained default persona `data.TRAINED_PERSONA`: what a session that names none is served, the prefix trained on),
`context_spanning_7b.pt` = `{"model": trained state}` over them, `voices/agent.pt` = `{"codes": agent voice codes}`
and `training.json` (what made it: the cache key, the configuration, the last metrics, the time it took).
`config.json` carries the attention context the model was trained with. Loaded by `--profile contextspan
--checkpoint DIR` like any release.

The cache directory holds one trained checkpoint per hash of what shapes the weights: the code of the convention, the
data and the trainer, the hyper-parameters and data recipe (not how many processes draw the batches: they are the
same), the tiny profile, the seed and the codec's own key. `cache.cached` makes it once per machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from pathlib import Path

import torch
from moshi.models import loaders

from backend_agent import question, request, router
from backend_agent.tools import arithmetic, clock, date, numbers, places, time_in_place, unit_conversion
from frontend_model.loading import babble, random_weights, tiny_files
from frontend_model.loading.checkpoint.files import CONTEXT_SPANNING_WEIGHTS, OWN_CONFIG
from frontend_model.loading.loader import load_model
from frontend_model.loading.profiles import TINY_LM_CONFIG, TINY_MIMI_CONFIG
from frontend_model.loading.tiny_files import MIMI_CONFIG_NAME, cached_tiny_checkpoint
from frontend_model.loading.tiny_tokenizer import cache_root, tiny_tokenizer_path
from frontend_model.span import block, build, config, convention, normaliser
from frontend_model.span.placeholders import placeholder_fields
from frontend_model.training import data, recipes, served, speech, statements, trainer
from frontend_model.training.cache import cached
from frontend_model.training.codec.release import codec_key, distilled_codec, load_codec
from frontend_model.training.trainer import TrainConfig, Trained, train
from server.wire import leveller

VOICE_NAME = "agent"
REPORT = "training.json"
PREFIX = "contextspan-tiny-"
# Every module whose code shapes the training data or the weights (the router, its question finder and its tools write
# the spans; the server's leveller shapes the user's audio; the random codec's codebooks shape what it hears).
_SOURCES = (convention, block, build, config, normaliser, babble, random_weights, tiny_files, data, recipes, served,
            speech, statements, trainer, router, question, request, arithmetic, clock, date, numbers, places,
            time_in_place, unit_conversion, leveller)


def cache_key(train_config: TrainConfig) -> str:
    digest = hashlib.sha256()
    for module in _SOURCES:
        digest.update(Path(str(module.__file__)).read_bytes())
    digest.update(Path(__file__).read_bytes())
    recipe = {name: value for name, value in train_config.as_dict().items() if name not in ("workers", "codec")}
    codec = None if train_config.codec is None else codec_key(train_config.codec)
    inputs = [recipe, TINY_LM_CONFIG, TINY_MIMI_CONFIG, tiny_tokenizer_path().name, codec]
    digest.update(json.dumps(inputs, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def cache_dir_of(key: str, cache_dir: Path | None = None) -> Path:
    """Where the trained checkpoint of recipe `key` lives on this machine."""
    return (cache_dir or cache_root()) / "trained" / f"{PREFIX}{key}"


def trained_checkpoint(train_config: TrainConfig, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The cached trained checkpoint for `train_config`, trained here first if this machine has none."""
    key = cache_key(train_config)
    return cached(cache_dir_of(key, cache_dir),
                  lambda directory: train_into(train_config, directory, key, progress, cache_dir))


def train_into(train_config: TrainConfig, directory: Path, key: str, progress: bool = True,
               cache_dir: Path | None = None) -> Path:
    """Train from the random `tiny-contextspan` base of the same seed and write the result to `directory`."""
    base = base_checkpoint(train_config, cache_dir, progress)
    model = load_model("contextspan", str(base), device="cpu", dtype=torch.float32)
    trained = train(model, train_config, progress)
    return write_checkpoint(base, trained, train_config, directory, key)


def base_checkpoint(train_config: TrainConfig, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The random `tiny-contextspan` base of the recipe's seed, hearing through its distilled codec if it has one."""
    base = cached_tiny_checkpoint("contextspan", train_config.seed)
    if train_config.codec is None:
        return base
    codec = distilled_codec(train_config.codec, cache_dir, progress)
    return cached(base.parent / f"{base.name}-{codec.name}", lambda directory: with_codec(base, codec, directory))


def with_codec(base: Path, codec: Path, directory: Path) -> Path:
    """`base` with `codec`'s files for its Mimi's, and the placeholder codes (`contextspan.json`) that codec gives."""
    shutil.copytree(base, directory, dirs_exist_ok=True)
    for name in (loaders.MIMI_NAME, MIMI_CONFIG_NAME):
        shutil.copy(codec / name, directory / name)
    own = json.loads((directory / OWN_CONFIG).read_text())
    (directory / OWN_CONFIG).write_text(json.dumps({**own, **placeholder_fields(load_codec(codec))}))
    return directory


def write_checkpoint(base: Path, trained: Trained, train_config: TrainConfig, directory: Path, key: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in (loaders.MOSHI_NAME, loaders.MIMI_NAME, loaders.TEXT_TOKENIZER_NAME, MIMI_CONFIG_NAME):
        shutil.copy(base / name, directory / name)
    own = json.loads((base / OWN_CONFIG).read_text())
    (directory / OWN_CONFIG).write_text(json.dumps({**own, "default_persona": data.TRAINED_PERSONA}))
    lm_config = json.loads((base / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**lm_config, "context": train_config.context}))
    torch.save({"model": trained.state}, directory / CONTEXT_SPANNING_WEIGHTS)
    (directory / "voices").mkdir(exist_ok=True)
    torch.save({"codes": trained.voice_codes}, directory / "voices" / f"{VOICE_NAME}.pt")
    report = {"cache_key": key, "config": train_config.as_dict(), "metrics": trained.metrics,
              "seconds": round(trained.seconds, 1), "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
              "torch_threads": torch.get_num_threads()}
    (directory / REPORT).write_text(json.dumps(report, indent=2))
    return directory
