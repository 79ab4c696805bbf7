"""Which files make up a checkpoint, found from what is on disk (or on the hub), never from a flag.

- Kyutai Moshi: LM weights, Mimi weights, SentencePiece model; names from an optional `config.json` whose
  `moshi_name`, `mimi_name`, `tokenizer_name` and `mimi_config_name` are names inside the directory, `file://`
  paths (absolute, or relative to the working directory, as `moshi.models.loaders.hf_get` reads them) or
  `hf://owner/repo/file` references (fetched from the hub, or its local cache).
- PersonaPlex: the same file names (`model.safetensors`, `tokenizer-e351c8d8-checkpoint125.safetensors`,
  `tokenizer_spm_32k_3.model`), no config.json needed; told apart from Kyutai's by its 16 depformer heads.
- Context Spanning: the PersonaPlex files plus `context_spanning_7b.pt`, whose weights replace the base's.

Any of them may carry `voices/*.pt` and our own `contextspan.json` (span ids, placeholder codes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download
from moshi.models import loaders

from frontend_model.loading.checkpoint.errors import ModelLoadError

CONTEXT_SPANNING_WEIGHTS = "context_spanning_7b.pt"
OWN_CONFIG = "contextspan.json"
VOICE_SUFFIXES = (".pt", ".safetensors")
# (role, config.json key, names tried in order when the config does not name the file)
_ROLES = (
    ("lm", "moshi_name", (loaders.MOSHI_NAME, "model.pt", "lm.safetensors", "lm.pt")),
    ("mimi", "mimi_name", (loaders.MIMI_NAME, "mimi.safetensors", "mimi.pt")),
    ("tokenizer", "tokenizer_name", (loaders.TEXT_TOKENIZER_NAME, "tokenizer.model")),
)


@dataclass(frozen=True)
class CheckpointFiles:
    lm: Path  # base LM weights
    mimi: Path
    tokenizer: Path
    config: dict[str, Any] = field(default_factory=dict)  # config.json as written
    mimi_config: dict[str, Any] | None = None
    overlay: Path | None = None  # context_spanning_7b.pt: weights over the base
    own_config: Path | None = None  # contextspan.json
    voices: tuple[Path, ...] = ()

    @property
    def source(self) -> str:
        return str(self.lm.parent)


def resolve_checkpoint(checkpoint: str) -> CheckpointFiles:
    """A local directory, or a Hugging Face repo id (Kyutai layout, through moshi's own resolver)."""
    root = Path(checkpoint).expanduser()
    if root.is_dir():
        return local_files(root)
    if checkpoint.startswith(("/", ".", "~")) or root.exists():
        raise ModelLoadError(f"checkpoint directory {root} does not exist (or is not a directory)")
    if root.suffix or "/" not in checkpoint or checkpoint.count("/") > 1:
        raise ModelLoadError(f"checkpoint {checkpoint!r} is neither a local directory nor a Hugging Face repo id")
    return hub_files(checkpoint)


def local_files(root: Path) -> CheckpointFiles:
    config = read_json(root / "config.json") if (root / "config.json").exists() else {}
    found: dict[str, Path] = {}
    missing = []
    for role, key, names in _ROLES:
        if key in config:
            path = resolve_ref(config[key], root, key)
            if not path.exists():
                missing.append(f"{role} ({path}, named by config.json {key})")
        else:
            path = next((root / n for n in names if (root / n).exists()), root / names[0])
            if not path.exists():
                missing.append(f"{role} ({' or '.join(names)})")
        found[role] = path
    overlay = root / CONTEXT_SPANNING_WEIGHTS
    if missing:
        base = (f"; a Context Spanning checkpoint needs the PersonaPlex base files next to {overlay.name}"
                if overlay.exists() else "")
        raise ModelLoadError(f"checkpoint directory {root} is missing: {'; '.join(missing)}{base}")
    mimi_config = None
    if "mimi_config_name" in config:
        mimi_config = read_json(resolve_ref(config["mimi_config_name"], root, "mimi_config_name"))
    own = root / OWN_CONFIG
    return CheckpointFiles(
        found["lm"], found["mimi"], found["tokenizer"], config, mimi_config,
        overlay=overlay if overlay.exists() else None, own_config=own if own.exists() else None,
        voices=tuple(sorted(p for p in (root / "voices").glob("*") if p.suffix in VOICE_SUFFIXES)),
    )


def resolve_ref(value: object, root: Path, key: str) -> Path:
    """A file named in config.json, with moshi's semantics for `file://` and `hf://`."""
    if not isinstance(value, str) or not value:
        raise ModelLoadError(f"{root / 'config.json'}: {key} must be a file name, got {value!r}")
    if value.startswith("file://"):
        return Path(value.removeprefix("file://"))
    if value.startswith("hf://"):
        parts = value.removeprefix("hf://").split("/")
        if len(parts) < 3:
            raise ModelLoadError(f"{root / 'config.json'}: {key} {value!r} is not hf://owner/repo/file")
        try:
            return Path(hf_hub_download("/".join(parts[:2]), "/".join(parts[2:])))
        except Exception as exc:  # the hub client raises many unrelated types for one cause: not reachable/not found
            raise ModelLoadError(
                f"{root / 'config.json'}: {key} {value!r} is neither in the local Hugging Face cache nor fetchable "
                f"({type(exc).__name__}: {exc}); download it and name it with file:///path or a file in {root}"
            ) from exc
    return root / value


def hub_files(repo: str) -> CheckpointFiles:
    try:
        info = loaders.CheckpointInfo.from_hf_repo(repo)
    except Exception as exc:  # the hub client raises many unrelated types for one cause: not reachable/not found
        raise ModelLoadError(
            f"could not fetch {repo!r} from the Hugging Face hub ({type(exc).__name__}: {exc}). Where the hub is "
            f"reachable run `huggingface-cli download {repo} --local-dir DIR`, then pass --checkpoint DIR"
        ) from exc
    return CheckpointFiles(info.moshi_weights, info.mimi_weights, info.tokenizer, info.raw_config or {},
                           info.mimi_config)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ModelLoadError(f"missing {path}") from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path} as JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return data
