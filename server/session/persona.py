"""The persona and voice prefix a session prefills before its handshake."""

from __future__ import annotations

from backend_agent.context_store import Profile
from frontend_model.loading.loader import LoadedModel
from frontend_model.span.block import Prefix
from frontend_model.span.build import build_prefix


class PersonaError(ValueError):
    """The requested persona or voice cannot be prefilled; the message says why."""


def persona_and_voice(model: LoadedModel, persona: str | None, voice: str | None,
                      profile: Profile | None = None) -> tuple[str, str | None]:
    """The persona text and voice in effect: what the client asked for, else the checkpoint's defaults (for
    Context Spanning, the persona of its training and a voice of its own), the user's name and place appended."""
    contract = model.span.contract
    name, location = (profile.name, profile.location) if profile is not None else (None, None)
    return contract.persona_text(persona, name, location), contract.voice_name(voice, model.voice_prompts)


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
