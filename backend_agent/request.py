"""What the backend is asked at a `<ret>`, with the reference router's semantics (mindlogic-ai/Context-Spanning,
`runtime/mcp/client.py`): the latest unanswered request, self-corrections applied; what the agent already said;
the requests already answered; the profile that fills arguments the user left out.

Why: the model emits `<ret>` when it needs a fact, which is not always right after the user's question: the user may
have asked, then said "yes, please" to the agent's "shall I check?", or corrected themselves ("in Paris, no, I mean
in Tokyo"), or asked a follow-up that only makes sense with the previous answer ("and in London?").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from backend_agent.question import candidates
from backend_agent.tools.numbers import replace_number_words

AGENT_WORDS = 30  # the agent's last words that go into the request

# "..., no, I mean in Tokyo", "... sorry, I meant 12 miles", "... actually, make that London".
_CORRECTION = re.compile(
    r"(?:^|[\s,.;!?-]+)(?:(?:no|nope|sorry|oops|wait|oh|er|um)[\s,.!-]+)*"
    r"(?:i mean|i meant|i should say|make that|scratch that|correction)\b[\s,:.-]*",
    re.IGNORECASE,
)
_PREPOSITION = re.compile(r"^(?:in|at|for|to|from|of|on)\s+\S", re.IGNORECASE)
_PLACE_PHRASE = re.compile(
    r"\b(in|at|for|to|from|of|on)\s+[^,?.!]+?(?=\s*(?:right now|now|today|tomorrow)?\s*[,?.!]|$)", re.IGNORECASE
)
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")
_NUMBER_WITH_UNIT = re.compile(r"^(?P<number>-?\d+(?:[.,]\d+)?)(?:\s+(?P<unit>[a-z]+))?$", re.IGNORECASE)
# What the agent says before it looks something up: "Let me check the time in Tokyo for you."
_AGENT_LEAD_IN = re.compile(
    r"^(?:(?:ok(?:ay)?|sure|alright|right|one (?:moment|second)|hold on)[\s,.!]+)*"
    r"(?:let me|i'?ll|i will|shall i|should i|i can|i'?m going to)\s+(?:quickly\s+)?"
    r"(?:check|see|look up|find out|find|calculate|work out|convert|get)(?:\s+(?:on|for you))?\s+",
    re.IGNORECASE,
)
_FOR_YOU = re.compile(r"\s+for you(?=[\s?.!]*$)", re.IGNORECASE)
# A follow-up that reuses the previous request with one thing changed: "and in London?", "what about 20 miles?"
_FOLLOW_UP = re.compile(
    r"^(?:and|what about|how about|and what about|same for|now)\b[\s,]*(?P<rest>.+)$", re.IGNORECASE
)
# A follow-up that computes on the previous answer: "what is that times two?", "divide the result by 4".
PREVIOUS_ANSWER = re.compile(r"\b(?:that|this|the result|the answer)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Answered:
    """One request already answered in this session: what was asked, which tool answered, with what."""

    question: str
    tool: str
    arguments: dict[str, Any]
    text: str


@dataclass(frozen=True)
class Request:
    """The user's turns not answered yet (oldest first; the last is the newest), the agent's words since, the
    answered history (oldest first), and the profile's place."""

    utterances: tuple[str, ...]
    agent_words: str = ""
    answered: tuple[Answered, ...] = ()
    location: str | None = None

    @classmethod
    def of(cls, question: str) -> Request:
        """A bare question, as `contextspan ask` and the benchmarks put it."""
        return cls((question,))

    @property
    def newest(self) -> str:
        return self.utterances[-1] if self.utterances else ""

    def latest(self) -> str:
        """The latest unanswered request: the newest utterance that asks something, corrected; when none of the
        user's turns asks ("Yes, please."), the agent's last words ("Let me check the time in Tokyo."), else the
        newest utterance."""
        for utterance in reversed(self.utterances):
            corrected = corrected_utterance(utterance)
            if any(c.asking for c in candidates(corrected)):
                return corrected
        said = agent_request(self.agent_words)
        if said:
            return said
        return corrected_utterance(self.newest)

    def follow_up(self) -> str | None:
        """The previous answered question with this request's change spliced in ("and in London?" after "What
        time is it in Tokyo?"), or None when this is no follow-up or nothing was answered before."""
        if not self.answered:
            return None
        match = _FOLLOW_UP.match(self.latest().strip().rstrip("?.!"))
        if match is None:
            return None
        return splice(self.answered[-1].question, match["rest"])

    def previous_value(self) -> str | None:
        """The number of the last answer, for a request that computes on it ("what is that times two?")."""
        if not self.answered or not PREVIOUS_ANSWER.search(self.latest()):
            return None
        numbers = _NUMBER.findall(self.answered[-1].text.replace(",", ""))
        return numbers[-1] if numbers else None


def agent_request(words: str) -> str:
    """What the agent announced it would look up ("Let me check the time in Tokyo." -> "the time in Tokyo"), or
    "" when its last words announce nothing."""
    for sentence in reversed(re.split(r"(?<=[.?!])\s+", words.strip())):
        match = _AGENT_LEAD_IN.match(sentence.strip())
        if match:
            return _FOR_YOU.sub("", sentence.strip()[match.end():]).strip(" ?.!")
    return ""


def last_words(text: str, count: int = AGENT_WORDS) -> str:
    """The last `count` words of what the agent said."""
    return " ".join(text.split()[-count:])


def splice(question: str, fix: str) -> str:
    """`question` with `fix` put where it belongs: a place phrase replaces the last place phrase ("in Tokyo"), a
    number (with its unit) the last number, a bare name the object of the last place phrase, "the X" the last
    "the ..." phrase, anything else as many words at the end; a whole question replaces the question."""
    fix = fix.strip().strip("?.!,").strip()
    if not fix:
        return question
    if any(c.asking for c in candidates(fix)) and not _PREPOSITION.match(fix):
        return fix
    base = replace_number_words(question.strip())
    number = _NUMBER_WITH_UNIT.match(replace_number_words(fix))
    if number is not None:
        found = list(_NUMBER.finditer(base))
        if found:
            last = found[-1]
            tail = base[last.end():]
            if number["unit"]:
                tail = re.sub(r"^\s+[a-z]+", "", tail, count=1, flags=re.IGNORECASE)
                return f"{base[: last.start()]}{number['number']} {number['unit']}{tail}"
            return f"{base[: last.start()]}{number['number']}{tail}"
    if _NUMBER.match(replace_number_words(fix)) and (first := _NUMBER.search(base)):
        return f"{base[: first.start()]}{replace_number_words(fix)}"  # "12 times 7, I mean 12 times 8"
    places = list(_PLACE_PHRASE.finditer(question))
    if places:
        last = places[-1]
        replacement = fix if _PREPOSITION.match(fix) else f"{last[1]} {fix}"
        return f"{question[: last.start()]}{replacement}{question[last.end():]}"
    stem = question.strip().rstrip("?.!")
    article = re.match(r"(the|a|an)\s", fix, re.IGNORECASE)
    if article and (same := list(re.finditer(rf"\b{article[1]}\b", stem, re.IGNORECASE))):
        return f"{stem[: same[-1].start()]}{fix}?"  # "the Mona Lisa, I mean the Night Watch"
    words = stem.split()
    return " ".join([*words[: max(1, len(words) - len(fix.split()))], fix]) + "?"  # as many words as the fix


def corrected_utterance(utterance: str) -> str:
    """The utterance with its self-corrections applied: "What time is it in Paris? No, I mean in Tokyo." is
    "What time is it in Tokyo?"."""
    parts = _CORRECTION.split(utterance)
    text = parts[0]
    for fix in parts[1:]:
        text = splice(text, fix) if text.strip() else fix
    return text.strip()
