"""Shrinking a failing schedule: why a module of its own? A schedule that fails with three faults over a workflow of
six features says little about the cause; the smallest one that still fails says much. Greedy and in a fixed order,
so the same failing schedule shrinks the same way: drop each fault in turn, then each feature, then halve the items,
keeping every step after which some violation of the same invariant remains. The result is printed as a pytest test
(`as_test`) that the suite can keep: the reduced schedule written out in full, checked by the same runner.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.chaos.generator import Schedule


def invariant_of(violation: str) -> str:
    """The invariant a violation line names (`schedule N: <invariant>: ...`)."""
    return violation.split(": ", 2)[1]


def shrink(campaign: Any, schedule: Schedule, budget: int = 12) -> Schedule:
    """The smallest schedule found (within `budget` runs) that still breaks an invariant `schedule` broke."""
    wanted = {invariant_of(v) for v in campaign.check(schedule).violations}
    if not wanted:
        return schedule

    def still_fails(candidate: Schedule) -> bool:
        nonlocal budget
        budget -= 1
        return bool(wanted & {invariant_of(v) for v in campaign.check(candidate).violations})

    current = schedule
    for index in reversed(range(len(current.faults))):
        if budget > 0 and still_fails(current.without_fault(index)):
            current = current.without_fault(index)
    for feature in list(current.features):
        if budget > 0 and still_fails(current.without_feature(feature)):
            current = current.without_feature(feature)
    while budget > 0 and current.items > 4:
        smaller = replace(current, items=current.items // 2, failing=tuple(i for i in current.failing
                                                                          if i < current.items // 2))  # fmt: skip
        if not still_fails(smaller):
            break
        current = smaller
    return current


def as_test(schedule: Schedule, violations: list[str]) -> str:
    """A pytest test keeping `schedule` (for tests/chaos/test_campaign.py, whose `chaos` fixture is the campaign)."""
    found = "\n    ".join(violations) or "(none on this replay)"
    return (
        f"def test_schedule_{schedule.number}_keeps_its_invariants(chaos: Campaign) -> None:\n"
        f'    """Shrunk from schedule {schedule.number}; it broke:\n    {found}\n    """\n'
        f"    schedule = {schedule!r}\n"
        f"    verdict = chaos.check(schedule)\n"
        f"    assert verdict.violations == [], verdict.line()\n"
    )
