"""A run's budget: caps on the tokens and USD its model calls may bill, kept on every worker together.

Before a request is sent, the most it can bill is reserved in one atomic step: its input (at most one token per
two characters of its messages) plus its `max_tokens` (else RESERVED_OUTPUT), and that many tokens' price. A
reservation that would take spent + reserved past a cap is refused: BudgetExhausted, which stops the batch like
every error the same for every item, so no further call starts while calls in flight finish. After the call the
reservation is replaced by what the provider billed. So what a run spends never passes its cap by more than the
reservations of the calls in flight (and an answer longer than RESERVED_OUTPUT, when `max_tokens` is unset).

The accountant is the run context's `budget`: `LocalBudget` (in this process, starting from what the run's
`__llm_calls__` already billed, so a resumed run counts its past calls) or the cluster's, in Redis
(worker/cluster/state/budget.py), with the caps `chordflow update` may raise.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from ir.errors import BudgetExhausted
from worker.llm.providers import Request

#: Output tokens reserved for a request that sets no `max_tokens`.
RESERVED_OUTPUT = 4096


@dataclass(frozen=True)
class Spend:
    """Tokens and USD: a reservation, or what a call billed."""

    tokens: int
    usd: float = 0.0


class Budget(Protocol):
    def reserve(self, most: Spend) -> None:
        """Hold `most` against the caps, or raise BudgetExhausted."""

    def settle(self, reserved: Spend, billed: Spend) -> None:
        """Replace a reservation by what the call billed (nothing, for a call that failed)."""


def most_of(request: Request) -> int:
    """The most tokens `request` can bill."""
    characters = sum(len(m["content"]) for m in request.messages) + len(request.system or "")
    return (characters + 1) // 2 + (request.max_tokens or RESERVED_OUTPUT)


def refusal(kind: str, spent: float, cap: float, asked: float) -> str:
    """The run's error when a reservation is refused."""
    if kind == "usd":
        return f"budget exhausted: ${spent:.4f} of ${cap:.4f} spent; the next call could cost up to ${asked:.4f}"
    return f"budget exhausted: {spent:,.0f} of {cap:,.0f} tokens; the next call could use up to {asked:,.0f}"


class LocalBudget:
    """A local run's budget (thread-safe): `caps` from the workflow, `spent` what the run billed before."""

    def __init__(self, tokens: int | None, usd: float | None, spent: Spend):
        self.caps = {"tokens": tokens, "usd": usd}
        self.spent = {"tokens": float(spent.tokens), "usd": spent.usd}
        self.reserved = {"tokens": 0.0, "usd": 0.0}
        self.lock = threading.Lock()

    def reserve(self, most: Spend) -> None:
        asked = {"tokens": most.tokens, "usd": most.usd}
        with self.lock:
            for kind, cap in self.caps.items():
                if cap is not None and self.spent[kind] + self.reserved[kind] + asked[kind] > cap:
                    raise BudgetExhausted(refusal(kind, self.spent[kind], cap, asked[kind]))
            for kind in asked:
                self.reserved[kind] += asked[kind]

    def settle(self, reserved: Spend, billed: Spend) -> None:
        with self.lock:
            self.reserved["tokens"] -= reserved.tokens
            self.reserved["usd"] -= reserved.usd
            self.spent["tokens"] += billed.tokens
            self.spent["usd"] += billed.usd


def local_budget(workflow: Any, totals: dict[str, Any] | None) -> LocalBudget | None:
    """The budget of a local run of `workflow` (None without one), counting what `totals` (its calls so far) billed."""
    caps = getattr(workflow, "budget", None)
    if caps is None:
        return None
    totals = totals or {}
    spent = Spend(totals.get("input_tokens", 0) + totals.get("output_tokens", 0), totals.get("cost_usd", 0.0))
    return LocalBudget(caps.tokens, caps.usd, spent)
