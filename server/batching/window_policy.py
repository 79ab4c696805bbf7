"""When a session's window rolls and how many recent frames it keeps: pure decisions, no model.

A step at stream position q attends to positions q - context + 1 .. q, so the persona prefix (positions 0..P-1) is
wholly in reach while every position a slot writes is below `context`. A slot therefore rolls before the frames a
tick writes for it (its span, if one rides, then its step) would reach position `context`: its cache becomes
[prefix + its `keep` most recent frames], exactly a fresh prefill of those (frontend_model/engine/window.py,
`refill_window`), and the tick's frames follow. A span is counted in the tick's frames, so it never straddles a roll:
the roll comes before it. Rolling at `context` rather than at the ring's capacity (`context + max_span_frames`, the
hard limit of a refill) keeps the whole prefix in reach of every step, not only of the ring.

Built ahead (engine/window.py `WindowAhead`), the same window is fed a chunk a tick on a shadow row from a fixed start
(`ahead_window_start`: the frames a roll at the context would keep) once the slot nears the context
(`ahead_start`), and goes in at the tick it has caught up, if the tick's frames fit after it; a build that has not
caught up when the roll is due is finished in that tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

WindowMode = Literal["keep-prefix", "slide"]

# The share of the context a roll frees: after it the slot writes that many frames before the next roll. A roll
# costs a prefill of `keep` frames, paid once per headroom frames; 1/8 rolls a 7B model (3000 frames) once per 30 s
# and still leaves the model 7/8 of its reach as recent history. A larger share rolls less often and forgets more.
HEADROOM_SHARE = 8
AHEAD_LEAST_CHUNK = 16


def resolve_window(setting: Literal["auto", "keep-prefix", "slide"], prefixed_family: bool) -> WindowMode:
    """auto: keep-prefix for the checkpoints trained on sequences that start with a prefix (the PersonaPlex family:
    PersonaPlex and Context Spanning), slide (moshi's own ring) for the others."""
    if setting == "auto":
        return "keep-prefix" if prefixed_family else "slide"
    return setting


@dataclass(frozen=True)
class WindowPolicy:
    """`context`: frames the model attends to; `headroom`: frames a slot writes between two rolls."""

    context: int
    headroom: int

    @classmethod
    def for_context(cls, context: int) -> WindowPolicy:
        return cls(context, max(1, context // HEADROOM_SHARE))

    def keeps_prefix(self, prefix_frames: int) -> bool:
        """Whether a slot with this prefix rolls at all: without a prefix there is nothing to keep (it slides), and a
        prefix that leaves less than the headroom cannot be kept with recent frames after it."""
        return prefix_frames > 0 and prefix_frames + self.headroom < self.context

    def roll(self, offset: int, prefix_frames: int, incoming: int, span_start: int | None = None) -> int | None:
        """Frames to keep when a slot at `offset` must roll before it writes `incoming` frames (its span, then its
        step); None when they fit, or when the slot cannot keep its prefix (it slides).

        keep = context - P - max(headroom, incoming): the incoming frames fit after the roll, and the slot has at
        least `headroom` frames before the next one. A span longer than context - P - headroom fits no such window:
        the slot keeps the usual window where it has the frames, the span goes in past `context` (its last frames
        see part of the prefix only) and the slot rolls again at its next tick; either way its offset stays within
        context + max_span_frames, where its ring still holds the prefix."""
        if not self.keeps_prefix(prefix_frames) or offset + incoming <= self.context:
            return None
        fit = self.context - prefix_frames - max(self.headroom, incoming)
        if fit >= 0:
            return self.keeps_span(fit, offset, prefix_frames, incoming, span_start)
        usual = self.context - prefix_frames - self.headroom
        return usual if offset - prefix_frames >= usual else None

    def usual_keep(self, prefix_frames: int) -> int:
        """Frames a roll at the context keeps when no span rides: the window leaves `headroom` frames free."""
        return self.context - prefix_frames - self.headroom

    def ahead_chunk(self, slots: int, largest: int) -> int:
        """Frames a window built ahead is fed a tick (a power of two, at most `largest`, itself one). A build gains
        chunk - 1 frames a tick on its slot, and one shadow builds for every slot, each rolling once per headroom
        frames: the smallest chunk that builds `slots` windows of the longest keep (no prefix) within a headroom, and
        at least `AHEAD_LEAST_CHUNK` (a forward of a few frames costs about what a step costs on a GPU)."""
        need = max(AHEAD_LEAST_CHUNK, math.ceil(self.usual_keep(0) * slots / self.headroom) + 1)
        return min(largest, 1 << (need - 1).bit_length())

    def keeps_span(self, keep: int, offset: int, prefix_frames: int, incoming: int, span_start: int | None) -> int:
        """`keep`, or the frames since `span_start` (the slot's last span, which the agent may still be saying) where
        `keep` would cut its first columns: at most half a headroom more, the incoming frames still fitting. A span
        cut at its start reads as words out of nowhere, and a small model garbles the rest of its answer."""
        if span_start is None or span_start < prefix_frames:
            return keep
        whole = offset - span_start
        if keep < whole <= keep + self.headroom // 2 and prefix_frames + whole + incoming <= self.context:
            return whole
        return keep

    def ahead_window_start(self, prefix_frames: int, span_start: int | None = None) -> int:
        """The stream position a window built ahead starts at: the first frame a roll at the context would keep, or
        the slot's last span's first (`keeps_span`)."""
        start = prefix_frames + self.headroom
        if span_start is not None and start - self.headroom // 2 <= span_start < start:
            return span_start
        return start

    def ahead_start(self, prefix_frames: int, chunk: int) -> int:
        """The offset from which a slot's window is built ahead: early enough that `chunk` frames a tick catch up
        before the slot reaches the context, a build gaining chunk - 1 frames a tick (a tick to spare)."""
        return self.context - math.ceil(self.usual_keep(prefix_frames) / (chunk - 1)) - 1

    def fits_after(self, offset: int, start: int, prefix_frames: int, incoming: int) -> bool:
        """Whether a window built from `start`, caught up at `offset`, leaves room for the tick's `incoming` frames
        before the context."""
        return prefix_frames + offset - start + incoming <= self.context
