"""Find the question inside a final utterance as ASR delivers it.

Why: a model that emits `<ret>` mid-conversation leaves the backend a whole utterance, e.g. Whisper's "Hello
there, what time is it in Tokyo right now? Thank you.", not a bare question. The tools' patterns (and a small LLM)
need the question itself: the utterance is cut into sentences, greetings, fillers and thanks are stripped, and the
sentences that ask something come first; the others follow, so that a caller can still try each of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A sentence ends at ? or ! and at a full stop before a capital (Whisper capitalises sentences; "a.m. in" stays).
# Whisper often joins sentences with commas ("So I was doing my taxes, what is 200 divided by 4, thanks."): a comma
# before a question word starts a sentence too.
_SENTENCE_END = re.compile(
    r"(?<=[?!])\s+|(?<=\.)\s+(?=[A-Z\"'])"
    r"|,\s+(?=(?i:what|what's|when|where|who|which|why|how|(?:can|could|would|will|do) you)\b)"
)
_GREETING = (
    r"(?:hello|hi|hey|hiya|howdy|greetings|yo|good (?:morning|afternoon|evening|day))"
    r"(?: (?:there|again|everyone|everybody|assistant|buddy|friend))?"
)
_THANKS = r"(?:thank you|thanks|cheers)(?: (?:so|very) much| a lot)?"
_FILLER_WORD = (
    r"(?:okay|ok|alright|all right|so|well|oh|ah|um+|uh+|erm|er|hmm+|yeah|yes|right|sorry|excuse me|and|but|now"
    rf"|actually|listen|{_THANKS})"
)
# Phrases that announce a question; what follows them is the question even without a question word.
_LEAD_IN = (
    r"(?:(?:i )?(?:have|got) a (?:quick )?question(?: for you)?|(?:a |one )?quick question|one more (?:thing|question)"
    r"|let me ask(?: you)?(?: something)?|i was wondering|i wonder|i(?:'d| would) like to know|i (?:want|need) to know"
    r"|(?:can|could|would|will) you (?:please )?(?:tell me|let me know|check)|(?:please )?tell me"
    r"|do you (?:happen to )?know|(?:do you have )?any idea)"
)
# A word is stripped only with what separates it from the rest: "Well-being" and "Sofia" stay whole.
_LEADING = re.compile(rf"^(?:(?:{_GREETING}|{_FILLER_WORD})(?:[\s,.!:;]+|$))+", re.IGNORECASE)
_LEADING_LEAD_IN = re.compile(rf"^{_LEAD_IN}(?:[\s,:;]+|$)", re.IGNORECASE)
_TRAILING = re.compile(
    rf"(?:[\s,;-]*\b(?:{_THANKS}|please|(?:if|when) you (?:can|could|know|get a chance)|if you don'?t mind"
    r"|for me))+[\s.!?,]*$",
    re.IGNORECASE,
)
_INNER_FILLER = re.compile(r"(?:,\s*|\s+)\b(?:um+|uh+|erm|er|hmm+)\b,?", re.IGNORECASE)
# Sentences that carry nothing to look up, once greetings and thanks are gone.
_PLEASANTRY = re.compile(
    r"^(?:that'?s (?:all|it|great|perfect|helpful)|that is all|great|cool|nice|perfect|awesome|good|bye|goodbye"
    r"|see you|have a (?:nice|good) (?:day|one)|appreciate it|much appreciated|no worries|you'?re welcome)$",
    re.IGNORECASE,
)
_ASKING_START = re.compile(
    r"^(?:what|what's|whats|when|where|who|whom|whose|which|why|how|is|are|am|was|were|do|does|did|can|could"
    r"|will|would|should|shall|may|might|tell me|give me|convert|calculate|compute|work out|find)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Candidate:
    """One sentence of the utterance, cleaned; `asking` when it reads as a question or a request."""

    text: str
    asking: bool


def _clean(sentence: str) -> Candidate | None:
    text = _INNER_FILLER.sub("", " " + sentence.strip()).strip()
    text = _LEADING.sub("", text)
    led_in = _LEADING_LEAD_IN.match(text) is not None
    text = _LEADING_LEAD_IN.sub("", text)
    asked = text.rstrip().endswith("?")
    text = _TRAILING.sub("", text).strip(" ,;:-")
    clauses = [clause.strip() for clause in re.split(r"[,;]", text.strip(" ?!.")) if clause.strip()]
    if all(_PLEASANTRY.match(clause) for clause in clauses):  # nothing at all, or "That's all, goodbye."
        return None
    return Candidate(text, asked or led_in or bool(_ASKING_START.match(text)))


def candidates(utterance: str) -> list[Candidate]:
    """The utterance's sentences cleaned of greetings, fillers and thanks: the asking ones first, each group in
    spoken order; pleasantries ("Thank you.", "That's all.") are left out."""
    cleaned = [c for s in _SENTENCE_END.split(utterance.strip()) if (c := _clean(s)) is not None]
    return [c for c in cleaned if c.asking] + [c for c in cleaned if not c.asking]


def best_question(utterance: str) -> str:
    """The likeliest question in the utterance; the utterance itself when nothing is left after cleaning."""
    found = candidates(utterance)
    return found[0].text if found else utterance.strip()


def is_question(utterance: str) -> bool:
    """For `--trigger asr`: does any sentence of the final utterance ask something?"""
    return any(c.asking for c in candidates(utterance))
