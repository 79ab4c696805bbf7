"""The chatter the model trains on asks nothing the router answers, names what questions ask about, and keeps its
held-out statements apart from the training ones."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime

import pytest

from backend_agent.router import Router
from backend_agent.tools import build_catalogue
from frontend_model.training.recipes import _CHATTER, _HELD_OUT_CITIES, _TRAIN_CITIES
from frontend_model.training.statements import draw_statement


def drawn(split: str, count: int = 3000) -> set[str]:
    rng = random.Random(7)
    return {draw_statement(rng, split) for _ in range(count)}  # type: ignore[arg-type]


@pytest.mark.parametrize("split", ["train", "held_out"])
def test_no_statement_is_a_question_the_router_answers(split: str) -> None:
    router = Router(build_catalogue(clock=lambda: datetime(2026, 12, 2, 9, 30, tzinfo=UTC)))
    statements = drawn(split)
    assert not [s for s in statements if s.endswith("?") or router.answer(s) is not None]


def test_training_draws_far_more_statements_than_the_fixed_sentences_and_names_places_numbers_and_hours() -> None:
    statements = drawn("train")
    assert len(statements) > 10 * len(_CHATTER["train"])
    assert set(_CHATTER["train"]) <= statements
    assert any(city in s for s in statements for city in _TRAIN_CITIES)
    assert any(re.search(r"\b\d+ (kilometres|kilograms|grams|pounds|feet|litres)\b", s) for s in statements)
    assert any("o'clock" in s for s in statements)


def test_held_out_statements_are_never_training_ones_nor_name_a_training_place_or_number() -> None:
    held = drawn("held_out")
    assert len(held) > 50 and not held & drawn("train", 20000)
    assert not [s for s in held for city in _TRAIN_CITIES if city in s]
    assert any(city in s for s in held for city in _HELD_OUT_CITIES)
    assert all(int(n) > 50 for s in held for n in re.findall(r"\b\d+\b(?! o'clock)", s))
