"""The persona and voice prefix a session prefills before its handshake."""

from __future__ import annotations

from frontend_model.loading.loader import LoadedModel
from frontend_model.span.block import Prefix
from frontend_model.span.build import build_prefix


class PersonaError(ValueError):
    """The requested persona or voice cannot be prefilled; the message says why."""


def build_persona_block(model: LoadedModel, persona: str, voice: str | None, max_frames: int) -> Prefix | None:
    """The prefix prefilled before the handshake: tokenising, and the voice prompt (read at load) if any."""
    prompt = None
    if voice:
        prompt = model.voice_prompts.get(voice)
        if prompt is None:
            known = ", ".join(sorted(model.voice_prompts)) or "none for this model"
            raise PersonaError(f"unknown voice {voice!r} (known: {known})")
    try:
        prefix = build_prefix(persona, model.tokenizer, model.span, prompt, model.lm.delays)
    except ValueError as exc:
        raise PersonaError(str(exc)) from exc
    if prefix is not None and prefix.frames > max_frames:
        raise PersonaError(f"persona and voice take {prefix.frames} frames; at most {max_frames} fit")
    return prefix
