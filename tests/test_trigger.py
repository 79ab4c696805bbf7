"""The retrieval trigger by checkpoint: `<ret>` where the model was trained with spans, a heard question elsewhere."""

from __future__ import annotations

import pytest

from server.settings import ServerSettings
from server.trigger import resolve_trigger, span_trained


@pytest.mark.parametrize(("profile", "trained"), [
    ("contextspan", True), ("tiny-contextspan", True), ("moshi", False), ("moshi-7b", False),
    ("personaplex", False), ("tiny-personaplex", False), ("tiny", False),
])
def test_span_trained_profiles(profile: str, trained: bool) -> None:
    assert span_trained(profile) is trained


@pytest.mark.parametrize(("setting", "profile", "forced", "trigger"), [
    ("auto", "contextspan", False, "ret"),
    ("auto", "tiny-contextspan", False, "ret"),
    ("auto", "moshi", False, "asr"),
    ("auto", "personaplex", False, "asr"),
    ("auto", "tiny", False, "asr"),
    ("auto", "tiny", True, "ret"),  # the test hook stands in for a span-trained model's `<ret>`
    ("ret", "moshi", False, "ret"),
    ("asr", "contextspan", False, "asr"),
    ("asr", "tiny", True, "asr"),
])
def test_resolve(setting: str, profile: str, forced: bool, trigger: str) -> None:
    resolved = resolve_trigger(setting, profile, forced)
    assert resolved.trigger == trigger
    assert resolved.why.startswith("auto" if setting == "auto" else "set explicitly")


def test_auto_is_the_default_and_unknown_settings_are_refused() -> None:
    assert ServerSettings().trigger == "auto"
    with pytest.raises(ValueError, match="unknown trigger"):
        resolve_trigger("sometimes", "tiny")
