"""What every benchmark result carries and where it goes: the machine it ran on, and a JSON file."""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np


def machine_info(device: str | None = None) -> dict[str, Any]:
    """Numbers are never quoted without their machine; torch is imported only when a device is named."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    if device is not None:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads(), device=device)
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def add_max_span_flag(parser: argparse.ArgumentParser) -> None:
    """`--max-span-frames`, defaulting to the server's (CONTEXTSPAN_MAX_SPAN_FRAMES included): every KV ring is widened
    by it, so a bench that sized its rings by the spans it injects would attend over fewer slots than the server."""
    from server.settings import ServerSettings

    parser.add_argument("--max-span-frames", type=int, default=ServerSettings().max_span_frames,
                        help="the server's --max-span-frames: the KV rings are widened by this much, as served")


def add_trained_checkpoint_flag(parser: argparse.ArgumentParser) -> None:
    """`--checkpoint`: the trained model's directory; `trained_checkpoint` fills in the default."""
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: the trained tiny model (cache)")


def trained_checkpoint(path: Path | None) -> Path:
    """`path`, or the tiny model of the default training recipe (its release restored into the cache, or trained)."""
    from frontend_model.training.released import tiny_contextspan_checkpoint
    from frontend_model.training.trainer import TrainConfig

    return path or tiny_contextspan_checkpoint(TrainConfig())


def save_json(path: Path | None, result: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def percentile(values: list[float] | np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def latency_summary(latencies_ms: list[float] | np.ndarray) -> dict[str, float | None]:
    """P50 / P99 / max of per-frame latencies, as the load, fault and soak reports quote them."""
    return {"p50": percentile(latencies_ms, 50), "p99": percentile(latencies_ms, 99),
            "max": round(float(np.max(latencies_ms)), 2) if len(latencies_ms) else None}
