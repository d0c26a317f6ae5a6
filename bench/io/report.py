"""bench/IO.md: the tables and the verdicts of `python -m bench.io`, from the measured numbers only."""

from __future__ import annotations

from bench.harness import Session, document, table, verdict
from bench.io import (
    BURST,
    KEY,
    LATENCY,
    MAX_CONCURRENT,
    RATE,
    RETRY_AFTER,
    TARGET_429,
    TARGET_CONNECTIONS,
    TARGET_RATIO,
    Results,
    Row,
)


def per_process(row: Row) -> str:
    if not row.processes:
        return "-"
    text = f"{row.per_process_mean:.1f} mean over {row.processes}, max {row.per_process_max}"
    return text + (f" ({row.unattributed} not attributed)" if row.unattributed else "")


def main_table(rows: list[Row]) -> str:
    head = ("variant", "what", "items", "wall s", "ideal s", "wall/ideal", "requests", "429 %", "failed items")
    head += ("connections", "connections per worker process")
    body = []
    for r in rows:
        wall = f"{r.wall:.2f}" + (" (error)" if r.error else " (ended failed)" if r.ended else "")
        failed = f"{r.failed:,}" + (" (the run failed)" if r.ended else "")
        ratio = f"{r.wall / r.ideal:.2f}" if r.ideal and not (r.error or r.ended) else "-"
        body.append(
            (r.variant, r.what, f"{r.items:,}", wall, f"{r.ideal:.2f}", ratio, f"{r.requests:,}",
             f"{r.throttled_percent:.1f}", failed, f"{r.connections:,}", per_process(r))
        )  # fmt: skip
    return table(head, body, "llrrrrrrrrl")


def detail_table(rows: list[Row]) -> str:
    head = ("variant", "workers (inspect stats)", "200s", "429s", "peak in flight", "peak open connections")
    head += ("requests per connection", "200s per second", "longest pause s", "notes")
    body = []
    for r in rows:
        s = r.stats
        span = (s.get("last") or 0) - (s.get("first") or 0)
        per_connection = f"{r.requests / r.connections:.1f}" if r.connections else "-"
        ok_rate = f"{s.get('ok', 0) / span:.0f}" if span > 0 else "-"
        ended = r.ended and f"run ended {r.ended}"
        notes = "; ".join(filter(None, [r.error and f"error: {r.error}", ended, r.note])) or "-"
        body.append(
            (r.variant, r.workers or "-", f"{s.get('ok', 0):,}", f"{s.get('throttled', 0):,}",
             s.get("peak_in_flight", 0), s.get("peak_open", 0), per_connection, ok_rate, f"{s.get('max_gap', 0):.2f}",
             notes.replace("|", "/"))
        )  # fmt: skip
    return table(head, body, "llrrrrrrrl")


def over(value: float, target: float, unit: str = "") -> str:
    return f"{value - target:+.2f}{unit} over the target" if value > target else "within it"


def how_it_ended(row: Row) -> str:
    """' The run ended failed: ...' when it did not succeed (its items then count as failed), else ''."""
    if not row.ended:
        return ""
    ok = row.stats.get("ok", 0)
    return f" The run ended {row.ended} (the server had answered {ok:,} requests with 200 by then)."


def pace(row: Row) -> str:
    """What the server saw of the pacing: 200s a second, the longest pause, the peak in flight."""
    s = row.stats
    span = (s.get("last") or 0) - (s.get("first") or 0)
    rate = f"{s.get('ok', 0) / span:.0f}" if span > 0 else "-"
    return (
        f"the server answered {rate} requests/s with 200 on average, paused at most {s.get('max_gap', 0):.2f} s "
        f"between two requests (Retry-After is {RETRY_AFTER} s) and had at most {s.get('peak_in_flight', 0)} in "
        f"flight (at {RATE:g}/s and {LATENCY * 1000:g} ms a request the limit needs {RATE * LATENCY:g})"
    )


def versus_ideal(row: Row) -> str:
    """' = 1.23x ideal' for a run that succeeded; '' when the time says nothing of the pace."""
    return "" if row.error or row.ended else f" = {row.wall / row.ideal:.2f}x ideal"


def findings(rows: dict[str, Row]) -> list[str]:
    out = []
    a = rows.get("a")
    if a is not None and not a.error:
        ratio = a.wall / a.ideal
        connections = max(a.per_process_mean, a.per_process_max)
        out.append(
            f"- **(a) chordflow with a declared limit**: wall {a.wall:.2f} s = {ratio:.2f}x ideal (target <= "
            f"{TARGET_RATIO}x: {verdict(ratio <= TARGET_RATIO and not a.ended)}, {over(ratio, TARGET_RATIO, 'x')}); "
            f"429s {a.throttled_percent:.1f}% of {a.requests:,} requests (target <= {TARGET_429:g}%: "
            f"{verdict(a.throttled_percent <= TARGET_429)}, {over(a.throttled_percent, TARGET_429, ' points')}); "
            f"{a.connections} connections, {connections:.1f} per worker process at most over {a.processes} (target "
            f"<= {TARGET_CONNECTIONS}: {verdict(connections <= TARGET_CONNECTIONS)}); {a.failed:,} of {a.items:,} "
            f"items failed; {pace(a)}.{how_it_ended(a)}"
        )
    elif a is not None:
        out.append(f"- **(a)** could not be measured: {a.error}. Targets: {verdict(False)}.")
    b = rows.get("b")
    if b is not None:
        ok = b.failed == 0 and not b.error and not b.ended
        out.append(
            f"- **(b) chordflow without a declared limit**: {b.failed:,} of {b.items:,} items failed (target: every "
            f"item succeeds: {verdict(ok)}); wall {b.wall:.2f} s{versus_ideal(b)}, 429s "
            f"{b.throttled_percent:.1f}% of {b.requests:,} requests, {b.connections} connections; {pace(b)}."
            f"{how_it_ended(b)}{f' Not measured: {b.error}.' if b.error else ''}"
        )
    c = rows.get("c")
    if c is not None:
        out.append(
            f"- **(c) hand-written Celery** (no target): {c.failed:,} of {c.items:,} tasks failed "
            f"({100 * c.failed / c.items:.1f}%, a 429 or a raise); wall {c.wall:.2f} s = "
            f"{c.wall / c.ideal:.2f}x ideal; {c.connections:,} connections for {c.requests:,} requests."
        )
    d = rows.get("d")
    if d is not None:
        ok = d.throttled_percent <= TARGET_429 and not d.error
        out.append(
            f"- **(d) two chordflow runs at once, one key**: 429s {d.throttled_percent:.1f}% of {d.requests:,} "
            f"requests together (<= {TARGET_429:g}%: {verdict(ok)}); both done after {d.wall:.2f} s"
            f"{versus_ideal(d)} (the ideal of both); {d.failed:,} items failed; {pace(d)}.{how_it_ended(d)}"
        )
    return out


def render(session: Session, results: Results) -> str:
    rows = {row.variant: row for row in results.rows}
    quick = (
        f"\n\n`--quick`: {results.sizes.items} items, an ideal of {results.sizes.items / RATE:.1f} s, so starting "
        "`chordflow submit`/`wait` and the first chunks weigh far more than at full size; the targets are meant "
        "for the full run (`python -m bench.io`)."
        if session.quick
        else ""
    )
    body = f"""
The API (bench/io_server.py, its own process on 127.0.0.1) answers a GET after {LATENCY * 1000:g} ms and allows
{RATE:g} requests a second over the whole server (a token bucket banking {BURST}); above that it answers 429 at
once with `Retry-After: {RETRY_AFTER}`. It counts requests, 200s, 429s and TCP connections, reset before each
variant. Ideal time = items / {RATE:g}. Wall time runs from `chordflow submit` (or the Celery client) starting
to `chordflow wait` (or `GroupResult.get()`) returning, both fresh processes. Every set of workers gets an
untimed warm-up run first.

- (a) one `http` batch node, `parallel`, `max_concurrent` {MAX_CONCURRENT}, `error_handling: continue`,
  `rate_limit` {{key `{KEY}`, {RATE:g}/s}}; 2 x `chordflow worker` with its defaults.
- (d) the same workflow, two runs submitted at once with half the items each, on (a)'s workers.
- (b) the same node without `rate_limit`, on 2 x `chordflow worker -P threads -c 32`: 429s must be waited out.
- (c) a Celery app of its own (bench/io_tasks.py): one `httpx.get` per task, a `group`, `GroupResult.get()`, on
  2 x `celery worker -P threads -c 32`. A task fails when it saw a 429 (or raised).

Connections: counted by the server (a connection counts once, when it sends its first request); "per worker
process" is the mean over the processes that run tasks (prefork children, else the worker) and the most any
one of them held, from who owned each socket (/proc/net/tcp and the workers' fds, every 50 ms: a connection
that lived less than that may go unattributed).{quick}

## Results

{main_table(results.rows)}

## Server side and workers

{detail_table(results.rows)}

## What it shows

Targets: (a) wall <= {TARGET_RATIO}x ideal, 429s <= {TARGET_429:g}% of requests, <= {TARGET_CONNECTIONS}
connections per worker process; (b) every item succeeds.

{chr(10).join(findings(rows))}
"""
    return document(session, "I/O-bound batch items against a rate-limited API", body)
