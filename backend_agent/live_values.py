"""Live values come only from a tool (the reference's rule): an LLM reply that states a time of day, a date, a
temperature, a price or a computed number without a tool result behind it is not a span.

Why: a small LLM asked "What time is it in Tokyo?" answers "The time in Tokyo is 9:30 AM" from nothing, and the
speech model reads it out as a fact; abstaining ("no information found") is better than a confident wrong value.
"""

from __future__ import annotations

import re

from backend_agent.router import intent_calls

# Questions whose answer is a live value: it changes with the clock, the market or the weather. Computed values
# (arithmetic, conversions) are the built-in tools' intents (`router.intent_calls`); "how many legs does a spider
# have" is a fact, not one of them.
_LIVE_QUESTION = re.compile(
    r"\b(?:time|clock|date|what day|today|tonight|tomorrow|yesterday|now|current(?:ly)?|at the moment|weather"
    r"|temperature|forecast|price|cost|costs|exchange rate|stock|shares?)\b",
    re.IGNORECASE,
)
_MONTH = r"(?:january|february|march|april|may|june|july|august|september|october|november|december)"
_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_LIVE_VALUE = re.compile(
    r"\b\d{1,2}[:.]\d{2}\b|\b\d{1,2}\s*(?:a\.?m\.?|p\.?m\.?)(?=\W|$)|\bo'?clock\b|\bnoon\b|\bmidnight\b"
    rf"|\b{_WEEKDAY}\b|\b{_MONTH}\s+\d{{1,2}}\b|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\b"
    r"|[$€£¥]\s?\d|\b\d[\d,.]*\s*(?:dollars?|euros?|pounds?|yen|usd|eur|gbp|cents?)\b|\d\s*°|\bdegrees?\b"
    r"|\d",
    re.IGNORECASE,
)
# A small LLM often restates the question instead of answering it ("The user asked how many kilometers ...").
_ECHO = re.compile(r"^\s*(?:the user|you) (?:asked|asks|want|wants|is asking|are asking)\b", re.IGNORECASE)


def asks_live_value(question: str) -> bool:
    """Does the question ask for a value that changes or is computed?"""
    return _LIVE_QUESTION.search(question) is not None or bool(intent_calls(question))


def unbacked_live_value(question: str, reply: str) -> bool:
    """An LLM reply, with no tool behind it, that must not become a span: a live value for a live question, or
    the question restated."""
    return _ECHO.match(reply) is not None or (asks_live_value(question) and _LIVE_VALUE.search(reply) is not None)
