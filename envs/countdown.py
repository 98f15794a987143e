"""Countdown as a single-turn text env: reach the target with the given numbers.

The action is an arithmetic expression over integer literals with + - * / and
parentheses, optionally followed by "= <target>". It is parsed with `ast` and
evaluated exactly with fractions; nothing is ever `eval`-ed.

Reward: 1.0 if the expression uses every given number exactly once and equals
the target; 0.1 if it is well-formed but wrong (wrong value, wrong numbers,
division by zero, a claimed "= N" other than the target); 0 and
`action_is_valid=False` if it is malformed (then the episode continues).
Any well-formed expression ends the episode.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from envs.base import TextEnv, build_config

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1
MAX_EQUATION_LENGTH = 200
MAX_INSTANCE_TRIES = 1000
NUMBER_RANGE_PER_TARGET = 10

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_OP_SYMBOLS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_TRAILING_RESULT = re.compile(r"^(?P<lhs>[^=]*)=\s*(?P<rhs>[0-9]+)$")
# Decimal digits only: keeps out 0x10, 1_0, 2.5, names, which Python would parse.
_ALLOWED_CHARS = re.compile(r"^[0-9\s+\-*/()]+$")

INSTRUCTIONS = (
    "You are playing Countdown: write an arithmetic expression that equals the target.\n"
    "Use every given number exactly once, combined with +, -, *, / and parentheses.\n"
    "Action: the expression itself, for example (3 + 5) * 2."
)


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
    """Instance generation.

    Attributes:
        num_numbers: how many numbers are given.
        max_number: numbers are drawn from 1..max_number.
        max_target: targets lie in 1..max_target.
    """

    num_numbers: int = 3
    max_number: int = 99
    max_target: int = 100

    def __post_init__(self) -> None:
        if not 2 <= self.num_numbers <= 6:
            raise ValueError(f"num_numbers must be between 2 and 6, got {self.num_numbers}")
        if self.max_number < 1:
            raise ValueError(f"max_number must be >= 1, got {self.max_number}")
        if self.max_target < 1:
            raise ValueError(f"max_target must be >= 1, got {self.max_target}")
        if self.max_number > NUMBER_RANGE_PER_TARGET * self.max_target:
            # Far larger numbers than targets leave few equations that land on a target: reset would not find one.
            raise ValueError(
                f"max_number must be at most {NUMBER_RANGE_PER_TARGET} x max_target ({self.max_target}) so that "
                f"instances can be drawn, got {self.max_number}"
            )


class Score(NamedTuple):
    """How an equation fares: its reward, and why."""

    reward: float
    well_formed: bool
    correct: bool
    reason: str


def score_equation(equation: str, numbers: Sequence[int], target: int) -> Score:
    """Scores one Countdown answer (see the module docstring for the rules)."""
    try:
        tree, claimed = _parse(equation)
    except ValueError as err:
        return Score(0.0, False, False, f"malformed: {err}")
    if claimed is not None and claimed != target:
        return Score(FORMAT_REWARD, True, False, f"claims {claimed}, but the target is {target}")
    used = Counter(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant))
    if used != Counter(numbers):
        return Score(FORMAT_REWARD, True, False, f"must use each of {list(numbers)} exactly once")
    try:
        value = _evaluate(tree)
    except ZeroDivisionError:
        return Score(FORMAT_REWARD, True, False, "division by zero")
    if value != target:
        return Score(FORMAT_REWARD, True, False, f"equals {value}, not {target}")
    return Score(CORRECT_REWARD, True, True, "correct")


def _parse(equation: str) -> tuple[ast.expr, int | None]:
    """(syntax tree, the claimed result after "=", if any).

    Raises ValueError unless the expression is integers, + - * / and parentheses.
    """
    text = equation.strip()
    if len(text) > MAX_EQUATION_LENGTH:
        raise ValueError(f"longer than {MAX_EQUATION_LENGTH} characters")
    claimed = None
    match = _TRAILING_RESULT.match(text)
    if match:
        text, claimed = match["lhs"].strip(), int(match["rhs"])
    if not _ALLOWED_CHARS.match(text):
        raise ValueError(f"only integers, + - * / and parentheses are allowed in {text!r}")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {text!r}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int:
            continue
        if not isinstance(node, ast.operator):
            raise ValueError(f"only integers, + - * / and parentheses are allowed in {text!r}")
    return tree, claimed


def _evaluate(node: ast.expr) -> Fraction:
    """Exact value of a tree accepted by `_parse`; ZeroDivisionError on x/0."""
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int), "`_parse` admits only int constants"
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp), "`_parse` admits only int constants and binary operations"
    return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))


class CountdownEnv(TextEnv):
    """One Countdown instance per seed, reachable by construction.

    `reference_equation` holds the expression the generator built (useful for
    demonstrations and tests; never shown to the model).
    """

    config_class = CountdownConfig

    def __init__(self, config: CountdownConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config: CountdownConfig = build_config(CountdownConfig, config, overrides)
        self.numbers: tuple[int, ...] = ()
        self.target: int | None = None
        self.reference_equation: str | None = None

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        if options:
            raise ValueError(f"Countdown takes no reset options, got {sorted(options)}")
        cfg = self.config
        self.numbers, self.target, self.reference_equation = generate_instance(
            rng, num_numbers=cfg.num_numbers, max_number=cfg.max_number, max_target=cfg.max_target
        )
        return {"success": False}

    def random_action(self, rng: np.random.Generator) -> str:
        """A well-formed equation using every number once, with random operators (rarely correct)."""
        numbers = [str(n) for n in rng.permutation(self.numbers)]
        operators = rng.choice(["+", "-", "*", "/"], size=len(numbers) - 1)
        parts = [numbers[0]]
        for symbol, number in zip(operators, numbers[1:]):
            parts += [str(symbol), number]
        return "".join(parts)

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        assert self.target is not None, "TextEnv.step steps only after reset"
        score = score_equation(action, self.numbers, self.target)
        info = {
            "action_is_valid": score.well_formed,
            "success": score.correct,
            "reason": score.reason,
        }
        return score.reward, score.well_formed, False, info

    def render_text(self) -> str:
        if self.target is None:
            raise RuntimeError("CountdownEnv has no instance yet: call reset() first")
        return f"Target: {self.target}, nums: [{', '.join(map(str, self.numbers))}]"


def generate_instance(
    rng: np.random.Generator, *, num_numbers: int, max_number: int, max_target: int
) -> tuple[tuple[int, ...], int, str]:
    """(numbers, target, an equation reaching it) drawn from `rng`.

    Combines the numbers pairwise with random operations, keeping every
    intermediate a positive integer, until the result lies in 1..max_target.
    """
    for _ in range(MAX_INSTANCE_TRIES):
        numbers = tuple(int(n) for n in rng.integers(1, max_number + 1, size=num_numbers))
        built = _random_combination(rng, numbers)
        if built is not None and 1 <= built[0] <= max_target:
            return numbers, built[0], built[1]
    raise RuntimeError(
        f"no Countdown instance with {num_numbers} numbers <= {max_number} and a target "
        f"<= {max_target} in {MAX_INSTANCE_TRIES} tries; raise max_target"
    )


def _random_combination(rng: np.random.Generator, numbers: tuple[int, ...]) -> tuple[int, str] | None:
    """Folds the numbers into one (value, expression), or None on a non-integer step."""
    pool = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        i, j = rng.choice(len(pool), size=2, replace=False)
        (a, a_text), (b, b_text) = pool[i], pool[j]
        symbol = str(rng.choice(list(_OP_SYMBOLS)))
        if (symbol == "-" and a <= b) or (symbol == "/" and a % b):
            return None
        value = int(_OP_SYMBOLS[symbol](a, b))
        pool = [item for k, item in enumerate(pool) if k not in (i, j)]
        pool.append((value, f"({a_text} {symbol} {b_text})"))
    value, text = pool[0]
    return value, text[1:-1] if text.startswith("(") else text
