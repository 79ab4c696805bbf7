"""What the synthetic conversations say: questions the built-in router answers (time in a place, arithmetic, unit
conversion, dates), short follow-ups it resolves from the question answered before ("what about in Paris?", "and
that times two?"), the spans those questions get, and chatter that asks nothing. Training and held-out questions
differ in sentences, places, numbers and voices, so a test on the held-out set asks questions the model never heard.

A span's text is what the built-in router writes when it serves (`tool_answer`: the real tools, at a random instant),
for a question drawn over the tools' whole range of numbers and every place they name (`curated_places`), held-out
ones included: a deployed model copies whatever a tool returns, so the words it copies are not held out, the questions
it hears are. (With the 28 cities the questions name, a model said "Mexico City" for Warsaw.)

Pure: a `random.Random` in, text out.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from backend_agent.tools.places import curated_places
from frontend_model.training.speech import Voice

Split = Literal["train", "held_out"]

_TRAIN_CITIES = ["Tokyo", "Paris", "London", "Berlin", "Madrid", "Rome", "Sydney", "Chicago", "Toronto", "Dubai",
                 "Mumbai", "Seoul", "Cairo", "Lima", "Oslo", "Vienna", "Denver", "Boston", "Lisbon", "Dublin"]
_HELD_OUT_CITIES = ["Singapore", "Moscow", "Athens", "Nairobi", "Bangkok", "Mexico City", "Helsinki", "Prague"]
_OPERATIONS = ("minus", "plus", "times")
_UNITS = [("miles", "kilometres"), ("kilometres", "miles"), ("pounds", "kilograms"), ("kilograms", "pounds"),
          ("feet", "metres"), ("inches", "centimetres"), ("litres", "gallons"), ("ounces", "grams")]

# Every template is one the built-in router maps to a tool (tests check both splits against it). Training speaks many
# phrasings, fillers included (with a handful, `<ret>` follows the phrasings, not the question); no training sentence
# is a held-out one with a word changed, added or dropped (tested).
_TEMPLATES: dict[Split, dict[str, list[str]]] = {
    "train": {
        "time": ["what time is it in {city}", "what's the time in {city} right now", "tell me the time in {city}",
                 "hey, what time is it in {city}", "do you know what time it is in {city}",
                 "the local time in {city}, please", "time in {city}, please", "well, what's the time in {city} today",
                 "hi, can you check the time in {city}", "what time is it in {city} now",
                 "okay, what time is it in {city} at the moment"],
        "math": ["what is {a} {op} {b}", "how much is {a} {op} {b}", "calculate {a} {op} {b}",
                 "okay, what is {a} {op} {b}", "what's {a} {op} {b}", "hey, how much is {a} {op} {b}",
                 "{a} {op} {b}, please", "so, what does {a} {op} {b} make", "um, calculate {a} {op} {b} for me",
                 "what do you get for {a} {op} {b}"],
        "units": ["how many {to} in {value} {frm}", "convert {value} {frm} to {to}", "what is {value} {frm} in {to}",
                  "how many {to} is {value} {frm}", "okay, convert {value} {frm} into {to}",
                  "what's {value} {frm} in {to}, please", "hey, {value} {frm} in {to}",
                  "can you convert {value} {frm} to {to}"],
        "date": ["what day is it today", "what is the date today", "what will the date be tomorrow",
                 "hey, what's the date", "what day of the week is it", "tell me the date, please",
                 "what was the date yesterday", "okay, what day will it be tomorrow", "and what day is it today"],
    },
    "held_out": {
        "time": ["could you tell me the time in {city}", "so what time is it now in {city}",
                 "what is the current time in {city}"],
        "math": ["please compute {a} {op} {b}", "can you tell me what is {a} {op} {b}", "work out {a} {op} {b}"],
        "units": ["how many {to} are there in {value} {frm}", "how much is {value} {frm} in {to}"],
        "date": ["what is today's date", "which day is it tomorrow"],
    },
}
# Follow-ups of a question of the same kind, which the router resolves from the answered history
# (`backend_agent.request.Request.follow_up`, `previous_value`): a place, a number or a day spliced into the last
# question, or a computation on the last answer. Same discipline as the questions (tested).
_FOLLOW_UPS: dict[Split, dict[str, list[str]]] = {
    "train": {
        "time": ["what about in {city}", "and in {city}", "how about {city}", "and {city}", "how about in {city}",
                 "what about {city}"],
        "math": ["what is that plus {b}", "what is that times two", "what's that minus {b}", "what is that times {b}",
                 "how much is that plus {b}"],
        "units": ["and {value}", "what about {value}", "how about {value}"],
    },
    "held_out": {
        "time": ["same for {city}"],
        "math": ["so what is that minus {b}"],
    },
}
_CHATTER: dict[Split, list[str]] = {
    "train": ["I had a long day at work today.", "That sounds good to me.", "Thanks, that was really helpful.",
              "I am going to make some tea now.", "My sister is visiting next week.", "I like this song a lot.",
              "It was nice talking to you.", "Okay, I see what you mean.", "The kids are playing outside.",
              "I think I will go for a walk later.", "We are having pasta for dinner tonight.",
              "The weather was nice this morning.", "I need to finish this report by Friday.",
              "My phone battery is almost empty.", "I really enjoyed that book.", "Let me think about it for a moment.",
              "The train was late again this morning.", "I have to pick up the kids at five.",
              "Our neighbours got a new dog.", "I am not sure about that yet.", "I will send you the photos later.",
              "The coffee here is really good.", "We should meet up next weekend.", "I forgot my umbrella at home.",
              "Hmm, okay.", "Right, right.", "Yeah, I know.", "Oh, that is nice.", "Good morning to you too.",
              "Sorry, I was talking to my son.", "Hold on, someone is at the door.", "Okay, thank you so much.",
              "No, that's fine, never mind.", "I was just thinking out loud.", "Interesting, I did not know that.",
              "My brother lives in Canada now.", "We went to the beach last summer.", "Alright, sounds great.",
              "That reminds me of my old job.", "I am so tired today.", "The traffic was terrible.",
              "Cool, cool.", "Uh huh, go on.", "I love the smell of rain."],
    "held_out": ["We watched a movie last night.", "I just finished cleaning the kitchen.",
                 "That is a funny story.", "I will call you back in a minute.", "The garden looks lovely."],
}
# What apps push is a notification: a sentence of a few shapes with its own facts. An app's span in training is one
# of these templates with every slot drawn afresh from the words below, so the shape keeps the model in place (as the
# router's sentence shapes do for a tool's answer: a 2-layer model copying words in no order at all loses its place)
# and the facts come only from the span. The held-out templates are the app-push e2e test's sentences: training
# never sees them, only other arrangements of their phrases.
_APP_TEMPLATES: dict[Split, list[str]] = {
    "train": ["Your {thing} {verb} at {time}.", "The {thing} from the {place} is {state}.",
              "Your {thing} is {state} for {day} at {time}.", "The {place} is {openness} on {day}.",
              "Your {thing} {verb} {day} {part} from {spot}.", "Your {thing} at the {place} is {state}.",
              "The {thing} to the {place} is {lateness} by {number} minutes.", "Your {thing} of {amount} is {state}.",
              "Your {thing} will be {state} by {time} {day}.", "The {place} {verb} at {time} every {day}.",
              "{Day} {part} will be {weather} with {number} degrees.",
              "Your {thing} at the {place} {verb} at {time} on {day}.", "Your balance is {amount} on {day}.",
              "The {thing} for {number} at the {place} is {state}.",
              "Next {thing} {verb} in {number} minutes from {spot}.", "Your {thing} {verb} from {spot} at {time}.",
              "The {place} {verb} at {time} but {verb} at {time} on {day}.",
              "Your {thing} is {state} and {verb} at {time}.", "Your {thing} was {state} to {day} {part}.",
              "The {thing} {verb} late at {time} and {verb} at {time}.", "Your {thing} for {day} was {state}.",
              "Your {thing} to the {place} is {state} for {day}.", "The {place} will be {openness} until {time}.",
              "Your {thing} {verb} at {time} {day} {part}.", "Your payment of {amount} was {state} on {day}.",
              "The {thing} {verb} {lateness} and {verb} at {time} from {spot}."],
    "held_out": ["Your {thing} to the {place} {verb} at {time} from {spot}.",
                 "The {place} {verb} {day} {part} at {time} and {verb} at {time}.",
                 "Your {thing} was {state} and {verb} on {day} {part}."],
}
_HOURS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
_APP_SLOTS: dict[str, list[str]] = {
    "thing": ["train", "bus", "flight", "parcel", "order", "ticket", "booking", "table", "delivery", "meeting"],
    "place": ["museum", "library", "office", "shop", "store", "doctor", "dentist", "school", "park", "station",
              "airport", "hotel", "restaurant", "cafe"],
    "verb": ["leaves", "arrives", "opens", "closes", "starts", "ends"],
    "state": ["confirmed", "cancelled", "delayed", "moved", "booked", "ready"],
    "openness": ["open", "closed"],
    "lateness": ["early", "late"],
    "day": ["today", "tomorrow", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "part": ["morning", "afternoon", "evening", "night"],
    "weather": ["rain", "snow", "sun", "cloudy", "warm", "cold", "windy"],
    "number": [*_HOURS, "fifteen", "twenty", "thirty", "forty", "fifty"],
    "time": [*_HOURS, *(f"{h} {m}" for h in _HOURS for m in ("fifteen", "thirty", "forty", "fifty")),
             *(f"{q} past {h}" for h in _HOURS for q in ("half", "quarter"))],
    "spot": [f"{s} {n}" for s in ("gate", "room", "floor", "seat") for n in _HOURS],
    "amount": [f"{n} {c}" for n in (*_HOURS, "twenty", "fifty", "hundred") for c in ("dollars", "euros", "pounds")],
}
# espeak-ng voices and variants (with a handful, `<ret>` keeps to the voices it heard); the held-out voice is an accent
# and a variant training never used.
TRAIN_VOICES = ("en-us", "en-us+f3", "en-gb", "en-gb+f2", "en-gb-scotland", "en-029+m3", "en-gb-x-gbclan+f4",
                "en-us+m1", "en-us+f1", "en-us+m4", "en-gb+m3", "en-gb+f4", "en-gb-scotland+f3", "en-029+f2",
                "en-us-nyc", "en-us-nyc+f1", "en-gb-x-gbcwmd+m2", "en-gb-x-gbclan+m5", "en-us+m6", "en-gb+f1")
HELD_OUT_VOICES = ("en-gb-x-rp+f5",)
AGENT_VOICE = Voice("en-us+m2", 160, 45)


@dataclass(frozen=True)
class Exchange:
    """A spoken question and its kind."""

    kind: str
    question: str


def draw_voice(rng: random.Random, split: Split) -> Voice:
    names = TRAIN_VOICES if split == "train" else HELD_OUT_VOICES
    return Voice(rng.choice(names), rng.randint(135, 185), rng.randint(35, 70))


def draw_exchange(rng: random.Random, split: Split, places: Sequence[str] | None = None) -> Exchange:
    """A question of `split`, about one of `places` when it asks the time somewhere (default: the split's cities)."""
    kind = rng.choice(sorted(_TEMPLATES[split]))
    template = rng.choice(_TEMPLATES[split][kind])
    if kind == "time":
        cities = places or (_TRAIN_CITIES if split == "train" else _HELD_OUT_CITIES)
        return Exchange(kind, asked(template.format(city=rng.choice(cities))))
    if kind == "math":
        a, b = _operands(rng, split)
        return Exchange(kind, asked(template.format(a=a, op=rng.choice(_OPERATIONS), b=b)))
    if kind == "units":
        frm, to = rng.choice(_UNITS)
        return Exchange(kind, asked(template.format(value=rng.randint(2, 40), frm=frm, to=to)))
    return Exchange(kind, asked(template))


def asked(text: str) -> str:
    """A question as people say it: with a question's intonation (espeak-ng and flite read it from the `?`), as
    statements end with a statement's."""
    return f"{text}?"


def follow_up_kinds(split: Split) -> tuple[str, ...]:
    """The kinds of question a follow-up can follow (the router splices no day into a question of dates)."""
    return tuple(sorted(_FOLLOW_UPS[split]))


def draw_follow_up(rng: random.Random, split: Split, kind: str) -> str:
    """A follow-up of a question of `kind` (one of `follow_up_kinds`): it asks again with one thing changed."""
    template = rng.choice(_FOLLOW_UPS[split][kind])
    cities = _TRAIN_CITIES if split == "train" else _HELD_OUT_CITIES
    return asked(template.format(city=rng.choice(cities), b=_operands(rng, split)[1], value=rng.randint(2, 40)))


def tool_answer(rng: random.Random, places: Sequence[str] | None = None) -> str:
    """The span text the built-in router serves for a question drawn from either split, at a random instant, about
    one of `places` (default: every place the tools name) when it asks the time."""
    instant = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(10 * 365 * 24 * 3600))
    question = draw_exchange(rng, rng.choice(("train", "held_out")), places or curated_places()).question
    answer = Router(build_catalogue(clock=lambda: instant)).answer(question)
    if answer is None:
        raise ValueError(f"the built-in router does not answer the recipe question {question!r}")
    return answer.text


def app_text(rng: random.Random, split: Split) -> str:
    """A span an app pushes (`span.inject`): a notification template of `split` with its slots drawn afresh."""
    def fill(slot: re.Match[str]) -> str:
        word = rng.choice(_APP_SLOTS[slot[1].lower()])
        return word.capitalize() if slot[1][0].isupper() else word

    return re.sub(r"\{(\w+)\}", fill, rng.choice(_APP_TEMPLATES[split]))


def _operands(rng: random.Random, split: Split) -> tuple[int, int]:
    """Held-out questions use two-digit numbers above fifty, which training never draws."""
    if split == "train":
        return rng.randint(1, 49), rng.randint(1, 49)
    return rng.randint(51, 99), rng.randint(51, 99)


def draw_chatter(rng: random.Random, split: Split) -> str:
    return rng.choice(_CHATTER[split])
