"""A cluster run's budget in Redis (worker/llm/budget.py Budget): `cf:{<run>}:budget`, a hash of the workflow's caps,
what the run's calls billed and what calls in flight hold, on every worker together. One reservation before each
model call and one settlement after (reserve_budget.lua, settle_budget.lua): a model call costs a thousand round
trips. USD are kept in micro-dollars, so every counter is an integer Redis adds atomically."""

from __future__ import annotations

from typing import Any

from ir.errors import BudgetExhausted, RunPurged
from worker.cluster.state.once import once
from worker.cluster.state.runstate import RunState
from worker.llm.budget import Spend, refusal

MICRO = 1_000_000


def micro(usd: float) -> int:
    return round(usd * MICRO)


class RedisBudget:
    def __init__(self, state: RunState):
        self.state = state
        self.key = state.keys.budget
        self._reserve = once(state.redis, "reserve_budget")
        self._settle = once(state.redis, "settle_budget")

    def reserve(self, most: Spend) -> None:
        keys = [self.key, self.state.keys.overrides, self.state.keys.tombstone]
        found = self._reserve(keys=keys, args=[most.tokens, micro(most.usd), self.state.ttl])
        if found[0] == -1:
            raise RunPurged(f"run {self.state.run_id} was purged: no model call starts")
        if found[0] == 0:
            kind, spent, cap = (part.decode() if isinstance(part, bytes) else str(part) for part in found[1:])
            scale = MICRO if kind == "usd" else 1
            asked = most.usd if kind == "usd" else most.tokens
            raise BudgetExhausted(refusal(kind, float(spent) / scale, float(cap) / scale, asked))

    def settle(self, reserved: Spend, billed: Spend) -> None:
        args = [reserved.tokens, micro(reserved.usd), billed.tokens, micro(billed.usd)]
        self._settle(keys=[self.key, self.state.keys.tombstone], args=args)


def record_caps(state: RunState, caps: Any) -> RedisBudget | None:
    """The run's budget, its workflow's caps (`caps`: ir Budget, or None: no budget) written for every worker."""
    if caps is None:
        return None
    fields = {"tokens": caps.tokens, "usd": None if caps.usd is None else micro(caps.usd)}
    pipe = state.redis.pipeline(transaction=False)
    pipe.hset(state.keys.budget, mapping={k: v for k, v in fields.items() if v is not None})
    pipe.expire(state.keys.budget, state.ttl)
    pipe.execute()
    return RedisBudget(state)


def in_redis(state: RunState) -> RedisBudget | None:
    """The run's budget for a chunk of it: there when an advance recorded the workflow's caps."""
    return RedisBudget(state) if state.redis.exists(state.keys.budget) else None
