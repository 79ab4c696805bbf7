"""Calibrations kept on disk (`--calibration-cache`): a restart on the same machine, model and settings reads what an
earlier start measured there instead of spending seconds of its start measuring it again."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from frontend_model.engine.costs import PrefillCost, TickCost
from frontend_model.engine.optimisations import Optimisations
from frontend_model.loading.loader import LoadedModel

logger = logging.getLogger(__name__)


class CalibrationKey(BaseModel):
    """Everything a calibration's numbers depend on: a kept one is read back only where every field is equal."""

    model_config = ConfigDict(frozen=True)

    model: str  # profile, what clients are told and where the weights came from
    machine: str
    torch: str
    threads: int
    tick_sizes: list[int]
    tick_limit_s: float
    max_span_frames: int
    off: list[str]  # optimisations that are off or set to fail: the calibration measures their eager paths

    def file_name(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16] + ".json"


class KeptCalibration(BaseModel):
    key: CalibrationKey
    measured_at: str
    tick_s: dict[int, float]
    step_s: float
    span_s: dict[int, float]
    chunk_s: dict[int, float]
    memory_slots: int | None

    def cost(self) -> TickCost:
        return TickCost(self.tick_s, PrefillCost(self.step_s, self.span_s, self.chunk_s), self.memory_slots)


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device}: {torch.cuda.get_device_name(device)}"
    return f"{device}: {platform.machine()} {platform.processor()} x{os.cpu_count()}"


def calibration_key(model: LoadedModel, tick_sizes: list[int], tick_limit_s: float, max_span_frames: int,
                    optimisations: Optimisations) -> CalibrationKey:
    return CalibrationKey(model=f"{model.profile} | {model.description} | {model.source}",
                          machine=machine_name(model.device), torch=torch.__version__,
                          threads=torch.get_num_threads(), tick_sizes=tick_sizes, tick_limit_s=tick_limit_s,
                          max_span_frames=max_span_frames, off=sorted(set(optimisations.off) | optimisations.fail))


def read_kept(folder: Path, key: CalibrationKey) -> TickCost | None:
    """The calibration kept for `key`, or None: none kept, or one that does not read (measured again, with a
    warning)."""
    path = folder / key.file_name()
    try:
        kept = KeptCalibration.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        logger.warning("the kept calibration %s does not read (%s): measuring again", path.name,
                       " ".join(str(exc).split())[:200])
        return None
    if kept.key != key:
        return None
    logger.info("calibration kept from %s (%s); delete %s to measure again", kept.measured_at, kept.key.machine,
                path)
    return kept.cost()


def keep(folder: Path, key: CalibrationKey, cost: TickCost) -> None:
    """Write atomically, so that replicas sharing the folder never read half a file; a folder that cannot be written
    costs the next start its seconds, not this one."""
    kept = KeptCalibration(key=key, measured_at=datetime.now(UTC).isoformat(timespec="seconds"), tick_s=cost.tick_s,
                           step_s=cost.prefill.step_s, span_s=cost.prefill.span_s, chunk_s=cost.prefill.chunk_s,
                           memory_slots=cost.memory_slots)
    part: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".part", delete=False) as out:
            part = Path(out.name)
            out.write(kept.model_dump_json(indent=1))
        os.replace(part, folder / key.file_name())
    except OSError as exc:
        if part is not None:
            part.unlink(missing_ok=True)
        logger.warning("could not keep the calibration in %s: %s", folder, exc)
