"""Tolerated failures (Step Functions' ToleratedFailurePercentage / ToleratedFailureCount), one rule for
IR batch blocks and dataset jobs.

Failures only grow, so a threshold is known to be exceeded before the end once `failed` passes the count,
or passes the percentage of a total that is already known. Until the total is known (a dataset file still
being read) only the count can stop a job early; the percentage is judged on the final total.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """At most `percent` % and at most `count` failed items; None: that bound is not set."""

    percent: float | None = None
    count: int | None = None

    @property
    def set(self) -> bool:
        return self.percent is not None or self.count is not None

    def exceeded(self, failed: int, total: int | None) -> bool:
        """Whether `failed` failures already break a bound (`total` None: not known yet)."""
        if self.count is not None and failed > self.count:
            return True
        return self.percent is not None and total is not None and failed * 100 > self.percent * total

    def verdict(self, failed: int, total: int, noun: str = "records") -> str | None:
        """The run's error when its failures are not tolerated, else None (`failed 312 of 10000 records
        (3.1%), tolerated 2%`). Without any bound, one failure is not tolerated."""
        if failed == 0 or (self.set and not self.exceeded(failed, total)):
            return None
        text = f"failed {failed} of {total} {noun} ({_percent(failed, total)})"
        bounds = [
            f"{self.percent:g}%" if self.percent is not None else "",
            f"{self.count}" if self.count is not None else "",
        ]
        bounds = [b for b in bounds if b]
        return f"{text}, tolerated {' and '.join(bounds)}" if bounds else text


def _percent(failed: int, total: int) -> str:
    share = 100 * failed / total if total else 100.0
    return f"{share:.1f}%" if share >= 0.1 or share == 0 else f"{share:.2g}%"
