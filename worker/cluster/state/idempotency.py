"""Idempotent submit: the first submit with a key claims it (one SET NX, so of two concurrent submits exactly
one records a run); a later one with the same key, within the run TTL, finds the first run's id instead.

The claim holds the run id and a fingerprint of what was submitted (workflow and inputs), so a key reused for
something else is told apart from a retry. The claim is taken before the run is recorded: a submit that fails
to record its run gives the claim back (`release`); one killed in between leaves a key naming a run that never
existed, which `status` reports as unknown (a retry then needs a new key).
"""

from __future__ import annotations

import redis

from worker.cluster.state.keys import idempotency_key


def claim(client: redis.Redis, key: str, run_id: str, fingerprint: str, ttl: int) -> tuple[str, str] | None:
    """Claim `key` for `run_id`; None when claimed now, else the (run id, fingerprint) that holds it."""
    held = client.set(idempotency_key(key), f"{run_id} {fingerprint}", nx=True, ex=ttl, get=True)
    if held is None:
        return None
    existing, _, print_ = held.decode().partition(" ")
    return existing, print_


def release(client: redis.Redis, key: str, run_id: str) -> None:
    """Give back a claim this submit took (its run was not recorded), never another submit's."""
    name = idempotency_key(key)
    held = client.get(name)
    if held is not None and held.decode().split(" ", 1)[0] == run_id:
        client.delete(name)
