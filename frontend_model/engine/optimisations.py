"""The GPU optimisations a server starts with, each with an eager path to fall back on: which run, and why one is off.

Each is proven on CPU only (CUDA graphs do not run there), so a user's first GPU start may be the first time one
runs. A start that raises (step graphs that will not capture, a scratch row that does not fit, chunk graphs that will
not capture, a calibration that fails) costs that optimisation, not the server: it is turned off with its cause,
logged in one line, and never tried again in this process, and the caller takes the eager path (the step without
graphs, spans in one pass, assumed costs). /readyz and /metrics report `status()` (server/app/routes.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar, get_args

logger = logging.getLogger(__name__)

Optimisation = Literal["step_graphs", "prefill_graphs", "scratch_row", "calibration", "window_ahead"]
OPTIMISATIONS: tuple[Optimisation, ...] = get_args(Optimisation)
# moshi graphs nothing off CUDA; the scratch row and calibration run on any device.
GPU_ONLY: frozenset[Optimisation] = frozenset({"step_graphs", "prefill_graphs"})

ACTIVE = "active"
UNUSED = "unused"  # the served engine goes without it (spans in one pass where one pass measured faster)
NOT_APPLICABLE = "not applicable (cpu)"
OFF = "off: "
CAUSE_CHARS = 300  # a cause fits a log line, a /readyz field and a glance

T = TypeVar("T")


class InjectedFailure(RuntimeError):
    """An optimisation failing as it starts because `Optimisations.fail` says so (ServerSettings.fail_optimisations)."""


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line, cut to CAUSE_CHARS (CUDA errors run over several lines)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= CAUSE_CHARS else text[: CAUSE_CHARS - 3] + "..."


@dataclass
class Optimisations:
    """What this process's optimisations did when they started; one record per served model, shared by every engine
    on it, so that one that failed stays off for the calibration, the served batch and a restarted worker alike."""

    cuda: bool
    fail: frozenset[Optimisation] = frozenset()  # test hook: these raise InjectedFailure once started, on any device
    off: dict[Optimisation, str] = field(default_factory=dict)  # name -> cause
    used: dict[Optimisation, bool] = field(default_factory=dict)  # by the engine started last: the served one

    def enabled(self, name: Optimisation) -> bool:
        return name not in self.off

    def attempt(self, name: Optimisation, start: Callable[[], T]) -> T | None:
        """`start()`'s result, or None where it raised (the cause is recorded and logged) or `name` is already off:
        the caller then takes its eager path. An injected failure comes after `start` has run, so that the fallback
        has everything a start can leave behind to undo."""
        if not self.enabled(name):
            return None
        try:
            result = start()
            if name in self.fail:
                raise InjectedFailure(f"{name} failed as injected")
        except Exception as exc:
            self.off[name] = cause = one_line(exc)
            logger.warning("optimisation %s disabled: %s", name, cause)
            logger.debug("optimisation %s failed to start", name, exc_info=exc)
            return None
        self.used[name] = True
        return result

    def unused(self, name: Optimisation) -> None:
        """An engine started without `name`: it does not need it."""
        self.used[name] = False

    def state(self, name: Optimisation) -> str:
        if name in self.off:
            return OFF + self.off[name]
        if name in GPU_ONLY and not self.cuda:
            return NOT_APPLICABLE
        return ACTIVE if self.used.get(name) else UNUSED

    def status(self) -> dict[str, str]:
        """Name -> `active`, `unused`, `off: <cause>` or `not applicable (cpu)`, for /readyz and /metrics."""
        return {name: self.state(name) for name in OPTIMISATIONS}
