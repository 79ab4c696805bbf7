"""Arithmetic without eval: the expression is parsed with `ast` and only numeric literals, the four
operations, floor division, modulo, bounded powers and sqrt/abs/round are walked. Rational arithmetic
(Fraction) keeps answers exact ("0.1 + 0.2" is 0.3); sizes are bounded so no input can hang the agent."""

from __future__ import annotations

import ast
import math
import operator
import re
import warnings
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from backend_agent.tools.base import Tool, ToolError, ToolResult, required_str
from backend_agent.tools.numbers import format_number, replace_number_words

MAX_INPUT_CHARS = 200
MAX_EXPONENT = 1000
MAX_BITS = 4096

Number = Fraction | float


class CalculationError(ToolError):
    """The input is not an expression this tool accepts, or its value is out of bounds."""


_QUESTION = r"^(?:what(?:'s| is| are)|how much is|calculate|compute|evaluate|work out)\s+"
_SPOKEN = [  # (pattern, replacement), applied in order to lower-cased text with digits for number words
    (_QUESTION, ""),
    (r"[?!]+$|\s+(?:equals?|=)\s*$", ""),
    (r"\b(?:the\s+)?square\s+root\s+of\s+(-?[\d.]+)", r"sqrt(\1)"),
    (r"(-?[\d.]+)\s*(?:percent|per\s+cent|%)\s+of\b", r"(\1/100)*"),
    (r"(-?[\d.]+)\s*(?:percent|per\s+cent)\b", r"(\1/100)"),
    (r"\b(?:raised\s+)?to\s+the\s+power\s+of\b|\braised\s+to\b", "**"),
    (r"\bsquared\b", "**2"),
    (r"\bcubed\b", "**3"),
    (r"\bmultiplied\s+by\b|\btimes\b|×|(?<=\d)\s*x\s*(?=[\d(])", "*"),
    (r"\bdivided\s+by\b|\bover\b|÷", "/"),
    (r"\bplus\b", "+"),
    (r"\bminus\b|\bnegative\b", "-"),
    (r"\bmod(?:ulo)?\b", "%"),
    (r"\^", "**"),
    (r"^the\s+", ""),
]


def spoken_to_expression(text: str) -> str:
    """Turn a spoken calculation ("fifteen percent of eighty") into an expression ("(15/100)* 80")."""
    expression = replace_number_words(text.strip().lower())
    for pattern, replacement in _SPOKEN:
        expression = re.sub(pattern, replacement, expression).strip()
    return expression


def _check_size(value: Number) -> Number:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculationError("the result is too large")
    elif max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise CalculationError("the result is too large")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        power = exponent.numerator
        if abs(power) > MAX_EXPONENT:
            raise CalculationError(f"exponents are limited to {MAX_EXPONENT}")
        if isinstance(base, Fraction):
            bits = max(base.numerator.bit_length(), base.denominator.bit_length())
            if bits * abs(power) > MAX_BITS:
                raise CalculationError("the result is too large")
            if base == 0 and power < 0:
                raise CalculationError("division by zero")
            return base**power
    if abs(float(exponent)) > MAX_EXPONENT:
        raise CalculationError(f"exponents are limited to {MAX_EXPONENT}")
    if base < 0:
        raise CalculationError("a negative number has no real fractional power")
    return float(base) ** float(exponent)


def _sqrt(value: Number) -> Number:
    if value < 0:
        raise CalculationError("a negative number has no real square root")
    if isinstance(value, Fraction):
        top, bottom = math.isqrt(value.numerator), math.isqrt(value.denominator)
        if top * top == value.numerator and bottom * bottom == value.denominator:
            return Fraction(top, bottom)
    return math.sqrt(value)


def _round(value: Number, digits: Number = Fraction(0)) -> Number:
    if not (isinstance(digits, Fraction) and digits.denominator == 1 and abs(digits) <= 15):
        raise CalculationError("round() takes a whole number of digits up to 15")
    rounded = round(value, int(digits))
    return Fraction(rounded) if isinstance(rounded, int) else rounded


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b) if isinstance(a // b, int) else a // b,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {  # name -> (function, min args, max args)
    "sqrt": (_sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
}


def _walk(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculationError(f"only numbers are allowed, not {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculationError("the number is too large")
        return _check_size(Fraction(value) if isinstance(value, int) else Fraction(repr(value)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _walk(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        return _check_size(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        function, low, high = _FUNCTIONS[node.func.id]
        if node.keywords or not low <= len(node.args) <= high:
            raise CalculationError(f"{node.func.id}() takes {low} to {high} plain numbers")
        return _check_size(function(*(_walk(arg) for arg in node.args)))
    if isinstance(node, ast.Name):
        raise CalculationError(f"'{node.id}' is not a number")
    if isinstance(node, ast.Call):
        raise CalculationError("only sqrt(), abs() and round() may be called")
    raise CalculationError(f"'{type(node).__name__}' is not allowed in a calculation")


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression (digits or spoken words); raise CalculationError otherwise."""
    if len(expression) > MAX_INPUT_CHARS:
        raise CalculationError(f"the expression is longer than {MAX_INPUT_CHARS} characters")
    source = spoken_to_expression(expression)
    if not source:
        raise CalculationError("there is nothing to calculate")
    try:
        with warnings.catch_warnings():  # "1else" warns before failing; user input should not log noise
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise CalculationError(f"not an arithmetic expression: {expression!r}") from error
    try:
        return _walk(tree.body)
    except ZeroDivisionError as error:
        raise CalculationError("division by zero") from error
    except (OverflowError, RecursionError) as error:
        raise CalculationError("the result is too large") from error


def _spoken_form(expression: str) -> str:
    """The question as a phrase for the span, with symbols said as words."""
    phrase = re.sub(_QUESTION, "", expression.strip(), flags=re.IGNORECASE)
    phrase = re.sub(r"\s*[?=]+\s*$", "", phrase)
    phrase = re.sub(r"\s*%\s*of\b", " percent of", phrase)
    for symbol, words in (
        ("**", " to the power of "),
        ("^", " to the power of "),
        ("//", " floor divided by "),
        ("*", " times "),
        ("/", " divided by "),
        ("+", " plus "),
        ("%", " modulo "),
    ):
        phrase = phrase.replace(symbol, words)
    phrase = re.sub(r"(?<=[\d)])\s*-\s*(?=[\d(])", " minus ", phrase)
    return re.sub(r"\s+", " ", phrase).strip()


def _run(args: dict[str, Any]) -> ToolResult:
    expression = required_str(args, "expression")
    value = evaluate(expression)
    return ToolResult(text=f"{_spoken_form(expression)} is {format_number(value)}.", source="arithmetic")


TOOL = Tool(
    name="arithmetic",
    description="Evaluate an arithmetic expression exactly: + - * / // % **, parentheses, sqrt, abs, round; "
    "spoken forms such as 'twelve times seven' or '15 percent of 80' are accepted.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "for example '(3 + 4) * 2'"}},
        "required": ["expression"],
    },
    run=_run,
)
