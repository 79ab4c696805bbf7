"""The distilled tiny codec on disk (Mimi's file layout: `tokenizer-e351c8d8-checkpoint125.safetensors` and
`mimi_config.json`, with `codec.json`: what made it), cached once per machine and released with the code, as the
trained model is (`training.released`): distilling takes about 40 minutes here.

The release holds the tensors distillation changed over the seeded random codec of the same width, with the report
as metadata; the cache key hashes the code and the configuration that shape them, so a stale release is never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path

import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from frontend_model.loading import babble, random_weights
from frontend_model.loading.tiny_files import MIMI_CONFIG_NAME
from frontend_model.loading.tiny_tokenizer import cache_root
from frontend_model.training import recipes, served, speech
from frontend_model.training.cache import cached
from frontend_model.training.codec import distil, teacher
from frontend_model.training.codec.distil import LEAD_FRAMES, CodecConfig, Distilled, random_student
from server.wire import leveller

logger = logging.getLogger(__name__)
REPORT = "codec.json"
PREFIX = "tiny-codec-"
WEIGHTS_DIR = Path(__file__).parents[1] / "weights"
_SOURCES = (teacher, distil, recipes, served, speech, random_weights, babble, leveller)


def codec_key(config: CodecConfig) -> str:
    digest = hashlib.sha256()
    for module in _SOURCES:
        digest.update(Path(str(module.__file__)).read_bytes())
    digest.update(Path(__file__).read_bytes())
    recipe = {name: value for name, value in config.as_dict().items() if name != "threads"}
    # Of the trainer's data, the codec's takes use the lead only.
    digest.update(json.dumps([recipe, config.mimi_config(), LEAD_FRAMES], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def released_codec(key: str, weights_dir: Path = WEIGHTS_DIR) -> Path:
    return weights_dir / f"{PREFIX}{key}.safetensors"


def distilled_codec(config: CodecConfig, cache_dir: Path | None = None, progress: bool = True,
                    weights_dir: Path = WEIGHTS_DIR) -> Path:
    """The codec of `config` in the cache: restored from its release if there is one (seconds), else distilled."""
    key = codec_key(config)
    release_file = released_codec(key, weights_dir)
    target = (cache_dir or cache_root()) / "codecs" / f"{PREFIX}{key}"
    if release_file.is_file():
        return cached(target, lambda directory: restore(release_file, config, directory, key))
    if not target.is_dir():
        logger.warning("no released codec for this recipe (key %s): distilling it here (the default: about 40 "
                       "minutes on 2 cores); `contextspan distil --release` commits the result", key)
    return cached(target, lambda directory: write(distil.distil(config, progress), config, directory, key))


def write(distilled: Distilled, config: CodecConfig, directory: Path, key: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in distilled.mimi.state_dict().items()}, directory / loaders.MIMI_NAME)
    (directory / MIMI_CONFIG_NAME).write_text(json.dumps(config.mimi_config()))
    report = {"cache_key": key, "config": config.as_dict(), "metrics": distilled.metrics,
              "seconds": round(distilled.seconds, 1), "machine": f"{platform.machine()}, {os.cpu_count()} cpus"}
    (directory / REPORT).write_text(json.dumps(report, indent=2))
    return directory


def load_codec(directory: Path) -> MimiModel:
    """The codec in `directory`, in eval mode, with the tiny model's 8 codebooks."""
    mimi = loaders.get_mimi(None, json.loads((directory / MIMI_CONFIG_NAME).read_text()), device="cpu",
                            num_codebooks=8)
    mimi.load_state_dict(load_file(directory / loaders.MIMI_NAME))
    return mimi.eval()


def release(directory: Path, weights_dir: Path = WEIGHTS_DIR) -> Path:
    """Write the release of the codec in `directory` into `weights_dir`, removing the releases of other configs."""
    report = json.loads((directory / REPORT).read_text())
    base = random_student(CodecConfig(**report["config"])).state_dict()
    changed = {name: value.contiguous() for name, value in load_file(directory / loaders.MIMI_NAME).items()
               if not torch.equal(value, base[name])}
    weights_dir.mkdir(parents=True, exist_ok=True)
    target = released_codec(report["cache_key"], weights_dir)
    save_file(changed, target, metadata={"codec": json.dumps(report)})
    for old in weights_dir.glob(f"{PREFIX}*.safetensors"):
        if old != target:
            old.unlink()
    return target


def restore(release_file: Path, config: CodecConfig, directory: Path, key: str) -> Path:
    """The released tensors over the seeded random codec, written as distilling writes it."""
    with safe_open(str(release_file), framework="pt") as file:
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (a safe_open, not a dict)
        report = json.loads((file.metadata() or {})["codec"])
    if report["cache_key"] != key:
        raise ValueError(f"{release_file} holds the codec of {report['cache_key']}, not {key}")
    mimi = random_student(config)
    state = mimi.state_dict()
    unknown = set(tensors) - set(state)
    if unknown:
        raise ValueError(f"{release_file} has tensors the tiny codec does not: {sorted(unknown)[:3]}")
    mimi.load_state_dict({**state, **tensors})
    write(Distilled(mimi, report["metrics"], report["seconds"]), config, directory, key)
    (directory / REPORT).write_text(json.dumps({**report, "released": release_file.name}, indent=2))
    return directory
