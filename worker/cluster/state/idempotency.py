"""Idempotent submit: the first submit with a key claims it (one SET NX, so of two concurrent submits exactly
one records a run); a later one with the same key, within the run TTL, finds the first run's id instead.

The claim holds the run id and a fingerprint of what was submitted (workflow and inputs), so a key reused for
something else is told apart from a retry. The claim is taken before the run is recorded (the record follows at
once): a submit that fails to record its run gives the claim back (`release`); a claim whose run is still not
recorded `SETTLE_SECONDS` later (its submit was killed in between, or the run was purged) is taken over by the
next submit with the key (`take_over`, lua/take_over_idempotency.lua), which records a run of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from worker.cluster.state.keys import idempotency_key
from worker.cluster.state.once import once

#: How long a submit that finds a claim waits for the claiming submit to record its run before taking it over.
SETTLE_SECONDS = 5.0


def claim(
    client: redis.Redis, key: str, run_id: str, fingerprint: str, ttl: int, recorded: Callable[[str], bool]
) -> tuple[str, str] | None:
    """Claim `key` for `run_id`; None when this submit holds it now, else the (run id, fingerprint) of the submit
    that does. `recorded(run_id)`: whether that run is in Redis (a claim naming none is taken over once settled)."""
    name, mine = idempotency_key(key), f"{run_id} {fingerprint}"
    while True:
        held = client.set(name, mine, nx=True, ex=ttl, get=True)
        if held is None:
            return None
        existing, _, print_ = held.decode().partition(" ")
        if _settled(existing, recorded):
            return existing, print_
        if once(client, "take_over_idempotency")(keys=[name], args=[held, mine, ttl]):
            return None  # else another submit changed the claim meanwhile: look at it again


def _settled(run_id: str, recorded: Callable[[str], bool]) -> bool:
    """Whether the claiming run is recorded, waiting up to SETTLE_SECONDS for a submit still recording it."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while not recorded(run_id):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)  # the claiming submit writes the record right after its claim: nothing to subscribe to
    return True


def release(client: redis.Redis, key: str, run_id: str) -> None:
    """Give back a claim this submit took (its run was not recorded), never another submit's."""
    name = idempotency_key(key)
    held = client.get(name)
    if held is not None and held.decode().split(" ", 1)[0] == run_id:
        client.delete(name)
