"""A session's window kept before its tick: when (window_policy.py) and how (frontend_model/engine/window.py).

With a shadow row (`BatchedModel.window_ahead`), a slot nearing the context has its window built ahead a chunk a
tick, and the built window goes in at the tick it has caught up; a build not caught up when the roll is due is
finished in that tick. Without one, or while another slot's build holds it, or for a span too long for the window
built, the roll prefills all its kept frames in the tick that needs it. The batcher and `bench window` both keep
windows through here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.window import WindowAhead
from server.batching.window_policy import WindowPolicy


@dataclass(frozen=True)
class WindowWork:
    """What keeping a slot's window did before its tick."""

    rolled: bool  # the slot's cache is now [prefix + its recent frames]
    in_tick: bool  # by a prefill of all its kept frames in this tick, not a window built ahead
    build_s: float | None  # seconds spent feeding a window built ahead (None: none was fed)
    shift: int = 0  # positions the kept frames moved back (a frame at p before the roll is at p - shift)


def keep_window(model: BatchedModel, policy: WindowPolicy, slot: int, offset: int, prefix_frames: int,
                incoming: int, live: Callable[[int], bool], span_start: int | None = None) -> WindowWork:
    """Before `slot`'s tick writes `incoming` frames (its span, then its step) at `offset`; `live(slot)` says
    whether a session still holds a slot (a build for one that left frees the shadow); `span_start`: where the
    slot's last span began, kept whole where it can be (`WindowPolicy.keeps_span`)."""
    ahead, build_s = model.window_ahead, None
    if ahead is not None:
        swapped, build_s = _build_ahead(policy, ahead, slot, offset, prefix_frames, incoming, live, span_start)
        if swapped is not None:
            return WindowWork(True, False, build_s, swapped - prefix_frames)
    keep = policy.roll(offset, prefix_frames, incoming, span_start)
    if keep is None:
        return WindowWork(False, False, build_s)
    model.keep_window(slot, prefix_frames, keep)
    return WindowWork(True, True, build_s, offset - keep - prefix_frames)


def _build_ahead(policy: WindowPolicy, ahead: WindowAhead, slot: int, offset: int, prefix_frames: int,
                 incoming: int, live: Callable[[int], bool], span_start: int | None) -> tuple[int | None, float | None]:
    """`slot`'s window built a chunk further (begun once the slot nears the context, while the shadow is free),
    swapped in once caught up, the rest fed at once when the roll is due: (the start of the window swapped in, or
    None; seconds fed)."""
    build = ahead.build
    if build is not None and not live(build.slot):
        ahead.forget(build.slot)
        build = None
    if build is None:
        if not policy.keeps_prefix(prefix_frames) or offset < policy.ahead_start(prefix_frames, ahead.chunk):
            return None, None
        build = ahead.begin(slot, prefix_frames, policy.ahead_window_start(prefix_frames, span_start))
    elif build.slot != slot:
        return None, None
    due = offset + incoming > policy.context
    start = time.perf_counter()
    left = ahead.feed(offset - build.end if due else ahead.chunk, offset)
    build_s = time.perf_counter() - start
    if left:
        return None, build_s
    if not policy.fits_after(offset, build.start, prefix_frames, incoming):
        ahead.forget(slot)  # a span too long for it: the usual roll makes room
        return None, build_s
    ahead.swap(offset)
    return build.start, build_s
