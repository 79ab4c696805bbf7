"""Chatter the language model trains on: statements and small talk that ask nothing, drawn afresh from templates.

Why: with the 44 sentences of `recipes` "train" alone, the model learnt those by heart and asked after 86 % of new
statements, while its 1500 questions were drawn from templates. Many of these statements name what questions ask
about (a place, a number, a unit, an hour, a day): the words of a question are not what makes it one. `recipes`'
sentences stay a share of the draw, and the codec's distillation keeps drawing those alone (its key hashes
`recipes`). Held-out templates, people, verbs, places and numbers are apart from the training ones (tested).

Pure: a `random.Random` in, text out.
"""

from __future__ import annotations

import random
import re

from frontend_model.training.recipes import _HELD_OUT_CITIES, _TRAIN_CITIES, Split, draw_chatter

FIXED_SHARE = 0.3  # draws that are one of `recipes`' chatter sentences
_HOURS = [f"{hour} o'clock" for hour in range(1, 13)]

_TEMPLATES: dict[Split, list[str]] = {
    "train": ["{Person} lives in {city}.", "{Person} just moved to {city}.", "{Person} is flying to {city} on {day}.",
              "We spent {n} days in {city} last year.", "I grew up near {city}.", "The food in {city} was amazing.",
              "I have a call with the {city} office at {hour}.", "{Person} sent me a postcard from {city}.",
              "I walked {n} kilometres today.", "{Person} turns {n} next {day}.", "I bought {n} kilograms of apples.",
              "We need {n} more chairs for the party.", "The recipe needs {n} grams of butter.",
              "I paid {n} pounds for these shoes.", "I have {n} emails to answer.", "The bus was {n} minutes late.",
              "I slept {n} hours last night.", "The room is about {n} feet long.", "I drank {n} litres of water today.",
              "I get up at {hour} every day.", "The shop closes at {hour} today.", "I will be home by {hour} tonight.",
              "{Day} is my day off.", "I have a dentist appointment on {day}.", "It is already dark here.",
              "I was never good at maths.", "My son is learning his times tables.",
              "I added up the bills this morning.",
              "{Person} {did} {when}.", "I am {feeling} about {thing}.", "{Person} is {feeling} about {thing}.",
              "Oh, {person} {did} {when}.", "Well, I {did_i} {when}.", "I think {thing} went well.",
              "Okay, so {person} {did} {when}."],
    "held_out": ["{Person} works in {city} now.", "I read {n} pages of my book today.",
                 "The kettle takes {n} minutes to boil.", "We are meeting at {hour} on {day}.",
                 "{Person} {did} {when}.", "I feel {feeling} about {thing}."],
}
_SLOTS: dict[Split, dict[str, list[str]]] = {
    "train": {
        "person": ["my sister", "my brother", "my friend", "our neighbour", "my boss", "my cousin", "my mother",
                   "my dad", "my daughter", "a colleague of mine"],
        "did": ["called me", "cooked dinner", "fixed the car", "painted the fence", "visited us", "baked a cake",
                "sent me a letter", "cleaned the garage", "lost her keys", "missed the train"],
        "did_i": ["cooked dinner", "fixed the car", "painted the fence", "baked a cake", "cleaned the garage",
                  "missed the train", "watered the plants"],
        "when": ["yesterday", "this morning", "last night", "last week", "on {day}", "at {hour}"],
        "feeling": ["excited", "worried", "happy", "nervous", "curious"],
        "thing": ["the trip", "the new job", "the weekend", "the exam", "the party", "the wedding"],
        "day": ["Monday", "Tuesday", "Wednesday", "Friday", "Saturday"],
        "city": _TRAIN_CITIES,
        "n": [str(n) for n in range(2, 50)],  # as the questions' numbers split
        "hour": _HOURS,
    },
    "held_out": {
        "person": ["my uncle", "my grandmother", "my flatmate"],
        "did": ["planted some tomatoes", "repaired the roof", "bought a bicycle"],
        "did_i": ["planted some tomatoes"],
        "when": ["two days ago", "on {day}"],
        "feeling": ["relaxed", "proud"],
        "thing": ["the concert", "the holiday"],
        "day": ["Thursday", "Sunday"],
        "city": _HELD_OUT_CITIES,
        "n": [str(n) for n in range(51, 100)],
        "hour": _HOURS,
    },
}


def draw_statement(rng: random.Random, split: Split) -> str:
    """A statement of `split`: one of `recipes`' sentences (`FIXED_SHARE`), or a template with its slots drawn (a
    capitalised slot, capitalised)."""
    if rng.random() < FIXED_SHARE:
        return draw_chatter(rng, split)

    def fill(slot: re.Match[str]) -> str:
        word = rng.choice(_SLOTS[split][slot[1].lower()])
        return word[0].upper() + word[1:] if slot[1][0].isupper() else word

    text = rng.choice(_TEMPLATES[split])
    while "{" in text:  # a slot's words may hold another slot
        text = re.sub(r"\{(\w+)\}", fill, text)
    return text
