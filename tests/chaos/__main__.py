"""`python -m tests.chaos` (`make chaos`): run schedules against a cluster of its own and print one line each.

Why an entry point apart from pytest: a campaign of a hundred schedules is a long run to watch, not a test; the
suite keeps a short one (test_campaign.py). `--seed N` (`make chaos SEED=N`) replays schedule N exactly;
`--schedules K` runs schedules `--first` .. `--first`+K-1. A failing schedule is shrunk (shrink.py) unless
`--no-shrink`, and the smallest schedule that still fails is printed as a pytest test to keep. `--faults` prints,
under each schedule's line, what each fault hit (a worker, a pool child, `n1` mid-execution or idle, the RabbitMQ
node) or that it was not reached. A schedule with the `rabbitmq` feature (from 501 on) starts the campaign's RabbitMQ
node the first time (~12 s), one with `cut_worker` its far host (runner.py).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos import generator, shrink
from tests.chaos.runner import campaign


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="replay this one schedule number")
    parser.add_argument("--schedules", type=int, default=10, help="how many schedules (default 10)")
    parser.add_argument("--first", type=int, default=1, help="the first schedule number (default 1)")
    parser.add_argument("--no-shrink", action="store_true", help="report a failing schedule without shrinking it")
    parser.add_argument("--faults", action="store_true", help="print what each fault hit, under each schedule")
    args = parser.parse_args(argv)
    numbers = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.schedules))
    failed, kinds, began = [], collections.Counter(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp, campaign(Path(tmp)) as made:
        for number in numbers:
            schedule = generator.generate(number)
            verdict = made.check(schedule)
            kinds.update(f.split(" ")[0].rstrip(":") for f in verdict.faults if "not reached" not in f)
            print(verdict.line(), flush=True)
            if args.faults:
                print(f"  faults: {'; '.join(verdict.faults) or 'none'}", flush=True)
            for violation in verdict.violations:
                print(f"  {violation}", flush=True)
            if verdict.violations:
                failed.append(number)
                if not args.no_shrink:
                    smallest = shrink.shrink(made, schedule)
                    print(shrink.as_test(smallest, made.check(smallest).violations), flush=True)
    print(f"{len(numbers)} schedules in {time.monotonic() - began:.0f} s; faults injected: {dict(kinds)}; "
          f"failed: {failed or 'none'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
