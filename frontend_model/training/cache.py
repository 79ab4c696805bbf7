"""A directory made once per machine: filled in a temporary directory beside it and renamed into place, under a file
lock, so concurrent callers (pytest workers, a second `contextspan train`) wait for one fill instead of running two,
and a fill that dies leaves nothing half-written."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cached(target: Path, fill: Callable[[Path], object]) -> Path:
    """`target`, made by `fill(directory)` first if it is not there."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if target.is_dir():  # another process made it while this one waited
            return target
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
        try:
            fill(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
