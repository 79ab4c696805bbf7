"""Development conversations: the test set's shape (a question, its follow-up, another question, one voice, one
session) made of the recipes' held-out phrasings (`frontend_model/training/recipes.py`), so that a recipe can be
chosen on what the test set measures without looking at it.

Why: `bench asks` scores questions from fresh contexts, teacher-forced, and the development set asks one question a
session; a recipe chosen on them (`daee054f`) asked every conversation's first test-set question and only 2 of 8 of
the later ones (benchmarks/README.md, "Recipes tried after 2768086b"). These conversations measure the later ones.

Development data, and labelled so: the phrasings and the held-out voice are the recipes' (recipes were chosen while
looking at them), half the conversations are in training voices, and the rates are training's.
"""

from __future__ import annotations

import random

from benchmarks.harness.testset import Conversation, SetQuestion, SetVoice
from frontend_model.training.recipes import (
    HELD_OUT_VOICES,
    TRAIN_VOICES,
    draw_exchange,
    draw_follow_up,
    follow_up_kinds,
)

SEED = 4848


def development_conversations(count: int = 8, seed: int = SEED) -> tuple[Conversation, ...]:
    """`count` conversations of three questions: a held-out question of a kind with follow-ups, a held-out follow-up
    of it, then a held-out question of any kind; every other one in the held-out voice, the rest in training voices."""
    rng = random.Random(seed)
    kinds = follow_up_kinds("held_out")
    conversations = []
    for i in range(count):
        first = draw_exchange(rng, "held_out")
        while first.kind not in kinds:
            first = draw_exchange(rng, "held_out")
        then = draw_exchange(rng, "held_out")
        name = HELD_OUT_VOICES[i // 2 % len(HELD_OUT_VOICES)] if i % 2 == 0 else rng.choice(TRAIN_VOICES)
        questions = (SetQuestion(first.kind, first.question, {}, False),
                     SetQuestion(first.kind, draw_follow_up(rng, "held_out", first.kind), {}, True),
                     SetQuestion(then.kind, then.question, {}, False))
        conversations.append(Conversation(f"d{i + 1}", SetVoice("espeak-ng", name, rng.randint(135, 185)), questions))
    return tuple(conversations)
