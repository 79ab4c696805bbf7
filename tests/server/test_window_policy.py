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
