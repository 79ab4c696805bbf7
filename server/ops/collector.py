"""Python's garbage collector, kept from stalling a tick.

A collection holds the GIL, so the model's tick and the event loop wait for it, and a full one walks every object the
collector tracks: a loaded server holds hundreds of thousands (the model's modules, the backend, the imports), a
process that also runs other work (a notebook, the test suite) millions. In the suite a session once waited 500 ms
for one frame at no cost of its own. What loading made lives as long as the server: frozen, no later collection walks
it, and those walk what sessions make (`benchmarks/gc_pause.py` measures both).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Histogram


def freeze_loaded() -> int:
    """Collect everything (a written-off model's cycles too), then freeze what is left; how many objects are frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class PauseWatch:
    """Observes each collection's pause into `histogram` (labelled by generation) while started."""

    def __init__(self, histogram: Histogram, clock: Callable[[], float] = time.perf_counter) -> None:
        self.histogram = histogram
        self.clock = clock
        self._started: float | None = None

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self.clock()
        elif self._started is not None:
            self.histogram.labels(str(info["generation"])).observe(self.clock() - self._started)
            self._started = None

    def start(self) -> None:
        gc.callbacks.append(self._observe)

    def stop(self) -> None:
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)
