"""What starts a retrieval, by checkpoint: the model's `<ret>` where it was trained to emit one, else a question
heard in the user's final transcript.

Why: only the Context Spanning fine-tune was trained with spans. Moshi and PersonaPlex never emit `<ret>` on
purpose, so on them `ret` would never retrieve; `asr` lets them try spans (an experiment: they were not trained
to read them either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Trigger = Literal["ret", "asr"]


def span_trained(layout: str | None) -> bool:
    """Read from the checkpoint's files (the layout the loader detected), not from the profile's name."""
    return layout == "contextspan"


@dataclass(frozen=True)
class ResolvedTrigger:
    trigger: Trigger
    why: str


def resolve_trigger(setting: str, layout: str | None, forced_ret: bool = False) -> ResolvedTrigger:
    """`auto` -> `ret` for span-trained checkpoints, or where a test hook stands in for the model's `<ret>`
    (`force_ret_frame`, `infer --ret-frames`); `asr` for every other checkpoint. `ret` and `asr` are kept."""
    if setting in ("ret", "asr"):
        return ResolvedTrigger(setting, "set explicitly")  # type: ignore[arg-type]
    if setting != "auto":
        raise ValueError(f"unknown trigger {setting!r}")
    if span_trained(layout):
        return ResolvedTrigger("ret", "auto: a Context Spanning checkpoint was trained to emit <ret> and read spans")
    if forced_ret:
        return ResolvedTrigger("ret", "auto: the test hook stands in for the model's <ret>")
    return ResolvedTrigger("asr", f"auto: a {layout or 'random-weight'} checkpoint was not trained to emit <ret>; a "
                                  "question in the user's final transcript starts retrieval")
