"""The built-in router: a few robust patterns map a spoken question to one of the built-in tools (time, date,
arithmetic, units, knowledge base). It runs first whatever LLM is configured, for the tools whose intent a request
shows (live values come only from tools), and alone when no LLM is. Anything else, or any tool error, is "no span"
(None): a wrong span is worse than none, since the speech model would read it out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backend_agent.answer import Answer, Outcome
from backend_agent.question import candidates
from backend_agent.request import PREVIOUS_ANSWER, Request
from backend_agent.tools.base import Tool, ToolError
from backend_agent.tools.numbers import replace_number_words
from backend_agent.tools.unit_conversion import find_unit

_FILLER = re.compile(
    r"^(?:(?:hey|hi|okay|ok|so|um|uh|well|please|and|but)\b,?\s*"
    r"|(?:can|could|would) you (?:please )?(?:tell me|say|check)?\s*|do you know\s*|tell me\s*|i wonder\s*)+"
)
_TIME = re.compile(  # the whole question must be a time question: "what time does the shop open" is not
    r"^(?:what is |what )?(?:the )?(?:current |local |exact )?time(?: is it| it is)?(?: (?:right )?now)?"
    r"(?: (?:in|at|for|on) (?P<place>.+?))?(?: right now| now| currently| at the moment| today)?$"
)
_PLACE = re.compile(r"\b(?:in|at|for|on)\s+(?P<place>[^\d?!]+)$")
_DATE = re.compile(
    r"\b(?:what|which) (?:day|date)(?: of the week)?(?P<rest>(?: is| was| will(?: it)? be| would be| falls?)\b.*|$)"
    r"|\b(?:today'?s|the) date\b(?P<rest2>.*)$"
)
_RELATIVE_DAY = re.compile(r"\b(today|tomorrow|yesterday)\b")
_NUM = r"-?\d+(?:[.,]\d+)?"
_UNITS_HOW_MANY = re.compile(
    r"^how many (?P<to>.+?) (?:(?:is|are)(?: there)?(?: in)?|in|make|equals?) "
    rf"(?P<value>{_NUM}) ?(?P<from>.+)$"
)
_UNITS_CONVERT = re.compile(
    rf"^(?:convert |what is |how much is )?(?P<value>{_NUM}) ?(?P<from>.+?)"
    r" (?:in terms of|to|in|into|as) (?P<to>.+)$"
)
_CALC_PREFIX = re.compile(  # "workout": how ASR often hears "work out"
    r"^(?:what is|how much is|calculate|compute|evaluate|work ?out|what does|what do you get (?:for|from))\s+"
)
_OPERATOR = re.compile(
    r"[-+*/%^×÷]|\d\s*x\s*\d|\b(?:plus|minus|times|multiplied|divided|over|percent|squared|cubed|power|root"
    r"|mod|modulo|sqrt|abs|round)\b"
)


@dataclass(frozen=True)
class ToolCall:
    """A tool to try, by name, with its arguments."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


def normalise(question: str) -> str:
    """Lower-case, drop punctuation at the end, fillers at the start, and expand "what's"."""
    text = re.sub(r"\s+", " ", question.strip().lower()).replace("’", "'")
    text = re.sub(r"\bwhat'?s\b", "what is", text)
    text = re.sub(r",?\s*please$", "", text.strip(" ?!.,")).strip(" ?!.,")
    return _FILLER.sub("", text).strip(" ?!.,")


def _time_call(text: str) -> ToolCall | None:
    match = _TIME.match(text)
    if not match:
        return None
    return ToolCall("time_in_place", {"place": match["place"]} if match["place"] else {})


def _date_call(text: str) -> ToolCall | None:
    match = _DATE.search(text)
    if not match:
        return None
    rest = (match["rest"] if match["rest"] is not None else match["rest2"]).strip()
    arguments: dict[str, Any] = {}
    place = _PLACE.search(rest)
    if place:
        arguments["place"] = place["place"].strip()
        rest = rest[: place.start()].strip()
    relative = _RELATIVE_DAY.search(rest)
    rest = re.sub(r"^(?:is|was|will be|would be|falls?)(?: on)?\b|\b(?:it|is it)\b", "", rest).strip()
    if relative:
        arguments["date"] = relative[1]
    elif rest:
        arguments["date"] = rest
    return ToolCall("date", arguments)


def _units_call(text: str) -> ToolCall | None:
    for pattern in (_UNITS_HOW_MANY, _UNITS_CONVERT):
        match = pattern.match(text)
        if match and find_unit(match["from"]) and find_unit(match["to"]):
            value = float(match["value"].replace(",", ""))
            return ToolCall(
                "unit_conversion", {"value": value, "from_unit": match["from"], "to_unit": match["to"]}
            )
    return None


def _arithmetic_call(text: str) -> ToolCall | None:
    expression = _CALC_PREFIX.sub("", text)
    if not re.search(r"\d", expression) or not _OPERATOR.search(expression):
        return None
    return ToolCall("arithmetic", {"expression": re.sub(r"\s+(?:equals?|make)$", "", expression)})


def _specific_calls(sentence: str) -> list[ToolCall]:
    text = replace_number_words(normalise(sentence))
    return [call for parse in (_time_call, _date_call, _units_call, _arithmetic_call) if (call := parse(text))]


def intent_calls(utterance: str) -> list[ToolCall]:
    """The built-in tools whose intent the utterance shows (time, date, units, arithmetic), most specific first."""
    return [call for candidate in candidates(utterance) for call in _specific_calls(candidate.text)]


def plan(utterance: str) -> list[ToolCall]:
    """The tool calls worth trying for an utterance as ASR delivers it, most specific first.

    The question is found inside greetings, fillers and thanks (`question.candidates`); the specific tools are
    tried on every sentence, asking ones first; the knowledge base, which matches any shared word, comes last
    and only with the sentences that ask (all of them when none does), so that "Thank you." finds nothing.
    """
    found = candidates(utterance)
    asking = [c for c in found if c.asking] or found
    return [*intent_calls(utterance), *(ToolCall("knowledge_base", {"query": c.text}) for c in asking)]


def request_text(request: Request) -> str:
    """The text to plan on: the latest request, a follow-up spliced into the question it follows, and "that" in a
    request that computes on the last answer replaced by that answer's number (a serial chain across requests)."""
    text = request.follow_up() or request.latest()
    value = request.previous_value()
    if value is not None:
        chained = PREVIOUS_ANSWER.sub(value, text)
        if intent_calls(chained):
            return chained
    return text


def with_profile(call: ToolCall, tool: Tool, location: str | None) -> ToolCall:
    """A place the tool takes and the user did not name is the profile's ("what's the weather?")."""
    properties = tool.parameters.get("properties", {})
    if location and "place" in properties and not str(call.arguments.get("place") or "").strip():
        return ToolCall(call.tool, {**call.arguments, "place": location})
    return call


@dataclass(frozen=True)
class Routed:
    """The router's outcome: an answer ("tool"), a tool of the request's intent that found nothing ("empty",
    with that tool's name), or no tool for this request ("none")."""

    answer: Answer | None
    outcome: Outcome
    tool: str | None = None


class Router:
    """Answers what the given tools can answer; tools missing from the catalogue are skipped."""

    def __init__(self, tools: Mapping[str, Tool]) -> None:
        self._tools = dict(tools)

    def answer(self, question: str) -> Answer | None:
        """The first tool answer for `question`, or None ("no span")."""
        return self.route(Request.of(question)).answer

    def route(self, request: Request, intent_only: bool = False) -> Routed:
        """Try the planned calls in order; the first text wins. With `intent_only`, only the tools whose intent
        the request shows (what an LLM must never answer from its own weights: live values)."""
        text = request_text(request)
        if not text.strip():
            return Routed(None, "none")
        empty: str | None = None
        for call in intent_calls(text) if intent_only else plan(text):
            tool = self._tools.get(call.tool)
            if tool is None:
                continue
            call = with_profile(call, tool, request.location)
            try:
                result = tool.run(call.arguments)
            except ToolError:
                empty = empty or (call.tool if call.tool != "knowledge_base" else None)
                continue
            if result.text.strip():
                return Routed(Answer(text=result.text, source=result.source, tool=call.tool,
                                     arguments=call.arguments), "tool", call.tool)
        return Routed(None, "empty", empty) if empty else Routed(None, "none")
