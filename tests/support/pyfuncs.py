"""Importable functions for the `python` node tests (the node resolves 'module:function')."""

from __future__ import annotations

from typing import Any

NOT_CALLABLE = 42
CALLS: dict[str, int] = {}


def add(a: int, b: int) -> int:
    return a + b


def describe(**kwargs: Any) -> dict[str, Any]:
    """Returns its keyword arguments, to show exactly what the node passed."""
    return dict(kwargs)


def divide(a: float, b: float) -> float:
    return a / b


def flaky(token: str, failures: int) -> int:
    """Raises until it has been called `failures` times for `token`, then returns the call count."""
    CALLS[token] = CALLS.get(token, 0) + 1
    if CALLS[token] <= failures:
        raise RuntimeError(f"flaky {token}: attempt {CALLS[token]} fails")
    return CALLS[token]


class Greeter:
    @staticmethod
    def greet(name: str, punctuation: str = "!") -> str:
        return f"hello {name}{punctuation}"


def lose_redis(**_: Any) -> None:
    """What a node sees when chordflow's own Redis stays out of reach past the outage budget."""
    from ir.errors import Outage

    raise Outage("Redis out of reach")
