"""Running one chunk of a dataset job's records through the per-item executor (`run_chunk`), also for a redrive
that re-runs only its failed records. Both backends run chunks through it: the local job in the client's
process (scheduler/datasets/), the cluster's `chordflow.dataset_chunk` task (worker/cluster/datasets/tasks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from worker.batch.aggregate import ChunkResult
from worker.batch.executor import ItemExecutor, ItemMiddleware, run_items
from worker.batch.outcome import ItemOutcome


def run_chunk(
    executor: ItemExecutor,
    records: list[Any],
    bad: dict[int, str],
    start: int,
    done: ChunkResult | None,
    hooks: Callable[[int], Sequence[ItemMiddleware]],
) -> ChunkResult:
    """Run a chunk's records that have no successful outcome in `done` (all of them the first time) and
    return the chunk's outcomes, `done`'s successes kept as they were (a redrive never runs them again).

    Records run in ascending runs of consecutive offsets, each through `run_items` with fresh `hooks(n)`;
    a hook that stops one (cancel, threshold) ends the chunk there: its outcomes stay a contiguous prefix.
    Its `appended` holds what the records run now appended to the store's accumulators (their model calls).
    """
    results = list(done.results) if done else []
    failures = {f.index: f for f in done.failures} if done else {}
    appended: dict[str, list] = {}
    todo = sorted({f.index - start for f in failures.values()} | set(range(len(results), len(records))))
    for first, last in _runs(todo):
        ran = _run_span(executor, records, bad, start, first, last, hooks)
        for offset, result in enumerate(ran.results, first):
            if offset < len(results):
                results[offset] = result
            else:
                results.append(result)
            failures.pop(start + offset, None)
        failures.update((f.index, f) for f in ran.failures)
        _extend(appended, ran.appended)
        if len(ran.results) < last - first:
            break
    return ChunkResult(start, results, [failures[i] for i in sorted(failures)], appended)


def _run_span(
    executor: ItemExecutor,
    records: list[Any],
    bad: dict[int, str],
    start: int,
    first: int,
    last: int,
    hooks: Callable[[int], Sequence[ItemMiddleware]],
) -> ChunkResult:
    """Records [first, last) of the chunk; a bad record (unreadable in the file) fails without running."""
    results: list[Any] = []
    failures: list[ItemOutcome] = []
    appended: dict[str, list] = {}
    offset = first
    while offset < last:
        if offset in bad:
            results.append(None)
            failures.append(ItemOutcome(start + offset, None, bad[offset], "BadRecord"))
            offset += 1
            continue
        end = next((o for o in range(offset, last) if o in bad), last)
        part = run_items(executor, records[offset:end], start + offset, hooks(end - offset))
        results.extend(part.results)
        failures.extend(part.failures)
        _extend(appended, part.appended)
        if len(part.results) < end - offset:
            break
        offset = end
    return ChunkResult(start + first, results, failures, appended)


def _extend(appended: dict[str, list], more: dict[str, list]) -> None:
    for key, entries in more.items():
        appended.setdefault(key, []).extend(entries)


def _runs(offsets: list[int]) -> Iterator[tuple[int, int]]:
    """[1, 2, 3, 7, 8] -> (1, 4), (7, 9): runs of consecutive offsets as half-open spans."""
    if not offsets:
        return
    first = previous = offsets[0]
    for offset in offsets[1:]:
        if offset != previous + 1:
            yield first, previous + 1
            first = offset
        previous = offset
    yield first, previous + 1
