"""A cluster run's model answers in Redis (worker/llm/answers.py Answers): `cf:{<run>}:answers`, a hash of request
key -> answer, for the run's TTL, written as each answer comes (one write per model call, the call itself costing
a thousand times more); answers a node keeps across runs (`cache`) in `cf:{answer:<key>}` until their time is up."""

from __future__ import annotations

import json
from typing import Any

from worker.cluster.state.keys import shared_answer_key
from worker.cluster.state.runstate import RunState, script


class RedisAnswers:
    def __init__(self, state: RunState):
        self.state = state
        self.key = state.keys.answers
        self._keep = script(state.redis, "keep_answer")

    def find(self, key: str, shared: bool) -> dict[str, Any] | None:
        found = self.state.redis.hget(self.key, key)
        if found is None and shared:
            found = self.state.redis.get(shared_answer_key(key))
        return None if found is None else json.loads(found)

    def known(self, keys: list[str]) -> set[str]:
        found = self.state.redis.hmget(self.key, keys) if keys else []
        return {key for key, value in zip(keys, found, strict=True) if value is not None}

    def keep(self, key: str, answer: dict[str, Any], share_for: int | None) -> None:
        value = json.dumps(answer)
        self._keep(keys=[self.key, self.state.keys.tombstone], args=[key, value, self.state.ttl])
        if share_for is not None:
            self.state.redis.set(shared_answer_key(key), value, ex=share_for)
