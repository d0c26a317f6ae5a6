"""bench/PROVIDER_BATCHES.md from `python -m bench.provider_batches`'s results: the variants side by side, the
timeline of the two provider-batch runs, then the targets."""

from __future__ import annotations

import os

from bench.harness import Session, document, table, verdict
from bench.provider_batches import (
    BATCH_FRACTION,
    HALF_FINISH,
    LONGEST,
    MAX_CONCURRENT,
    MOST_LINES,
    POLL_MIN,
    PRICES,
    PROMPT,
    SHORTEST,
    SYNC_DELAY,
    TAIL_SLACK,
    TARGET_COST,
    WRITTEN,
    Results,
    Row,
)


def seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def tokens(pair: tuple[int, int]) -> str:
    return f"{pair[0]:,} / {pair[1]:,}"


def render(session: Session, results: Results) -> str:
    sizes = results.sizes
    head = (
        "variant", "what", "items answered", "sync requests billed", "batch lines billed", "tokens sync (in / out)",
        "tokens batch (in / out)", "cost (usage_totals)", "cost (provider's counters)", "saved (usage_totals)",
        "batch_calls / calls", "provider batches created", "wall",
    )  # fmt: skip
    rows = [
        (
            r.variant, r.what, f"{r.answered:,} / {r.items:,}", f"{r.seen.sync_status[200]:,}",
            f"{r.seen.batch_lines:,}", tokens(r.seen.tokens), tokens(r.seen.batch_tokens), f"${r.cost:.4f}",
            f"${r.seen.provider_cost:.4f}", f"${float(r.usage.get('saved_usd') or 0.0):.4f}",
            f"{r.usage.get('batch_calls', 0):,} / {r.usage.get('calls', 0):,}", f"{len(r.seen.batches)}",
            f"{r.wall:.1f} s",
        )
        for r in results.rows
    ]  # fmt: skip
    errors = "".join(f"- ({r.variant}) **Not measured: {r.error}**\n" for r in results.rows if r.error)
    same = (
        f"**The three variants' `results[i][\"response\"]` lists are identical** ({sizes.items:,} answers each, in "
        "input order), and each is the provider's answer to its own item's prompt."
        if results.identical()
        else "**The variants' results differ** (see Targets): " + "; ".join(
            f"({r.variant}) {'matches' if r.same_as_expected else 'does not match'} the provider's answers"
            for r in results.rows
        )
    )  # fmt: skip
    price = PRICES[WRITTEN]
    body = f"""
{sizes.items:,} items, each one chat with `{WRITTEN}` with a prompt of its own (`{PROMPT}`), through one `llm`
batch node (`parallel`, `max_concurrent` {MAX_CONCURRENT}, `error_handling` continue) on `scheduler.api.submit` +
`wait`, against one loopback provider: answers of {SHORTEST}-{LONGEST} tokens fixed by a digest of the prompt,
{SYNC_DELAY * 1000:g} ms per synchronous answer. Prices: ${price["input"]:g} / ${price["output"]:g} per 1M input /
output tokens, provider batches at x{BATCH_FRACTION:g}.

- (a) The loopback provider finishes every line {sizes.batch_delay:g} s after the batch is created. **That delay
  stands for the provider's own time**: a real one takes minutes to hours (within 24 h); the wall time here is that
  delay plus the engine's overhead around it (creating the batch, looking at it at least every {POLL_MIN:g} s, keeping
  the answers, running the items on them).
- (b) No `provider_batch`: every item asked synchronously, at most {MAX_CONCURRENT} in flight over the cluster
  (`max_concurrent` holds across both workers): at best {sizes.items:,} x {SYNC_DELAY * 1000:g} ms / {MAX_CONCURRENT}
  = {sizes.items * SYNC_DELAY / MAX_CONCURRENT:.1f} s.
- (c) The provider finishes lines at positions below {sizes.items // 2:,} {HALF_FINISH:g} s after creation and the
  others never within the run; the deadline is {sizes.deadline:g} s.

{table(head, rows, "llrrrrrrrrrrr")}

{errors}{same}

{cpu(results)}

{synchronous(results)}

Cost: `usage_totals(result.shared)` (worker/llm/usage.py) against the provider's own counters (synchronous tokens
at the price, batch lines' tokens at half of it); the two agree when the columns do. "sync requests billed":
requests the provider answered 200 on `/v1/chat/completions`; "batch lines billed": lines of provider batches it
answered 200.

{timeline(results)}

{targets(results)}
"""
    return document(session, "Provider batches: half price, the same results, the deadline kept", body)


def synchronous(results: Results) -> str:
    """(b) against its best case, and what bounds it: the cores (the workers' CPU per item) or the provider."""
    b = results.get("b")
    if b is None or b.error or not b.cpu:
        return ""
    best = b.items * SYNC_DELAY / MAX_CONCURRENT
    cores = os.cpu_count() or 1
    return (
        f"(b) took {b.wall:.1f} s against {best:.1f} s at best: its workers used {b.cpu['workers']:.1f} s of CPU "
        f"({1000 * b.cpu['workers'] / b.items:.1f} ms an item: the `openai` client, the item's bookkeeping) and this "
        f"process {b.cpu['clients']:.1f} s serving the answers, on {cores} cores busy "
        f"{100 * b.cpu['machine'] / (b.wall * cores):.0f}% of the time."
    )


def cpu(results: Results) -> str:
    """Where the CPU went during each run: the machine's cores are shared by the workers, redis-server and this
    process (the provider serves from it)."""
    lines, cores = [], os.cpu_count() or 1
    for r in results.rows:
        u = r.cpu
        if not u:
            continue
        lines.append(
            f"- ({r.variant}) CPU over {u['wall']:.1f} s: workers {u['workers']:.1f} s, this process (the provider and "
            f"`wait`) {u['clients']:.1f} s, redis-server {u['redis']:.1f} s; the machine was busy "
            f"{u['machine']:.1f} s of {u['wall'] * cores:.1f} s ({cores} cores x wall), other processes "
            f"{max(0.0, u['others']):.1f} s of it"
        )
    return "\n".join(lines)


def timeline(results: Results) -> str:
    """When each step of (a) and (c) happened, in seconds after submit."""
    a, c = results.get("a"), results.get("c")
    lines = ["## Timeline (seconds after submit)", ""]
    if a is not None and a.seen.created_at is not None:
        lines.append(
            f"- (a) batch created at {seconds(a.at(a.seen.created_at))}; its lines finished at "
            f"{seconds(a.at(a.seen.created_at + results.sizes.batch_delay))} (the provider's "
            f"{results.sizes.batch_delay:g} s); the run stopped waiting at {seconds(a.at(a.waiting_until))} (seen "
            f"by polling `status` every 0.1 s); ended at {seconds(a.wall)}. Overhead around the provider's time: "
            f"**{a.wall - results.sizes.batch_delay:.1f} s** for {a.items:,} items. {steps(a)}"
        )
    if c is not None and c.seen.created_at is not None:
        lines.append(
            f"- (c) batch created at {seconds(c.at(c.seen.created_at))}; deadline at {seconds(c.at(c.deadline))}; "
            f"batch cancelled at {seconds(c.at(c.seen.cancelled_at))}; the run stopped waiting at "
            f"{seconds(c.at(c.waiting_until))}; ended at {seconds(c.wall)}: **{seconds(after_deadline(c))} after "
            f"the deadline**. The synchronous tail (cancel to end) took **{seconds(tail(c))}** for "
            f"{c.seen.sync_status[200]:,} items. {steps(c)}"
        )
    return "\n".join(lines)


def steps(row: Row) -> str:
    """Where the run's time went, from the workers' log lines (its advances, its first chunk)."""
    st = row.steps
    create, kept, looks = st.create, st.kept, st.looks
    if create is None:
        return ""
    parts = [
        f"From the workers' logs: the first advance (every item's request resolved, the file uploaded, the batch "
        f"created) took {create[1]:.1f} s"
    ]
    if looks:
        ends = [at for at, _ in looks]
        every = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else None
        spacing = f", about every {every:.1f} s" if every is not None else ""
        parts.append(
            f"{len(looks)} looks at the batch{spacing} ({POLL_MIN:g} s apart at least, sent by a timer sweep every "
            f"0.5 s), each <= {max(s for _, s in looks):.2f} s"
        )
    if kept is not None:
        parts.append(
            f"the advance that found it ended (results read, {row.seen.batch_lines:,} answers kept) took "
            f"{kept[1]:.1f} s, ending at {seconds(row.at(kept[0]))}"
        )
    if st.items_from is not None:
        parts.append(
            f"the items ran from {seconds(row.at(st.items_from))} to the end ({row.ended - st.items_from:.1f} s)"
        )
    return "; ".join(parts) + "."


def after_deadline(row: Row) -> float | None:
    return None if row.deadline is None else row.ended - row.deadline


def tail(row: Row) -> float | None:
    return None if row.seen.cancelled_at is None else row.ended - row.seen.cancelled_at


def tail_bound(results: Results, row: Row) -> float | None:
    """What (c) may take past its deadline: two looks (the one at the deadline cancels the provider batch, the next
    finds it ended; POLL_MIN apart), then TAIL_SLACK x (b)'s synchronous time for as many items as (c) asked."""
    b = results.get("b")
    if b is None or b.error or not b.items:
        return None
    return 2 * POLL_MIN + TAIL_SLACK * b.wall * row.seen.sync_status[200] / b.items


def targets(results: Results) -> str:
    a, b, c = results.get("a"), results.get("b"), results.get("c")
    if a is None or b is None or c is None:
        return "## Targets\n\nNot every variant was measured."
    ratio = a.cost / b.cost if b.cost else None
    bound = tail_bound(results, c)
    late = after_deadline(c)
    cancel_late = None if c.deadline is None or c.seen.cancelled_at is None else c.seen.cancelled_at - c.deadline
    rows = [
        (
            "every item answered, in each variant",
            ", ".join(f"({r.variant}) {r.answered:,} / {r.items:,}" for r in (a, b, c)),
            verdict(all(r.answered == r.items for r in (a, b, c))),
        ),
        (
            'the same results in input order: (a), (b), (c) give the same `results[i]["response"]` list',
            "identical" if results.identical() else "differ",
            verdict(results.identical()),
        ),
        (
            f"cost (a) <= {TARGET_COST} x (b)",
            "n/a" if ratio is None else f"${a.cost:.4f} / ${b.cost:.4f} = {ratio:.3f} x",
            verdict(None if ratio is None else ratio <= TARGET_COST),
        ),
        (
            "usage_totals' cost = the provider's counters' (each variant)",
            ", ".join(f"({r.variant}) ${r.cost:.4f} vs ${r.seen.provider_cost:.4f}" for r in (a, b, c)),
            verdict(all(abs(r.cost - r.seen.provider_cost) <= 1e-6 + 1e-9 * r.cost for r in (a, b, c))),
        ),
        (
            f"(a): one provider batch ({a.items:,} < {MOST_LINES:,} lines), nothing asked synchronously",
            f"{len(a.seen.batches)} created, {a.seen.sync_status[200]:,} sync requests",
            verdict(len(a.seen.batches) == 1 and not a.seen.sync_status),
        ),
        (
            "no provider batch created twice, no line answered twice, no prompt asked twice synchronously",
            ", ".join(f"({r.variant}) {len(r.seen.batches)} batch(es), {r.seen.twice} twice" for r in (a, b, c)),
            verdict(len(a.seen.batches) == 1 and len(c.seen.batches) == 1 and not any(r.seen.twice for r in (a, b, c))),
        ),
        (
            "(c): no item asked both ways (answered in the batch and asked synchronously)",
            f"{c.seen.both_ways():,} items; {c.seen.batch_lines:,} batch + {c.seen.sync_status[200]:,} sync",
            verdict(c.seen.both_ways() == 0 and c.seen.batch_lines + c.seen.sync_status[200] == c.items),
        ),
        (
            f"deadline kept: (c)'s provider batch cancelled within {POLL_MIN:g} s (one look) of the deadline",
            "n/a" if cancel_late is None else f"cancelled {cancel_late:.1f} s after the deadline",
            verdict(None if cancel_late is None else cancel_late <= POLL_MIN),
        ),
        (
            f"deadline met: (c) ends within deadline + tail (2 x {POLL_MIN:g} s: the look that cancels, the look that "
            f"finds the batch ended; then {TAIL_SLACK:g} x (b)'s synchronous time for as many items)",
            "n/a" if late is None or bound is None else f"ended {late:.1f} s after the deadline; bound {bound:.1f} s",
            verdict(None if late is None or bound is None else late <= bound),
        ),
    ]
    return f"## Targets\n\n{table(('target', 'measured', 'verdict'), rows)}"
