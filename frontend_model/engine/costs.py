"""What a tick and a span cost, as calibration measured them: the engine caps spans, the server schedules ticks and
admits sessions by these numbers. Pure: `calibration.py` measures them."""

from __future__ import annotations

from dataclasses import dataclass, field

from frontend_model.engine.chunked_prefill import SpanPrefill, power_of_two_chunks
from frontend_model.span.build import MIN_SPAN_FRAMES


def interpolate(table: dict[int, float], x: int) -> float:
    """Linear interpolation between measured sizes (extrapolated from the last two past the end)."""
    sizes = sorted(table)
    lo = max((s for s in sizes if s <= x), default=sizes[0])
    hi = min((s for s in sizes if s >= x), default=sizes[-1])
    if lo == hi:
        if x > sizes[-1] and len(sizes) > 1:
            lo, hi = sizes[-2], sizes[-1]
        else:
            return table[lo]
    slope = (table[hi] - table[lo]) / (hi - lo)
    return table[lo] + slope * (x - lo)


@dataclass(frozen=True)
class PrefillCost:
    """Measured cost of one plain step, of a one-pass span prefill of n frames plus the next step (`span_s`), and of a
    chunked prefill of one chunk of each power-of-two size plus the next step (`chunk_s`, empty when not measured).

    A chunked prefill of n frames is predicted as its chunks' costs summed, each without its step: that counts the
    scratch row's copies once per chunk, which errs on the slow side."""

    step_s: float
    span_s: dict[int, float]
    chunk_s: dict[int, float] = field(default_factory=dict)

    def chunked(self, frames: int) -> float | None:
        if not self.chunk_s:
            return None
        chunks = power_of_two_chunks(frames, max(self.chunk_s))
        return self.step_s + sum(self.chunk_s[c] - self.step_s for c in chunks)

    def predict(self, frames: int, mode: SpanPrefill = SpanPrefill.FASTER) -> float:
        """Seconds of a span of `frames` frames and the next step, written as `mode` writes it."""
        if frames <= 0:
            return self.step_s
        one_pass = interpolate(self.span_s, frames)
        chunked = self.chunked(frames)
        if mode is SpanPrefill.ONE_PASS or chunked is None:
            return one_pass
        return chunked if mode is SpanPrefill.CHUNKED else min(one_pass, chunked)

    def chunked_faster(self, frames: int) -> bool:
        chunked = self.chunked(frames)
        return chunked is not None and chunked < self.predict(frames, SpanPrefill.ONE_PASS)

    def max_frames(self, budget_s: float, ceiling: int, mode: SpanPrefill = SpanPrefill.FASTER) -> int:
        """Largest n whose prefill and next step fit the budget (0 if even a one-frame span does not)."""
        best = 0
        for n in range(MIN_SPAN_FRAMES, ceiling + 1):
            if self.predict(n, mode) > budget_s:
                break
            best = n
        return best


@dataclass(frozen=True)
class TickCost:
    """Measured cost of one tick with every slot stepping, per batch size, and of a span's prefill."""

    tick_s: dict[int, float]
    prefill: PrefillCost
    memory_slots: int | None = None  # the largest batch that fits the device's memory, when calibration hit it

    def tick(self, batch: int) -> float:
        return interpolate(self.tick_s, batch)

    def span(self, frames: int) -> float:
        """What injecting a span of `frames` frames adds to a tick (0 for no span)."""
        if frames <= 0:
            return 0.0
        return max(0.0, self.prefill.predict(frames) - self.prefill.step_s)

    def span_budget(self, budget_s: float, batch: int) -> float:
        """The budget to give an engine's span cap (which counts one plain step) so span + tick fit `budget_s`."""
        return budget_s - self.tick(batch) + self.prefill.step_s


def assumed_cost(tick_s: float) -> TickCost:
    """What a server that could not calibrate assumes: every tick takes `tick_s` whatever its batch, and a span adds
    nothing to it, so admission and the span cap are as fixed ones would be (max_sessions, max_span_frames)."""
    return TickCost({1: tick_s}, PrefillCost(step_s=tick_s, span_s={1: tick_s}))
