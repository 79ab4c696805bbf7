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


def keep_window(model: BatchedModel, policy: WindowPolicy, slot: int, offset: int, prefix_frames: int,
                incoming: int, live: Callable[[int], bool]) -> WindowWork:
    """Before `slot`'s tick writes `incoming` frames (its span, then its step) at `offset`; `live(slot)` says
    whether a session still holds a slot (a build for one that left frees the shadow)."""
    ahead, build_s = model.window_ahead, None
    if ahead is not None:
        swapped, build_s = _build_ahead(policy, ahead, slot, offset, prefix_frames, incoming, live)
        if swapped:
            return WindowWork(True, False, build_s)
    keep = policy.roll(offset, prefix_frames, incoming)
    if keep is None:
        return WindowWork(False, False, build_s)
    model.keep_window(slot, prefix_frames, keep)
    return WindowWork(True, True, build_s)


def _build_ahead(policy: WindowPolicy, ahead: WindowAhead, slot: int, offset: int, prefix_frames: int,
                 incoming: int, live: Callable[[int], bool]) -> tuple[bool, float | None]:
    """`slot`'s window built a chunk further (begun once the slot nears the context, while the shadow is free),
    swapped in once caught up, the rest fed at once when the roll is due: (swapped in, seconds fed)."""
    build = ahead.build
    if build is not None and not live(build.slot):
        ahead.forget(build.slot)
        build = None
    if build is None:
        if not policy.keeps_prefix(prefix_frames) or offset < policy.ahead_start(prefix_frames, ahead.chunk):
            return False, None
        build = ahead.begin(slot, prefix_frames, policy.ahead_window_start(prefix_frames))
    elif build.slot != slot:
        return False, None
    due = offset + incoming > policy.context
    start = time.perf_counter()
    left = ahead.feed(offset - build.end if due else ahead.chunk)
    build_s = time.perf_counter() - start
    if left:
        return False, build_s
    if not policy.fits_after(offset, build.start, prefix_frames, incoming):
        ahead.forget(slot)  # a span too long for it: the usual roll makes room
        return False, build_s
    ahead.swap()
    return True, build_s
