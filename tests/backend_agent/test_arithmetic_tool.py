"""The arithmetic tool evaluates exactly and never runs code."""

from fractions import Fraction
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend_agent.tools.arithmetic import MAX_INPUT_CHARS, TOOL, CalculationError, evaluate
from backend_agent.tools.base import ToolError
from backend_agent.tools.numbers import replace_number_words


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 * 7", Fraction(84)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("7 / 2", Fraction(7, 2)),
        ("1 / 3", Fraction(1, 3)),
        ("10 // 3", Fraction(3)),
        ("-7 // 2", Fraction(-4)),
        ("10 % 4", Fraction(2)),
        ("-(3 + 4) * 2", Fraction(-14)),
        ("2 ** 100", Fraction(2**100)),
        ("2 ** -2", Fraction(1, 4)),
        ("sqrt(144)", Fraction(12)),
        ("sqrt(9/4)", Fraction(3, 2)),
        ("abs(-5.5)", Fraction(11, 2)),
        ("round(2.5)", Fraction(2)),
        ("round(3.14159, 2)", Fraction(157, 50)),
        ("twelve times seven", Fraction(84)),
        ("What is 15 percent of 80?", Fraction(12)),
        ("one hundred and five divided by five", Fraction(21)),
        ("two to the power of ten", Fraction(1024)),
        ("seven squared", Fraction(49)),
        ("the square root of eighty one", Fraction(9)),
        ("negative five plus two", Fraction(-3)),
        ("17 mod 5", Fraction(2)),
        ("3 x 4", Fraction(12)),
        ("2^10", Fraction(1024)),
    ],
)
def test_valid_input_is_exact(expression: str, value: Fraction) -> None:
    result = evaluate(expression)
    assert isinstance(result, Fraction)
    assert result == value


def test_irrational_results_are_floats() -> None:
    assert evaluate("sqrt(2)") == pytest.approx(2**0.5)
    assert evaluate("2 ** 0.5") == pytest.approx(2**0.5)


@pytest.mark.parametrize(
    "code",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "().__class__",
        "().__class__.__bases__[0].__subclasses__()",
        "lambda: 1",
        "x",
        "x + 1",
        "math.pi",
        "(1).real",
        "open('/etc/passwd')",
        "eval('1')",
        "sqrt(x=4)",
        "[1, 2]",
        "'a' * 3",
        "1 if 1 else 2",
        "1 < 2",
        "True + 1",
        "1j",
        "9**9**9",
        "2 ** 5000",
        "(2 ** 1000) ** 5",
        "10.5 ** 999",
        "1e400",
        "1 / 0",
        "5 % 0",
        "(-1) ** 0.5",
        "sqrt(-1)",
        "round(1, 100)",
        "1 +" * 100 + "1",
        "",
        "tell me a joke",
    ],
)
def test_code_and_out_of_bounds_input_is_rejected(code: str) -> None:
    with pytest.raises(CalculationError):
        evaluate(code)


def test_code_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(CalculationError):
        evaluate(f"__import__('pathlib').Path('{marker}').touch()")
    assert not marker.exists()


def test_tool_answer_text() -> None:
    assert TOOL.run({"expression": "12 times 7"}).text == "12 times 7 is 84."
    assert TOOL.run({"expression": "(3+4)*2"}).text == "(3 plus 4) times 2 is 14."
    assert TOOL.run({"expression": "1/3"}).text == "1 divided by 3 is 0.3333333333."
    with pytest.raises(ToolError):
        TOOL.run({})


def test_number_words() -> None:
    assert replace_number_words("two thousand and twenty six") == "2026"
    assert replace_number_words("twenty-one point five") == "21.5"
    assert replace_number_words("one two") == "1 2"


_FRAGMENTS = st.sampled_from(
    ["1", "9", "0.5", "1e3", "+", "-", "*", "/", "//", "%", "**", "(", ")", ",", " ", "sqrt", "abs", "round",
     "x", "_", ".", "'", '"', "[", "]", "lambda", ":", "__import__", "__class__", "os", "=", "if", "else",
     "times", "plus", "percent of", "squared", "twelve", "hundred", "point", "not", "and", "\\", "\n", "\x00"]
)  # fmt: skip


def _check(text: str) -> None:
    with (
        mock.patch("builtins.eval", side_effect=AssertionError("eval called")),
        mock.patch("builtins.exec", side_effect=AssertionError("exec called")),
    ):
        try:
            result = evaluate(text)
        except CalculationError:
            return
    assert isinstance(result, Fraction | float)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=MAX_INPUT_CHARS + 20))
def test_random_text_only_raises_calculation_error(text: str) -> None:
    _check(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=40).map("".join))
def test_random_token_soup_only_raises_calculation_error(text: str) -> None:
    _check(text)
