"""What the synthetic conversations say: questions the built-in router answers (time in a place, arithmetic, unit
conversion, dates), the answers' text in the tools' style with values drawn at random, and chatter that asks
nothing. Training and held-out sets differ in sentences, places, numbers and voices, so a test on the held-out
set asks questions the model never heard.

Pure: a `random.Random` in, text out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from frontend_model.training.speech import Voice

Split = Literal["train", "held_out"]

_TRAIN_CITIES = ["Tokyo", "Paris", "London", "Berlin", "Madrid", "Rome", "Sydney", "Chicago", "Toronto", "Dubai",
                 "Mumbai", "Seoul", "Cairo", "Lima", "Oslo", "Vienna", "Denver", "Boston", "Lisbon", "Dublin"]
_HELD_OUT_CITIES = ["Singapore", "Moscow", "Athens", "Nairobi", "Bangkok", "Mexico City", "Helsinki", "Prague"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_OPERATIONS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
_UNITS = [("miles", "kilometres", 1.609344), ("kilometres", "miles", 0.621371), ("pounds", "kilograms", 0.453592),
          ("kilograms", "pounds", 2.20462), ("feet", "metres", 0.3048), ("inches", "centimetres", 2.54),
          ("litres", "gallons", 0.264172), ("ounces", "grams", 28.3495)]

# Every template is one the built-in router maps to a tool (tests/e2e check the held-out ones against it).
_TEMPLATES: dict[Split, dict[str, list[str]]] = {
    "train": {
        "time": ["what time is it in {city}", "what is the time in {city}", "what's the time in {city} right now",
                 "tell me the time in {city}", "hey, what time is it in {city}"],
        "math": ["what is {a} {op} {b}", "how much is {a} {op} {b}", "calculate {a} {op} {b}",
                 "okay, what is {a} {op} {b}"],
        "units": ["how many {to} in {value} {frm}", "convert {value} {frm} to {to}", "what is {value} {frm} in {to}"],
        "date": ["what day is it today", "what is the date today", "what day is it tomorrow"],
    },
    "held_out": {
        "time": ["could you tell me the time in {city}", "so what time is it now in {city}",
                 "what is the current time in {city}"],
        "math": ["please compute {a} {op} {b}", "can you tell me what is {a} {op} {b}", "work out {a} {op} {b}"],
        "units": ["how many {to} are there in {value} {frm}", "how much is {value} {frm} in {to}"],
        "date": ["what is today's date", "which day is it tomorrow"],
    },
}
_CHATTER: dict[Split, list[str]] = {
    "train": ["I had a long day at work today.", "That sounds good to me.", "Thanks, that was really helpful.",
              "I am going to make some tea now.", "My sister is visiting next week.", "I like this song a lot.",
              "It was nice talking to you.", "Okay, I see what you mean.", "The kids are playing outside.",
              "I think I will go for a walk later."],
    "held_out": ["We watched a movie last night.", "I just finished cleaning the kitchen.",
                 "That is a funny story.", "I will call you back in a minute.", "The garden looks lovely."],
}
# espeak-ng voices and variants; the held-out voice is one training never used.
TRAIN_VOICES = ("en-us", "en-us+f3", "en-gb", "en-gb+f2", "en-gb-scotland", "en-029+m3", "en-gb-x-gbclan+f4")
HELD_OUT_VOICES = ("en-gb-x-rp+f5",)
AGENT_VOICE = Voice("en-us+m2", 160, 45)


@dataclass(frozen=True)
class Exchange:
    """A spoken question, the answer text a tool would return for it, and its kind."""

    kind: str
    question: str
    answer: str


def draw_voice(rng: random.Random, split: Split) -> Voice:
    names = TRAIN_VOICES if split == "train" else HELD_OUT_VOICES
    return Voice(rng.choice(names), rng.randint(135, 185), rng.randint(35, 70))


def draw_exchange(rng: random.Random, split: Split) -> Exchange:
    kind = rng.choice(sorted(_TEMPLATES[split]))
    template = rng.choice(_TEMPLATES[split][kind])
    cities = _TRAIN_CITIES if split == "train" else _HELD_OUT_CITIES
    if kind == "time":
        city = rng.choice(cities)
        hour, minute = rng.randint(1, 12), rng.randint(0, 59)
        answer = (f"It is {hour}:{minute:02d} {rng.choice(['AM', 'PM'])} on {rng.choice(_WEEKDAYS)}, "
                  f"{rng.choice(_MONTHS)} {rng.randint(1, 28)} in {city}.")
        return Exchange(kind, template.format(city=city), answer)
    if kind == "math":
        op = rng.choice(sorted(_OPERATIONS))
        a, b = _operands(rng, split)
        return Exchange(kind, template.format(a=a, op=op, b=b), f"{a} {op} {b} is {_OPERATIONS[op](a, b)}.")
    if kind == "units":
        frm, to, factor = rng.choice(_UNITS)
        value = rng.randint(2, 40)
        return Exchange(kind, template.format(value=value, frm=frm, to=to),
                        f"{value} {frm} is {round(value * factor, 2):g} {to}.")
    answer = f"{'Today' if 'today' in template else 'Tomorrow'} is {rng.choice(_WEEKDAYS)}, " \
             f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}, {rng.randint(2020, 2030)}."
    return Exchange(kind, template, answer)


def _operands(rng: random.Random, split: Split) -> tuple[int, int]:
    """Held-out questions use two-digit numbers above fifty, which training never draws."""
    if split == "train":
        return rng.randint(1, 49), rng.randint(1, 49)
    return rng.randint(51, 99), rng.randint(51, 99)


def draw_chatter(rng: random.Random, split: Split) -> str:
    return rng.choice(_CHATTER[split])
