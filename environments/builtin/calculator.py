"""``calculator``: a multi-turn task with a tool. Work out ``a*b+c`` with a calculator the policy may call.

The prompt asks for the value of ``a*b+c`` (a, b of two or three digits, c of one or two). A policy turn that
is ``calc EXPRESSION`` on its first line gets the tool's answer, ``= VALUE``, as a ``tool`` message (or ``error:
...`` for an expression the calculator does not take); any other turn is the final answer and ends the
episode. The reward is 1.0 when the final answer's first line is the exact value, else 0.0.

The calculator is a pure function of the expression: digits, ``+``, ``-``, ``*`` and parentheses, at most
:data:`MAX_EXPRESSION_CHARS` characters, no number above :data:`MAX_VALUE` in magnitude, so a replay gives the
same bytes and no expression costs more than a few microseconds.
"""

from __future__ import annotations

import random
import re

from environments.answers import first_line
from environments.base import ChatMessage, Example, Scores, SeededEnvironment
from environments.episode import MultiTurnEnvironment

CALL = re.compile(r"^calc\s+(.+)$")
MAX_EXPRESSION_CHARS = 64
MAX_VALUE = 10**15
TOKEN = re.compile(r"\s*(\d+|[-+*()])")


class CalculatorError(ValueError):
    """An expression the calculator does not take; the message is what the policy reads."""


def calculate(expression: str) -> int:
    """The value of ``expression`` (integers, + - * and parentheses, usual precedence)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens: list[str] = []
    position = 0
    while position < len(expression):
        match = TOKEN.match(expression, position)
        if match is None:
            if expression[position:].strip() == "":
                break
            raise CalculatorError(f"cannot read {expression[position:].strip()[:10]!r}")
        tokens.append(match.group(1))
        position = match.end()
    value, rest = _sum(tokens)
    if rest:
        raise CalculatorError(f"unexpected {rest[0]!r}")
    return value


def _bounded(value: int) -> int:
    if abs(value) > MAX_VALUE:
        raise CalculatorError("number too large")
    return value


def _sum(tokens: list[str]) -> tuple[int, list[str]]:
    value, tokens = _product(tokens)
    while tokens and tokens[0] in "+-":
        operator, (right, tokens) = tokens[0], _product(tokens[1:])
        value = _bounded(value + right if operator == "+" else value - right)
    return value, tokens


def _product(tokens: list[str]) -> tuple[int, list[str]]:
    value, tokens = _atom(tokens)
    while tokens and tokens[0] == "*":
        right, tokens = _atom(tokens[1:])
        value = _bounded(value * right)
    return value, tokens


def _atom(tokens: list[str]) -> tuple[int, list[str]]:
    if not tokens:
        raise CalculatorError("expression ends too early")
    head, rest = tokens[0], tokens[1:]
    if head == "-":
        value, rest = _atom(rest)
        return -value, rest
    if head == "(":
        value, rest = _sum(rest)
        if not rest or rest[0] != ")":
            raise CalculatorError("missing ')'")
        return value, rest[1:]
    if head.isdigit():
        return _bounded(int(head)), rest
    raise CalculatorError(f"unexpected {head!r}")


class Calculator(SeededEnvironment, MultiTurnEnvironment):
    name = "calculator"
    default_max_tokens = 24

    def draw(self, index: int, rng: random.Random) -> Example:
        a, b, c = rng.randint(12, 999), rng.randint(12, 999), rng.randint(1, 99)
        question = f"{a}*{b}+{c}"
        return Example(
            index=index,
            prompt=(ChatMessage("user", f"What is {question}? Write calc EXPRESSION to use the calculator."),),
            answer=str(a * b + c),
            data=question,
        )

    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        call = CALL.match(first_line(transcript[-1].content))
        if call is None:
            return None
        try:
            answer = f"= {calculate(call.group(1))}"
        except CalculatorError as exc:
            answer = f"error: {exc}"
        return (ChatMessage("tool", answer),)

    def reference_turns(self, example: Example) -> tuple[str, ...]:
        """Ask the calculator, then answer with what it said."""
        return (f"calc {example.data}", str(example.answer))

    def probe_turns(self, example: Example) -> tuple[str, ...]:
        return (f"calc {example.data}", "calc 1+", "calc " + "9" * 17)

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("exact_match", 1.0 if first_line(completion) == example.answer else 0.0)
