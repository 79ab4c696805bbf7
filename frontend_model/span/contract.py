"""What a checkpoint's model was trained to read, beyond the ids: the span contract and the prefix defaults.

The Context Spanning model was trained on spans written one way (reference runtime, "training == generation ==
inference"): a tool's output reads `(tool result) ` + the tool's text verbatim, an answer is short (the writer keeps
it to 8-40 words; past `max_words` the span is cut at a word boundary and the cut reported), and when a tool ran and
found nothing, or nothing can answer, the abstain span `(no information found)` makes the model say it does not know.
Its persona prefix comes from its training distribution and names the user. Moshi and PersonaPlex were trained on
none of this: no prefix on spans, no abstain span, no default persona.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from frontend_model.span.voice_prompt import VoicePrompt

VoiceFormat = Literal["codes", "embeddings"]  # Context Spanning's agent codes, PersonaPlex's replayed embeddings
TOOL_RESULT_PREFIX = "(tool result) "
ABSTAIN_TEXT = "(no information found)"
ANSWER_MAX_WORDS = 40
# Data, not code: the reference runtime's default persona (`runtime/default_persona.py`), the most domain-free corner
# of the training personas' shape. A generic "helpful assistant" prompt is off that distribution.
CONTEXT_SPANNING_PERSONA = (
    "You are Kelina, a kind and steady personal guide who helps people with everyday decisions and feelings. You can "
    "explain weighing pros and cons, choosing by your values, sleeping on a big choice. You are moshi, a capable "
    "voice assistant who also handles any everyday request \u2014 looking things up, booking, weather, reminders, "
    "directions \u2014 competently; the role above is your warm manner and the area you know best, not the only "
    "thing you help with."
)


@dataclass(frozen=True)
class SpanContract:
    """One layout's conventions for span text and the persona prefix.

    `voice_format` ("codes" or "embeddings") picks the default voice among the checkpoint's voices when none is named
    (None: no default voice); `default_voice` names one outright. `profile_sentences` appends the user's name and
    place to the persona. `prefix_silences_always` keeps the family's silence frames in a prefix with no voice or no
    text (PersonaPlex's runtime steps them whatever the prompt).
    """

    tool_prefix: str = ""
    abstain_text: str = ""
    max_words: int | None = None
    default_persona: str = ""
    default_voice: str | None = None
    voice_format: VoiceFormat | None = None
    profile_sentences: bool = False
    prefix_silences_always: bool = False

    def span_text(self, text: str, tool_result: bool) -> str:
        """The text a span carries for an answer: a tool's output verbatim behind the tool prefix, else as given."""
        return f"{self.tool_prefix}{text}" if tool_result and self.tool_prefix else text

    def persona_text(self, persona: str | None, name: str | None = None, location: str | None = None) -> str:
        """The persona in effect: the one asked for (None: the layout's default), then the user's name and place."""
        text = (self.default_persona if persona is None else persona).strip()
        if self.profile_sentences:
            known = [f"The user's name is {name.strip()}." if name and name.strip() else "",
                     f"The user is in {location.strip()}." if location and location.strip() else ""]
            text = " ".join(part for part in (text, *known) if part)
        return text

    def voice_name(self, requested: str | None, voices: Mapping[str, VoicePrompt]) -> str | None:
        """The voice in effect: the one asked for, else the layout's default among the checkpoint's voices."""
        if requested:
            return requested
        if self.default_voice is not None and self.default_voice in voices:
            return self.default_voice
        if self.voice_format is None:
            return None
        own = [name for name in sorted(voices) if format_of(voices[name]) == self.voice_format]
        return own[0] if own else None


def format_of(voice: VoicePrompt) -> VoiceFormat:
    return "codes" if voice.codes is not None else "embeddings"


# By checkpoint file layout (frontend_model/loading/profiles.py `Layout`); random in-memory weights get the default.
CONTRACTS: dict[str, SpanContract] = {
    "kyutai": SpanContract(),
    "personaplex": SpanContract(voice_format="embeddings", prefix_silences_always=True),
    "contextspan": SpanContract(tool_prefix=TOOL_RESULT_PREFIX, abstain_text=ABSTAIN_TEXT, max_words=ANSWER_MAX_WORDS,
                                default_persona=CONTEXT_SPANNING_PERSONA, voice_format="codes",
                                profile_sentences=True, prefix_silences_always=True),
}
