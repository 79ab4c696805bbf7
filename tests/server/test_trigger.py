"""The retrieval trigger by checkpoint: `<ret>` where the model was trained with spans, a heard question elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontend_model.loading.loader import load_model
from frontend_model.loading.tiny_files import write_tiny_checkpoint
from server.session.trigger import resolve_trigger, span_trained
from server.settings import ServerSettings


@pytest.mark.parametrize(("setting", "layout", "forced", "trigger"), [
    ("auto", "contextspan", False, "ret"),
    ("auto", "kyutai", False, "asr"),
    ("auto", "personaplex", False, "asr"),
    ("auto", None, False, "asr"),  # random weights
    ("auto", None, True, "ret"),  # the test hook stands in for a span-trained model's `<ret>`
    ("ret", "kyutai", False, "ret"),
    ("asr", "contextspan", False, "asr"),
    ("asr", None, True, "asr"),
])
def test_resolve(setting: str, layout: str | None, forced: bool, trigger: str) -> None:
    resolved = resolve_trigger(setting, layout, forced)
    assert resolved.trigger == trigger
    assert resolved.why.startswith("auto" if setting == "auto" else "set explicitly")


def test_the_files_not_the_profile_name_say_what_was_trained_with_spans(tmp_path: Path) -> None:
    """A Context Spanning directory served under `--profile personaplex` still retrieves on `<ret>`."""
    context_spanning = write_tiny_checkpoint("contextspan", tmp_path / "cs")
    model = load_model("personaplex", str(context_spanning), device="cpu")
    assert span_trained(model.layout) and resolve_trigger("auto", model.layout).trigger == "ret"
    assert not span_trained(load_model("tiny-personaplex", device="cpu").layout)


def test_auto_is_the_default_and_unknown_settings_are_refused() -> None:
    assert ServerSettings().trigger == "auto"
    with pytest.raises(ValueError, match="unknown trigger"):
        resolve_trigger("sometimes", "tiny")
