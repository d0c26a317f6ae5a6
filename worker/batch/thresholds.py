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
        text = f"failed {failed} of {total} {noun} ({_percent(failed, total, self.percent)})"
        bounds = [
            f"{self.percent:g}%" if self.percent is not None else "",
            f"{self.count}" if self.count is not None else "",
        ]
        bounds = [b for b in bounds if b]
        return f"{text}, tolerated {' and '.join(bounds)}" if bounds else text


#: The most decimals a share is shown with, to read as over its bound (2.01% of a 2% bound, not 2.0%).
MAX_DECIMALS = 6


def _percent(failed: int, total: int, bound: float | None = None) -> str:
    """`3.1%`; with the decimals it takes to read as over `bound` when it is (`2.01%`, tolerated 2%)."""
    share = 100 * failed / total if total else 100.0
    if share < 0.1 and share != 0:
        return f"{share:.2g}%"
    text = f"{share:.1f}"
    for decimals in range(2, MAX_DECIMALS + 1):
        if bound is None or share <= bound or float(text) > bound:
            break
        text = f"{share:.{decimals}f}"
    return text + "%"
