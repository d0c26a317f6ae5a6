"""DATASETS.md: the jobs side by side, the stock Celery group and the local backend beside them, how each figure
was taken."""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
from typing import Any

from bench import harness
from bench.datasets import CHUNK, POLL, STOCK_CHUNK, SUBMIT_RSS_MB, TEXT, Results, workflow
from bench.harness import POOL, Session, mb, redis_text, verdict, worker_text

#: Each target's goal: the most a round's ratio of wall times may be (its median over the rounds).
GOALS = {"one": 1.0, "three": 1.3, "local": 2.0}
MISSED = {"one": "one command", "three": "three commands", "local": "local run + results"}


def ratios(one_round: dict[str, Any]) -> dict[str, float]:
    """A paired round's three ratios: chordflow's forms over the stock group's wall, local over the loop's."""
    stock, job, local = one_round["stock"]["child"].seconds, one_round["job"], one_round["local"]
    return {
        "three": job["seconds"] / stock,
        "one": job["one"]["seconds"] / stock,
        "local": (local["child"].seconds + local["results"].seconds) / local["loop"].seconds,
    }


#: A round is left alone when other processes used less CPU than this in each of its timed phases.
QUIET_SECONDS = 0.5


def quiet(one_round: dict[str, Any]) -> bool:
    """Other processes on the machine took under QUIET_SECONDS of CPU in each of the round's cluster phases."""
    phases = (one_round["stock"], one_round["job"], one_round["job"]["one"])
    return all(phase["cpu_used"]["others"] < QUIET_SECONDS for phase in phases)


def median_round(results: Results) -> dict[str, Any] | None:
    """The round whose three-command ratio is the median one: the round the detailed tables show."""
    if not results.rounds:
        return None
    ranked = sorted(results.rounds, key=lambda r: ratios(r)["three"])
    return ranked[(len(ranked) - 1) // 2]


def shown(results: Results) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The jobs, stock runs and local run the detailed tables show: the large ones and the median round's."""
    middle = median_round(results)
    big = [j for j in results.jobs if j["n"] == results.sizes.large]
    jobs = [*big, *([middle["job"]] if middle else []), *(j for j in results.jobs if j not in big)]
    baselines = [*([middle["stock"]] if middle else []), *results.baseline]
    return jobs, baselines, middle["local"] if middle else {}


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} records/s"


def job_rows(job: dict[str, Any]) -> list[tuple[str, str]]:
    n, submit, waited, streamed = job["n"], job["submit"], job["wait"], job["results"]
    first, confirm, left = job["first"], job["confirm"], job["left"]
    chunks = job["timeline"]["tasks"].get("chordflow.dataset_chunk", [0, 0.0])
    biggest = ", ".join(f"{name} {mb(size)}" for name, size in sorted(left["usage"].items(), key=lambda kv: -kv[1])[:3])
    record_final = "?" if job["record_final"] is None else f"{job['record_final']:.2f} s"
    one = job["one"]
    rows = [
        ("**wall time, submit start to `results --out` end** (every row in the file)", f"**{job['seconds']:.2f} s**"),
        ("records/s", rate(n, job["seconds"])),
        (
            "of which `submit` (returns once every record is stored in Redis)",
            f"{submit.seconds:.2f} s ({submit.cpu:.2f} s CPU)",
        ),
        ("of which `wait` (follows the run to its end)", f"{waited.seconds:.2f} s ({waited.cpu:.2f} s CPU)"),
        ("submit start to `wait` end", f"{job['wait_end']:.2f} s"),
        (
            "of which `results RUN --out FILE` (all rows, after the end)",
            f"{streamed.seconds:.2f} s ({streamed.cpu:.2f} s CPU), peak RSS {mb(streamed.maxrss)}, "
            f"{mb(job['results_bytes'])} written",
        ),
        (
            "**one command: `run --backend celery --items FILE --out FILE`** (rows written as chunks finish)",
            f"**{one['seconds']:.2f} s** ({one['child'].cpu:.2f} s CPU, peak RSS {mb(one['child'].maxrss)}; "
            f"worker CPU {one['worker_cpu']:.2f} s; {'in order' if one['ordered'] else '**NOT in order**'}; CPU of "
            f"the machine: {one['cpu']})",
        ),
        ("run record final (status written by the last chunk), from submit start", record_final),
        (
            "worker task time (`chordflow.dataset_chunk`, both workers)",
            f"{chunks[0]:,} chunks, {chunks[1]:.2f} s ({chunks[1] / n * 1e6:.1f} us/record)",
        ),
        (
            "worker CPU (user + system, both workers, the whole phase)",
            f"{job['worker_cpu']:.2f} s ({job['worker_cpu'] / n * 1e6:.1f} us/record)",
        ),
        ("CPU of the machine during the job", job["cpu"]),
        ("**client peak RSS, `chordflow submit`** (GNU time %M)", f"**{mb(submit.maxrss)}**"),
        ("peak RSS, `chordflow wait`", mb(waited.maxrss)),
        ("worker peak RSS (VmHWM)", worker_text(job["workers"])),
        ("Redis peak memory during the job", redis_text(job)),
        (
            "Redis memory left after the job ends",
            f"{mb(left['used'] - job['redis_before'])} above the start ({mb(left['used'])} used). The run's "
            f"{len(left['usage'])} keys hold {mb(sum(left['usage'].values()))} (MEMORY USAGE: {biggest}), "
            f"expiring in {left['ttl'] / 3600:.0f} h; {left['task_results']:,} Celery task results of its "
            f"chunk tasks, {mb(left['meta_usage'])}",
        ),
        (
            "time to the first readable result (first field of `cf:{run}:ds:out`)",
            ("never seen" if job["watched"] else "not watched")
            if first is None
            else f"{first:.2f} s after submit start",
        ),
    ]
    done = "not watched (the large job only)"
    if confirm:
        done = f"{confirm['lines']:,} lines, exited {confirm['at']:.2f} s after submit start"
        done += f" ({confirm['child'].seconds:.2f} s)"
    rows.append(("confirmed: `chordflow results RUN --done --out F`, started then", done))
    rows.append(("the file: N lines, line i = record i's row", "yes" if job["ordered"] else "**NO**"))
    return rows


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    """One column per job."""
    heads = [
        f"{j['n']:,} records" + (f", chunk size {j['chunk_size']}" if j["chunk_size"] != CHUNK else "") for j in jobs
    ]
    columns = [job_rows(j) for j in jobs]
    rows = ([label, *(col[i][1] for col in columns)] for i, (label, _) in enumerate(columns[0]))
    return harness.table(["measurement", *heads], rows)


BASELINE_HEAD = ("variant", "records", "wall s", "records/s", "client peak RSS", "client CPU s", "first result")
BASELINE_HEAD += ("worker peak RSS", "worker CPU s", "Redis peak")


def baseline_table(results: Results) -> str:
    rows = []
    for job in results.jobs:
        if job["chunk_size"] == CHUNK:
            n, seconds, submit = job["n"], job["seconds"], job["submit"]
            first = "-" if job["first"] is None else f"{job['first']:.2f} s"
            name = "chordflow `submit` + `wait` + `results --out`"
            row = [name, f"{n:,}", f"{seconds:.2f}", rate(n, seconds), mb(submit.maxrss)]
            row += [f"{client_cpu(job):.2f}", first, mb(max(job["workers"].values()))]
            rows.append([*row, f"{job['worker_cpu']:.2f}", redis_text(job).split(" (")[0]])
            one, child = job["one"], job["one"]["child"]
            row = ["chordflow `run --backend celery --out`", f"{n:,}", f"{one['seconds']:.2f}", rate(n, one["seconds"])]
            row += [mb(child.maxrss), f"{child.cpu:.2f}", "as chunks end", mb(max(one["workers"].values()))]
            rows.append([*row, f"{one['worker_cpu']:.2f}", redis_text(one).split(" (")[0]])
    for run in results.baseline:
        child, n = run["child"], run["n"]
        done = child.code == 0 and run["phases"].get("ok")
        wall = (f"{child.seconds:.2f}", rate(n, child.seconds))
        wall = wall if done else (f"did not complete (exit {child.code}) after {child.seconds:.2f}", "-")
        row = ["stock Celery `group` + `GroupResult.get()` + rows to a file", f"{n:,}", *wall, mb(child.maxrss)]
        row += [f"{child.cpu:.2f}", "at the end" if done else "-", mb(max(run["workers"].values()))]
        rows.append([*row, f"{run['worker_cpu']:.2f}", redis_text(run).split(" (")[0]])
    if results.local:
        local, n = results.local, results.local["n"]
        child, streamed, loop = local["child"], local["results"], local["loop"]
        seconds, cpu = child.seconds + streamed.seconds, child.cpu + streamed.cpu
        name = "chordflow local, `run --items` + `results --out`"
        rss = f"{mb(max(child.maxrss, streamed.maxrss))} (the only process)"
        rows.append((name, f"{n:,}", f"{seconds:.2f}", rate(n, seconds), rss, f"{cpu:.2f}", "-", "-", "-", "-"))
        one = local["one"]
        name = "chordflow local, `run --items --out`"
        row = (name, f"{n:,}", f"{one.seconds:.2f}", rate(n, one.seconds), mb(one.maxrss), f"{one.cpu:.2f}")
        rows.append((*row, "-", "-", "-", "-"))
        name = "plain PocketFlow loop over the file, writing the same rows"
        rows.append((name, f"{n:,}", f"{loop.seconds:.2f}", rate(n, loop.seconds), mb(loop.maxrss), f"{loop.cpu:.2f}"))
        rows[-1] += ("-", "-", "-", "-")
    return harness.table(BASELINE_HEAD, rows, "lrrrrrllrl")


def client_cpu(job: dict[str, Any]) -> float:
    """CPU of the three chordflow commands of a cluster job."""
    return job["submit"].cpu + job["wait"].cpu + job["results"].cpu


def targets(results: Results) -> str:
    """The targets, each the median of the paired rounds' ratios (their range beside it); the large job's, one
    pair, under them."""
    rows = []
    names = {
        "one": "`run --backend celery --items F --out F` wall / the stock group's",
        "three": "`submit` + `wait` + `results --out` wall / the stock group's",
        "local": "local `run --items` + `results --out` wall / the plain PocketFlow loop's",
    }
    if results.rounds:
        n = results.sizes.small
        per_round = [ratios(r) for r in results.rounds]
        clean = [q for r, q in zip(results.rounds, per_round, strict=True) if quiet(r)]
        for key, name in names.items():
            values = [r[key] for r in per_round]
            middle = statistics.median(values)
            spread = ", ".join(f"{v:.2f}" for v in values)
            calm = (
                f"; the {len(clean)} rounds other processes left alone: {statistics.median(q[key] for q in clean):.2f}x"
                if clean
                else "; no round was left alone by other processes"
            )
            rows.append(
                (
                    f"{n:,} records: {name}",
                    f"**{middle:.2f}x** (median of {len(values)} rounds: {spread}{calm})",
                    f"<= {GOALS[key]:.1f}x",
                    verdict(middle <= GOALS[key]),
                )
            )
        cpu = [r["job"]["worker_cpu"] / r["stock"]["worker_cpu"] for r in results.rounds]
        rows.append(
            (
                f"{n:,} records: worker CPU, chordflow's / the stock group's workers'",
                f"**{statistics.median(cpu):.2f}x** (median; {', '.join(f'{v:.2f}' for v in cpu)})",
                "-",
                "-",
            )
        )
    if results.rounds:
        stock = statistics.median(r["stock"]["child"].seconds for r in results.rounds)
        for job in (j for j in results.jobs if j["chunk_size"] != CHUNK and j["n"] == results.sizes.small):
            for key, wall in (("one", job["one"]["seconds"]), ("three", job["seconds"])):
                rows.append(
                    (
                        f"{job['n']:,} records, `--chunk-size {job['chunk_size']}` (one job, against the median "
                        f"of the rounds' stock group walls, whose chunks stay {STOCK_CHUNK}): {names[key]}",
                        f"{wall:.2f} s / {stock:.2f} s = {wall / stock:.2f}x",
                        "(not a target)",
                        "-",
                    )
                )
    if results.same_chunks:
        same = [pair["one"]["seconds"] / pair["stock"]["child"].seconds for pair in results.same_chunks]
        rows.append(
            (
                f"{results.sizes.small:,} records: {names['one']}, its tasks made {CHUNK:,} records (chordflow's "
                "default chunk for a file of 64,000 records or more) in paired rounds of their own",
                f"**{statistics.median(same):.2f}x** (median of {len(same)} paired rounds: "
                + ", ".join(f"{v:.2f}" for v in same)
                + ")",
                "(not a target)",
                "-",
            )
        )
    big = {j["n"]: j for j in results.jobs if j["chunk_size"] == CHUNK}
    for raw in results.baseline:
        job = big.get(raw["n"])
        if job is None:
            continue
        theirs = raw["child"].seconds
        for key, wall in (("one", job["one"]["seconds"]), ("three", job["seconds"])):
            rows.append(
                (
                    f"{raw['n']:,} records (one pair): {names[key]}",
                    f"{wall:.2f} s / {theirs:.2f} s = **{wall / theirs:.2f}x**",
                    f"<= {GOALS[key]:.1f}x",
                    verdict(wall / theirs <= GOALS[key]),
                )
            )
    if results.noop:
        noop = results.noop
        ratio = noop["chordflow"][0] / noop["loop"][0]
        cpu_ratio = noop["chordflow"][1] / noop["loop"][1]
        first = noop["first"]
        rows.append(
            (
                f"local batch of {noop['n']:,} no-op items / a plain PocketFlow loop keeping the results",
                f"{noop['chordflow'][0]:.3f} s / {noop['loop'][0]:.3f} s = **{ratio:.2f}x** (CPU {cpu_ratio:.2f}x; "
                f"best of 3 rounds each; the first round, with the first call's imports: {first['chordflow'][0]:.3f} "
                f"s / {first['loop'][0]:.3f} s = {first['chordflow'][0] / first['loop'][0]:.2f}x)",
                "<= 3x",
                verdict(ratio <= 3),
            )
        )
    return harness.table(("target", "this run", "goal", "verdict"), rows)


def where_time_goes(results: Results) -> str:
    """The median round's phases on both sides, and what the profiles found (bench/PROFILE_DATASETS.md)."""
    middle = median_round(results)
    if middle is None:
        return "(no paired round)"
    stock, job = middle["stock"], middle["job"]
    p = stock["phases"]
    per_round = [ratios(r) for r in results.rounds]
    medians = {key: statistics.median(q[key] for q in per_round) for key in GOALS}
    missed = [
        f"{MISSED[key]} {medians[key]:.2f}x (goal {GOALS[key]:.1f}x)" for key in GOALS if medians[key] > GOALS[key]
    ]
    plainly = f"**Missed in this run**: {'; '.join(missed)}. Why, below.\n\n" if missed else ""
    return plainly + (
        f"The median round, {job['n']:,} records. The stock group: {stock['child'].seconds:.2f} s = interpreter "
        f"and imports, reading the file {p['read']:.2f} s, building and sending the group {p['send']:.2f} s, "
        f"`GroupResult.get()` {p['get']:.2f} s, writing the rows {p['write']:.2f} s. chordflow's three commands: "
        f"{job['seconds']:.2f} s = `submit` {job['submit'].seconds:.2f} s + `wait` {job['wait'].seconds:.2f} s + "
        f"`results --out` {job['results'].seconds:.2f} s; the one command {job['one']['seconds']:.2f} s. "
        f"Worker CPU: chordflow's {job['worker_cpu']:.2f} s, the stock group's {stock['worker_cpu']:.2f} s.\n\n"
        + FINDINGS
    )


#: What profiling found, by hand (bench/PROFILE_DATASETS.md, "Against a stock Celery group", has the measurements).
FINDINGS = """\
- **The wait phase is the job itself.** `wait` exits about 0.1 s after the last chunk writes the run's final
  status (that write wakes its stream read at once); the job ends when the workers are through with it. It is
  CPU-bound on the 2 cores, shared with the submitting client (0.5-0.6 s of CPU) and redis-server. chordflow's
  workers now spend 1.2-1.5 s of CPU on 100,000 records (12-15 us a record, by load; 2.2-3.4 s before the sixth
  pass of bench/PROFILE_DATASETS.md), the stock group's about 0.9-1.2 s.
- **Per record, in a worker** (`python -m bench.record_profile`): the record loop, 10-11 us on a quiet machine (a
  workflow instance per record: inputs applied and checked, two nodes stepped with their templates, outputs
  resolved), against about 3 us for the stock task's two PocketFlow nodes. A sub-run steps through a driver
  compiled once per flow (`stepper.quiet`), and a chunk's progress is read off its ChunkResult (no hook call and
  no outcome object per successful record).
- **Per chunk, in a worker**: 2.5-5 ms of CPU outside the record loop (`python -m bench.datasets.chunk_profile`:
  the chunk task's body called eagerly; sending the next chunk is the largest part, then the claim, the run record
  and its signature check, the records, outcomes and progress), then Celery's own cost per task (receiving and
  verifying the message, the delivery's fence, the ack): about 5 ms in all beside the records.
- **Chunk size**: the default is now 2,000 records for a file of 64,000 records or more (a 32nd of a smaller
  file, 500 at least, so a small job of slow records still spreads over the workers). At 500 the per-chunk cost
  was a third of a record's: 100,000 records, one command, two workers: worker CPU 2.1-2.3 s at 500 against
  1.4-1.5 s at 2,000; 5,000 saved another 0.1-0.2 s and was not taken (first results, redelivery, fairness).
  The stock group keeps its 500 records a task, as its user wrote it.
- **Prefetch**: chordflow's workers prefetch 1 message; a job keeps 2 chunks per worker process in flight (each
  finished chunk sends the next), one running and one queued per worker, so more prefetch can only save the
  fetch of the queued one (one BRPOP per chunk). Prefetch 2 against 1, four rounds each at load 1-2: no
  difference beyond the noise.
- **Start-ups**: the three commands pay three interpreters and their imports (`submit` ~0.45 s: Celery and
  redis-py 8, which imports its asyncio client, 0.09 s; `wait` and `results` ~0.2 s each), the stock client one
  (Celery, 0.3 s): most of what the three commands take beyond the one command.
- **Local**: the record loop is about 90% of `run --items` (cProfile); the rest is reading the file (0.2 s per
  100,000 lines), one SQLite write per chunk, the start-up. The plain loop runs the two PocketFlow nodes only.
"""


def rounds_table(results: Results) -> str:
    """Each paired round: the stock group and chordflow's forms back to back (their order alternating), the local
    run beside its loop, and what other processes took of the 2 cores meanwhile."""
    rows = []
    for i, r in enumerate(results.rounds, 1):
        stock, job, local = r["stock"], r["job"], r["local"]
        q = ratios(r)
        three = (
            f"{job['seconds']:.2f} ({job['submit'].seconds:.2f} + {job['wait'].seconds:.2f} + "
            f"{job['results'].seconds:.2f})"
        )
        loc = local["child"].seconds + local["results"].seconds
        others = " / ".join(f"{max(0.0, p['cpu_used']['others']):.1f}" for p in (stock, job, job["one"]))
        rows.append(
            (
                i, "stock first" if i % 2 else "chordflow first", f"{stock['child'].seconds:.2f}", three,
                f"**{q['three']:.2f}x**", f"{job['one']['seconds']:.2f}", f"**{q['one']:.2f}x**",
                f"{loc:.2f} / {local['loop'].seconds:.2f}", f"**{q['local']:.2f}x**", others,
            )
        )  # fmt: skip
    head = ("round", "order", "stock group s", "submit + wait + results s", "ratio", "one command s", "ratio")
    head += ("local run + results / loop s", "ratio", "other processes' CPU s (stock / three commands / one)")
    return harness.table(head, rows, "rlrrrrrrrr")


def baseline_phases(results: Results) -> str:
    parts = []
    for run in results.baseline:
        p = run["phases"]
        if p:
            parts.append(
                f"- {run['n']:,} records: reading and decoding the file {p['read']:.2f} s, building and sending the "
                f"group ({-(-run['n'] // STOCK_CHUNK):,} tasks) {p['send']:.2f} s, "
                f"`GroupResult.get()` {p['get']:.2f} s, "
                f"writing the rows to a file {p['write']:.2f} s; the rest of the wall time is the interpreter and "
                f"imports. Results in input order: {p['ok']}. "
                f"CPU of the machine: {run['cpu']}."
            )
    if results.local:
        parts.append(
            f"- Local, {results.local['n']:,} records (`run --items`, `results --out`): CPU of the machine: "
            f"{results.local['cpu']}."
        )
    return "\n".join(parts)


def notes(results: Results) -> list[str]:
    out = []
    jobs = {j["n"]: j for j in results.jobs if j["chunk_size"] == CHUNK}
    large, small = jobs.get(results.sizes.large), jobs.get(results.sizes.small)
    if large and small:
        growth = large["submit"].maxrss - small["submit"].maxrss
        out.append(
            f"- The client's memory does not grow with the file: `chordflow submit` peaks at "
            f"{mb(large['submit'].maxrss)} for {large['n']:,} records and {mb(small['submit'].maxrss)} for "
            f"{small['n']:,} ({growth / 2**20:+.1f} MB for {large['n'] // small['n']}x the records)"
            + (f"; a 1-record job peaks at {mb(results.floor.maxrss)}." if results.floor else ".")
        )
        out.append(
            f"- Redis does grow with the file: the job's peak is {mb(large['redis_sampled'] - large['redis_before'])} "
            f"above the start at {large['n']:,} records, {mb(small['redis_sampled'] - small['redis_before'])} at "
            f"{small['n']:,} (sampled maxima). `submit` stores every chunk of records as it reads them, and "
            "each chunk's outcomes stay until the run expires."
        )
    baselines = {b["n"]: b for b in results.baseline if b["child"].code == 0 and b["phases"].get("ok")}
    if large and large["n"] in baselines:
        raw = baselines[large["n"]]
        out.append(
            f"- Where the time goes at {large['n']:,} records: the workers. chordflow's use "
            f"{large['worker_cpu'] / large['n'] * 1e6:.0f} us of CPU per record (both workers together, "
            f"{large['worker_cpu']:.0f} s over a {large['seconds']:.0f} s job on 2 cores), the baseline's "
            f"{raw['worker_cpu'] / raw['n'] * 1e6:.0f} us: a record of this workflow is a workflow instance "
            "(inputs applied and checked, two nodes stepped with their templates resolved, outputs built), the "
            "baseline's a PocketFlow flow of two nodes (bench/PROFILE_DATASETS.md: where a record's time goes). "
            "The baseline's wall time is its client's: building and sending "
            f"the group takes {raw['phases']['send']:.0f} of its {raw['child'].seconds:.0f} s "
            f"({raw['child'].cpu:.0f} s of client CPU), the workers keeping up; and the client holds every record "
            f"and every result: {mb(raw['child'].maxrss)} against {mb(large['submit'].maxrss)} for `chordflow submit`."
        )
    if not results.resettable:
        out.append("- Worker VmHWM could not be reset between phases: the worker columns are lifetime peaks.")
    return out


def startup_table(results: Results) -> str:
    """The best of 3 runs of each command on a 1-record job: its interpreter start, imports and connections."""
    if not results.startup:
        return "(not measured)"
    lines = [
        "| command (1 record; cluster unless local) | wall s, best of 3 | CPU s | peak RSS |",
        "|---|---:|---:|---:|",
    ]
    for name, child in results.startup.items():
        lines.append(f"| `{name}` | {child.seconds:.3f} | {child.cpu:.3f} | {mb(child.maxrss)} |")
    return "\n".join(lines)


def report(session: Session, results: Results) -> str:
    sizes = results.sizes
    paired = targets(results)
    jobs, baselines, local = shown(results)
    results = dataclasses.replace(results, jobs=jobs, baseline=baselines, local=local)
    large = next((j for j in results.jobs if j["n"] == sizes.large and j["chunk_size"] == CHUNK), None)
    target = (
        f"`chordflow submit` of {sizes.large:,} records peaks at {mb(large['submit'].maxrss)}: "
        f"target < {SUBMIT_RSS_MB} MB: {verdict(large['submit'].maxrss < SUBMIT_RSS_MB * 2**20)}"
        if large
        else f"no job of {sizes.large:,} records in this run (`--small-only`)"
    )
    wf = json.dumps(workflow()["nodes"])
    body = f"""{target}.

## Targets: chordflow against a stock Celery group, paired rounds of this run

{paired}

Each ratio is two figures of one round, taken back to back on the same machine; the machine is shared (the load
averages are under Machine, other processes' CPU in each round below), so the median of all the rounds is judged;
beside it, the median of the rounds in which other processes took under {QUIET_SECONDS} s of CPU in each phase.

{rounds_table(results)}

## Where the time goes

{where_time_goes(results)}

## `chordflow submit WF.json --items FILE` + `chordflow wait RUN` + `chordflow results RUN --out FILE`

The large job, and the median round's job at {sizes.small:,} records.

{jobs_table(results.jobs)}

## Start-up: each command on a 1-record file (paid once per process)

{startup_table(results)}

## Against the stock Celery group, and the local backend

The large pair, and the median round's.

{baseline_table(results)}

{baseline_phases(results)}

{chr(10).join(notes(results))}

## Method

- One `scheduler.localcluster.Cluster`: its own `redis-server` on a free port and two solo workers
  (`celery -A worker.app worker -P {POOL} -c 1`, as `python -m bench`), stopped in a `finally`; beside them,
  on the same redis-server (its database 1, so neither side's workers or control messages see the other's),
  the stock group's two workers, `{shlex.join(results.stock)} -n stockN@HOST` (Celery's defaults: prefetch 4,
  acks on receipt, no signing), killed at the end. Each side's workers sit idle while the other side runs.
- Paired rounds: {sizes.rounds} rounds at {sizes.small:,} records, each the stock group and chordflow's job
  (three commands, then the one command) back to back, the stock group first in odd rounds, chordflow first in
  even ones; then the local run and the plain loop. The targets are the median of the rounds' ratios.
- The workflow: two built-in `echo` nodes per record, `{wf}`, outputs `{{"id": "${{b.n}}"}}`, records
  `{{"id": i, "text": "{TEXT}"}}` one per line (written before any timing). chordflow's jobs at its default
  chunk size ({CHUNK} records), the stock group's tasks of {STOCK_CHUNK} records as its user wrote them.
  An untimed job of {sizes.warm:,} records runs first on each side (the workers' first-chunk costs).
- Before any timing the sources are byte-compiled (`compileall`, as `pip install` does): this machine's
  environment sets PYTHONDONTWRITEBYTECODE=1, under which no command would ever write its `.pyc` and each
  would compile ~120 modules of chordflow's again (0.16 s of CPU per process); bench/ (the stock group's
  module) too.
- Every `chordflow` command is a fresh subprocess (`{shlex.join(harness.chordflow())}`); its wall time includes
  the interpreter start and imports; its peak RSS is GNU time's `%M` (the whole process). `wait --output
  json` is checked: status success, `total` = `done` = N, `failed` = 0. Wall time runs from submit start to
  the exit of `results RUN --out FILE` (every row in the file, as the baseline's client ends with every result);
  `wait`'s exit is given beside it, and the run record's final update (`wait` polls).
- Start-up: after the warm-up job, three rounds of `submit`, `wait --output json` and `results --out` of a
  1-record job on the cluster, `run --items --output json` and `results --out` of one locally, and `python -c
  pass` (the interpreter alone); each command's best round by wall time (its CPU and peak RSS from that round).
- One command: `chordflow run WF --items FILE --backend celery --out FILE --output json`, a fresh process timed
  alone (its own phase, after the three commands' job): it submits, follows the job, and writes each chunk's
  rows as soon as it and every chunk before it finished; the file is checked as below.
- Client CPU: user + system of the client processes (for chordflow, `submit` + `wait` + `results`); worker CPU:
  user + system of both worker processes over the phase, from `/proc/<pid>/stat`. The machine is shared
  with other sessions: "CPU of the machine" is its busy time over the phase (`/proc/stat`) beside what the
  bench's own processes used (workers, redis-server, the CLI processes and this one, reaped children
  included); the rest is other processes' load on the same 2 cores, which slows every phase it lands in.
- Worker peak RSS: VmHWM of both worker processes, reset through `/proc/<pid>/clear_refs` before each
  phase. Redis: `INFO memory` used_memory sampled every 10 ms from submit start to `wait`'s end, and
  used_memory_peak when the phase raised it; "left" is used_memory once `wait` returned, with the run's
  own keys (`cf:{{run}}:*`, `MEMORY USAGE ... SAMPLES 0`). Each phase's keys and the Celery task results
  are deleted before the next phase.
- First readable result (the large job only: it runs a command during the job): a thread polls Redis every
  {POLL * 1000:.0f} ms from submit start, for the new
  run id in `cf:runs` and then the first field of `cf:{{run}}:ds:out` (a finished chunk's outcomes: what
  `results --done` prints); when it appears, `chordflow results RUN --done --out F` runs once to confirm
  that it prints lines (its own start-up is the gap between the two rows). That command runs during the
  job, on the same 2 cores.
- Results: `chordflow results RUN --out FILE` after `wait` returned, a fresh process; the file is
  then read line by line: line i must be `{{"index": i, "result": {{"id": i}}, "error": null}}`.
- The stock group (bench/stock_group.py, `python -m bench.stock_group FILE OUT`, a fresh process, GNU time
  %M): what a user writes by hand, a Celery app in its own module importing no chordflow code (msgpack for
  tasks and results, everything else Celery's defaults). It reads the whole file into a list (`json.loads` per
  line), sends a `group` of one task per {STOCK_CHUNK} records (each runs a PocketFlow `Flow` of two nodes per record
  on a store of its own: `a` puts `{{id, text}}`, `b` puts `{{n: a.id}}`; the task returns `{{id: b.n}}` per
  record), `GroupResult.get()`, and writes the results as the same rows (`json.dumps` per row); the bench then
  checks the file as chordflow's. Its wall time, like chordflow's, includes its interpreter's start and ends
  with every row in a file. Its task results are deleted after each run, as chordflow's keys are.
- Local: `chordflow run WF --items FILE --output json`, one process (the records run in it as it reads
  them), its embedded store in a temp `CHORDFLOW_HOME`, then `chordflow results RUN --out FILE` (the file
  checked as above); their wall times added. And as one command, `chordflow run WF --items FILE --out FILE
  --output json` (each chunk's rows written as it ran, nothing read back). Against it:
  `python -m bench.record_flow FILE OUT`, a fresh process (importing json and pocketflow only) reading the file
  line by line, running the same two-node PocketFlow flow per record and writing the same rows (checked the same way).
- Local no-op batch: `scheduler.run({{"nodes": [{{"id": "b", "type": "noop", "batch": {{"items": "${{items}}"}}}}]}},
  {{"items": [0..N-1]}}, backend="local")` in the bench's process, then, in the same process, bench/variants.py's
  `plain_loop`: PocketFlow's `NoopNode` per item on `dict(shared)` plus the item, each item's namespace kept.
  Three rounds, the two taking turns; each one's best round is judged (garbage collection of a 100,000-item result
  lands in one round or another: a single sample moved the ratio between 1.9x and 3.1x), the first round beside it.
"""
    return harness.document(session, "Dataset jobs at scale: a workflow once per record of a 1,000,000-line file", body)
