"""When a session's window rolls and what it keeps: pure decisions (server/batching/window_policy.py)."""

from __future__ import annotations

from server.batching.window_policy import WindowPolicy, resolve_window

POLICY = WindowPolicy(context=3000, headroom=375)
P = 120


def test_the_headroom_is_an_eighth_of_the_context() -> None:
    assert WindowPolicy.for_context(3000) == POLICY
    assert WindowPolicy.for_context(4).headroom == 1


def test_a_session_rolls_only_when_its_next_frames_would_reach_the_context() -> None:
    assert POLICY.roll(2999, P, 1) is None  # its step reads at 2999: the prefix still in reach
    assert POLICY.roll(3000, P, 1) == 3000 - P - 375


def test_after_a_roll_the_headroom_is_left_before_the_next_one() -> None:
    keep = POLICY.roll(3000, P, 1)
    assert keep is not None and P + keep + POLICY.headroom == POLICY.context


def test_a_span_that_would_straddle_the_context_rolls_first_and_fits_after() -> None:
    keep = POLICY.roll(2990, P, 500 + 1)
    assert keep is not None and P + keep + 501 == POLICY.context


def test_a_span_too_long_for_any_window_with_the_prefix_keeps_the_usual_window_where_it_can() -> None:
    assert POLICY.roll(2990, P, 2900) == 3000 - P - 375
    assert POLICY.roll(1000, P, 2900) is None  # too few frames yet: it goes in, the next tick rolls


def test_a_session_without_a_prefix_or_with_one_that_leaves_no_headroom_slides() -> None:
    assert POLICY.roll(3000, 0, 1) is None
    assert POLICY.roll(3000, 3000 - 375, 1) is None


def test_auto_keeps_the_prefix_for_the_families_trained_with_one() -> None:
    assert resolve_window("auto", prefixed_family=True) == "keep-prefix"
    assert resolve_window("auto", prefixed_family=False) == "slide"
    assert resolve_window("slide", prefixed_family=True) == "slide"


def test_a_window_built_ahead_starts_where_a_roll_at_the_context_would_keep_from() -> None:
    policy = WindowPolicy.for_context(3000)
    start = policy.ahead_window_start(369)
    assert 3000 - start == policy.usual_keep(369) == 3000 - 369 - 375


def test_one_shadow_builds_every_slots_window_within_a_headroom() -> None:
    policy = WindowPolicy.for_context(3000)
    for slots in (1, 4, 8, 16):
        chunk = policy.ahead_chunk(slots, largest=512)
        assert chunk & (chunk - 1) == 0 and chunk >= 16
        ticks = policy.usual_keep(0) / (chunk - 1)  # a build gains chunk - 1 frames a tick on its slot
        assert slots * ticks <= policy.headroom
    assert policy.ahead_chunk(64, largest=64) == 64


def test_a_build_begun_at_its_start_catches_up_before_the_context() -> None:
    for context, prefix, slots in ((3000, 369, 1), (3000, 369, 16), (96, 38, 2)):
        policy = WindowPolicy.for_context(context)
        chunk = policy.ahead_chunk(slots, largest=512)
        offset = policy.ahead_start(prefix, chunk)
        fed = policy.ahead_window_start(prefix)
        while fed < offset:  # a tick: a chunk fed, then the slot's step
            fed = min(offset, fed + chunk)
            if fed < offset:
                offset += 1
        assert offset < context and policy.fits_after(offset, policy.ahead_window_start(prefix), prefix, 1)


def test_a_built_window_goes_in_only_with_room_for_the_ticks_frames() -> None:
    policy = WindowPolicy.for_context(96)
    start = policy.ahead_window_start(38)
    assert policy.fits_after(95, start, 38, 1)
    assert not policy.fits_after(95, start, 38, 20)


def test_a_span_the_window_would_cut_at_its_start_is_kept_whole_within_half_a_headroom() -> None:
    policy = WindowPolicy.for_context(96)  # headroom 12
    usual = policy.usual_keep(38)
    assert policy.roll(96, 38, 1, span_start=96 - usual - 4) == usual + 4
    assert policy.roll(96, 38, 1, span_start=96 - usual - 7) == usual  # too far back: the usual window
    assert policy.roll(96, 38, 1, span_start=96 - usual + 3) == usual  # inside it anyway
    assert policy.ahead_window_start(38, span_start=38 + 12 - 5) == 38 + 12 - 5
    assert policy.ahead_window_start(38, span_start=38 + 12 - 7) == 38 + 12
