"""bench/LLM.md from `python -m bench.llm`'s results: the variants side by side, then the targets."""

from __future__ import annotations

from bench.harness import Session, document, table, verdict
from bench.llm import (
    CHUNK,
    LATENCY,
    LONGEST,
    MAX_CONCURRENT,
    SHORTEST,
    TARGET_429,
    TARGET_BILLED,
    TARGET_WALL,
    Results,
)


def render(session: Session, results: Results) -> str:
    sizes = results.sizes
    ideal = 60.0 * results.needed / sizes.quota
    head = (
        "variant", "what", "items answered", "billed requests (200)", "billed / items", "429s (% of requests)",
        "tokens billed (needed)", "wall (ideal)", "wall / ideal",
    )  # fmt: skip
    rows = [
        (
            r.variant, r.what, f"{r.answered:,} / {r.items:,}", f"{r.billed:,}", f"{r.billed / r.items:.3f}",
            f"{r.requests[429]:,} ({r.throttled_percent:.2f}%)", f"{r.tokens:,} ({r.needed:,})",
            f"{r.wall:.1f} s ({r.ideal:.1f} s)", f"{r.wall / r.ideal:.2f}",
        )
        for r in results.rows
    ]  # fmt: skip
    notes = "\n".join(
        f"- ({r.variant}) kill: {r.kill}. {r.note}." + (f" **Not measured: {r.error}**" if r.error else "")
        for r in results.rows
    )
    body = f"""
{sizes.items:,} items, each one chat with `openai/gpt-bench` ("summarize item N"), against a loopback provider
with a quota of **{sizes.quota:,} tokens over a sliding minute**; answers are {SHORTEST}-{LONGEST} tokens, fixed by a
digest of the prompt (no client knows them before the answer), {LATENCY * 1000:g} ms each. The items need
{results.needed:,} tokens answered once each: the ideal wall time is {ideal:.1f} s (tokens / quota).
In each variant one of the two workers is SIGKILLed when half the items have been billed
and **started again at once** (same name).

{table(head, rows, "llrrrrrrr")}

{notes}

(a) `llm` batch node, `parallel`, `max_concurrent` {MAX_CONCURRENT}, `rate_limit` {{tokens_per_minute: {sizes.quota:,}}}
on `chordflow submit` + `chordflow wait`; chordflow's `openai` client has its retries off, the engine waits out a 429
for the whole bucket. (b) bench/llm_tasks.py: {CHUNK} items a task, one `openai.OpenAI()` per process with its
default retries (2, honouring Retry-After), msgpack, Celery's defaults otherwise: prefetch multiplier 4,
`acks_late` off (a task is acknowledged when it starts: the one running in the killed worker is gone, no
redelivery), the Redis transport's `visibility_timeout` of 3,600 s (the killed worker's prefetched, unacknowledged
tasks come back only after an hour). Its wall time is when its last task finished; a group that never completes
is given up on once its queue is empty and both workers say they are idle.

{targets(results)}
"""
    return document(session, "LLM batch under a tokens-per-minute quota, a worker killed half-way", body)


def targets(results: Results) -> str:
    ours = next((r for r in results.rows if r.variant == "a" and r.error is None), None)
    theirs = next((r for r in results.rows if r.variant == "b" and r.error is None), None)
    if ours is None:
        return "## Targets\n\nchordflow's variant was not measured."
    complete = theirs is not None and theirs.answered == theirs.items

    def faster() -> bool | None:
        if theirs is None:
            return None
        return ours.answered == ours.items and (not complete or ours.wall <= theirs.wall)

    baseline = "not measured" if theirs is None else f"{theirs.wall:.1f} s, {theirs.answered:,} answered"
    rows = [
        ("every item answered", f"{ours.answered:,} / {ours.items:,}", verdict(ours.answered == ours.items)),
        (
            f"billed requests <= {TARGET_BILLED} x items, with the kill",
            f"{ours.billed:,} = {ours.billed / ours.items:.3f} x",
            verdict(ours.billed <= TARGET_BILLED * ours.items),
        ),
        (
            f"wall <= {TARGET_WALL} x ideal",
            f"{ours.wall:.1f} s = {ours.wall / ours.ideal:.2f} x {ours.ideal:.1f} s",
            verdict(ours.wall <= TARGET_WALL * ours.ideal),
        ),
        (
            f"429s <= {TARGET_429:g}% of requests",
            f"{ours.throttled_percent:.2f}% ({ours.requests[429]:,} of {ours.sent:,})",
            verdict(ours.throttled_percent <= TARGET_429),
        ),
        (
            "no slower than the hand-written group (which must answer every item to count as faster)",
            f"{ours.wall:.1f} s vs {baseline}",
            verdict(faster()),
        ),
    ]
    return f"## Targets (chordflow, a)\n\n{table(('target', 'measured', 'verdict'), rows)}"
