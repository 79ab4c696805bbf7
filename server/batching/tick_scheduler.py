"""When to run the next batched tick, which spans ride on it, and how many sessions fit: pure decisions.

A tick costs about the same whatever number of its slots have a frame, and sessions' frames arrive at their own
phases. Running a tick per arriving frame would spend a whole tick on each; waiting for every session would make
the first frame late. So a tick waits for more frames only while its oldest frame can still make the deadline:
the hold is the frame budget less the predicted tick (with the spans it carries) and a safety margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

# Share of the frame budget a full tick may take at admission: the rest is for a span's prefill, waiting for
# frames of other phases, and the event loop's Opus and WebSocket work.
TICK_SHARE = 0.75
MARGIN_S = 0.008
# Ticks a span may be put off before it rides regardless: with a backlog (an overloaded worker, a client that
# sends faster than real time) no tick has room, and the answer would wait until its deadline drops it.
MAX_DEFERS = 2


@dataclass(frozen=True)
class Waiting:
    """A slot's frame waiting for a tick: when it arrived and the frames of the span it carries (0: none)."""

    slot: int
    arrived: float
    span_frames: int = 0
    span_requested: float = 0.0
    span_deferrals: int = 0


@dataclass(frozen=True)
class SpanPlan:
    inject: list[int]
    defer: list[int]


@dataclass(frozen=True)
class Capacity:
    slots: int
    reason: str  # why not one more: said in the 1013 refusal


class TickScheduler:
    def __init__(self, budget_s: float, tick_s: Callable[[int], float], span_s: Callable[[int], float],
                 batch: int, compact: bool, margin_s: float = MARGIN_S) -> None:
        """`tick_s(rows)` and `span_s(frames)` are the calibrated predictions (frontend_model.engine.calibration);
        `compact`: a tick computes the rows from the first to the last slot with a frame, else the whole batch."""
        self.budget_s = budget_s
        self.batch = batch
        self.tick_s = tick_s
        self.span_s = span_s
        self.compact = compact
        self.margin_s = margin_s

    def tick_cost(self, waiting: list[Waiting]) -> float:
        if not self.compact or not waiting:
            return self.tick_s(self.batch)
        slots = [w.slot for w in waiting]
        return self.tick_s(max(slots) - min(slots) + 1)

    def wait_s(self, now: float, waiting: list[Waiting], active: int) -> float:
        """Seconds to wait before running a tick over `waiting` (0: now; inf: nothing to run)."""
        if not waiting:
            return math.inf
        if len(waiting) >= active:
            return 0.0
        oldest = min(w.arrived for w in waiting)
        predicted = self.tick_cost(waiting) + sum(self.span_s(w.span_frames) for w in waiting)
        hold = self.budget_s - predicted - self.margin_s
        return max(0.0, oldest + hold - now)

    def plan_spans(self, now: float, waiting: list[Waiting]) -> SpanPlan:
        """Spans that fit what is left of the oldest frame's budget after the tick, oldest request first; a span
        put off MAX_DEFERS times rides anyway."""
        if not waiting:
            return SpanPlan([], [])
        left = min(w.arrived for w in waiting) + self.budget_s - now - self.tick_cost(waiting)
        inject: list[int] = []
        defer: list[int] = []
        spans = [w for w in waiting if w.span_frames > 0]
        for w in sorted(spans, key=lambda w: (w.span_deferrals < MAX_DEFERS, w.span_requested)):
            cost = self.span_s(w.span_frames)
            if cost <= left or w.span_deferrals >= MAX_DEFERS:
                inject.append(w.slot)
                left -= cost
            else:
                defer.append(w.slot)
        return SpanPlan(inject, defer)


def capacity(tick_s: Callable[[int], float], budget_s: float, max_sessions: int) -> Capacity:
    """Most sessions whose full tick stays within TICK_SHARE of the budget, at most `max_sessions`."""
    limit = budget_s * TICK_SHARE
    slots = 0
    while slots < max_sessions and tick_s(slots + 1) <= limit:
        slots += 1
    slots = max(slots, 1)  # one session always runs: refusing everyone would serve no one
    if slots == max_sessions:
        return Capacity(slots, f"max_sessions is {max_sessions}")
    # Short: it travels in a WebSocket close reason (123 bytes with the JSON around it).
    return Capacity(slots, f"a tick of {slots + 1} would take {tick_s(slots + 1) * 1e3:.0f} ms > {TICK_SHARE:.0%} of "
                           f"the {budget_s * 1e3:.0f} ms frame")


def admit(policy: Literal["calibrated", "fixed"], tick_s: Callable[[int], float], budget_s: float,
          max_sessions: int, memory_slots: int | None = None) -> Capacity:
    """`calibrated`: `capacity`. `fixed`: exactly `max_sessions`, for hosts whose capacity is known and for tests,
    which must not depend on how fast the machine they run on is. Either way no more than `memory_slots`, the
    largest batch calibration found to fit the device's memory: more rows would fail the load."""
    if memory_slots is not None and memory_slots < max_sessions:
        admitted = admit(policy, tick_s, budget_s, memory_slots)
        if admitted.slots == memory_slots:
            return Capacity(memory_slots, f"device memory holds {memory_slots} (max_sessions {max_sessions})")
        return admitted
    if policy == "calibrated":
        return capacity(tick_s, budget_s, max_sessions)
    return Capacity(max_sessions, f"max_sessions is {max_sessions} (admission fixed)")


def admission_log(policy: Literal["calibrated", "fixed"], admitted: Capacity, tick_s: Callable[[int], float],
                  budget_s: float) -> str:
    """The startup line that says how many sessions are served and why; fixed admission says what it overrides."""
    tick_ms = tick_s(admitted.slots) * 1e3
    line = f"{admitted.slots} session(s) in one batch, tick {tick_ms:.1f} ms ({admitted.reason})"
    if policy == "fixed":
        measured = capacity(tick_s, budget_s, admitted.slots)
        if measured.slots < admitted.slots:
            line += f"; calibrated admission would take {measured.slots}: {measured.reason}"
    return line
