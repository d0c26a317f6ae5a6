"""DATASETS.md: the jobs side by side, the hand-written Celery client and the local backend beside them, how
each figure was taken."""

from __future__ import annotations

import json
import shlex
from typing import Any

from bench import harness
from bench.datasets import CHUNK, PLUGINS, POLL, RECORDS_TASK, SUBMIT_RSS_MB, TEXT, Results, workflow
from bench.harness import POOL, Session, mb, redis_text, verdict, worker_text


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
            "never seen" if first is None else f"{first:.2f} s after submit start",
        ),
    ]
    if confirm:
        done = f"{confirm['lines']:,} lines, exited {confirm['at']:.2f} s after submit start"
        rows.append(
            (
                "confirmed: `chordflow results RUN --done --out F`, started then",
                f"{done} ({confirm['child'].seconds:.2f} s)",
            )
        )
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
        row = ["hand-written Celery `group` + `GroupResult.get()` + rows to a file", f"{n:,}", *wall, mb(child.maxrss)]
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
    """Issue 22's targets, each a ratio of two figures of this run."""
    jobs = {j["n"]: j for j in results.jobs if j["chunk_size"] == CHUNK}
    baselines = {b["n"]: b for b in results.baseline if b["child"].code == 0 and b["phases"].get("ok")}
    rows = []
    for n in sorted(set(jobs) & set(baselines)):
        job, raw = jobs[n], baselines[n]
        theirs_wall, theirs = raw["child"].seconds, raw["child"].cpu + raw["worker_cpu"]
        in_memory = theirs_wall - raw["phases"]["write"]
        forms = (
            ("`submit` + `wait` + `results --out`", job["seconds"], client_cpu(job) + job["worker_cpu"]),
            ("`run --backend celery --out`", job["one"]["seconds"], job["one"]["child"].cpu + job["one"]["worker_cpu"]),
        )
        for form, wall, mine in forms:
            ratio = wall / theirs_wall
            rows.append(
                (
                    f"cluster, {n:,} records: {form} wall / the Celery group's (rows to a file)",
                    f"{wall:.2f} s / {theirs_wall:.2f} s = **{ratio:.2f}x** (against its results in memory, its "
                    f"wall less writing the file: {wall / in_memory:.2f}x; CPU of clients and workers: {mine:.2f} s / "
                    f"{theirs:.2f} s = {mine / theirs:.2f}x)",
                    "<= 1.0x",
                    verdict(ratio <= 1.0),
                )
            )
        mine, theirs = job["worker_cpu"] / n * 1e6, raw["worker_cpu"] / n * 1e6
        rows.append(
            (
                f"cluster, {n:,} records: worker CPU per record / the Celery group's",
                f"{mine:.1f} us / {theirs:.1f} us = **{mine / theirs:.2f}x**",
                "<= 2x",
                verdict(mine / theirs <= 2),
            )
        )
    if results.local:
        local, loop = results.local, results.local["loop"]
        forms = (
            (
                "`run --items` + `results --out`",
                local["child"].seconds + local["results"].seconds,
                local["child"].cpu + local["results"].cpu,
            ),
            ("`run --items --out`", local["one"].seconds, local["one"].cpu),
        )
        for form, seconds, cpu in forms:
            ratio = seconds / loop.seconds
            rows.append(
                (
                    f"local, {local['n']:,} records: {form} / the plain PocketFlow loop",
                    f"{seconds:.2f} s / {loop.seconds:.2f} s = **{ratio:.2f}x** (CPU: {cpu:.2f} s / "
                    f"{loop.cpu:.2f} s = {cpu / loop.cpu:.2f}x)",
                    "<= 2.0x",
                    verdict(ratio <= 2.0),
                )
            )
    if results.noop:
        noop = results.noop
        ratio = noop["chordflow"][0] / noop["loop"][0]
        cpu = noop["chordflow"][1] / noop["loop"][1]
        first = noop["first"]
        rows.append(
            (
                f"local batch of {noop['n']:,} no-op items / a plain PocketFlow loop keeping the results",
                f"{noop['chordflow'][0]:.3f} s / {noop['loop'][0]:.3f} s = **{ratio:.2f}x** (CPU {cpu:.2f}x; best of"
                f" 3 rounds each; the first round, with the first call's imports: {first['chordflow'][0]:.3f} s /"
                f" {first['loop'][0]:.3f} s = {first['chordflow'][0] / first['loop'][0]:.2f}x)",
                "<= 3x",
                verdict(ratio <= 3),
            )
        )
    table = harness.table(("target", "this run", "goal", "verdict"), rows)
    return (
        f"{table}\n\nThe goals are about wall time; the machine is shared (the load averages are under Machine, and\n"
        '"other processes" in each phase\'s CPU of the machine), so the CPU ratios beside them are the figures\n'
        "another run on a loaded machine moves least."
    )


def baseline_phases(results: Results) -> str:
    parts = []
    for run in results.baseline:
        p = run["phases"]
        if p:
            parts.append(
                f"- {run['n']:,} records: reading and decoding the file {p['read']:.2f} s, building and sending the "
                f"group ({-(-run['n'] // CHUNK):,} tasks) {p['send']:.2f} s, `GroupResult.get()` {p['get']:.2f} s, "
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
    large = next((j for j in results.jobs if j["n"] == sizes.large and j["chunk_size"] == CHUNK), None)
    target = (
        f"`chordflow submit` of {sizes.large:,} records peaks at {mb(large['submit'].maxrss)}: "
        f"target < {SUBMIT_RSS_MB} MB: {verdict(large['submit'].maxrss < SUBMIT_RSS_MB * 2**20)}"
        if large
        else "the large job did not run: **FAIL**"
    )
    wf = json.dumps(workflow()["nodes"])
    body = f"""{target}.

## Targets (issue 22), each two figures of this run

{targets(results)}

## `chordflow submit WF.json --items FILE` + `chordflow wait RUN` + `chordflow results RUN --out FILE`

{jobs_table(results.jobs)}

## Start-up: each command on a 1-record file (paid once per process)

{startup_table(results)}

## Against a hand-written Celery client, and the local backend

{baseline_table(results)}

{baseline_phases(results)}

{chr(10).join(notes(results))}

## Method

- One `scheduler.localcluster.Cluster`: its own `redis-server` on a free port and two solo workers
  (`celery -A worker.app worker -P {POOL} -c 1`, as `python -m bench`), started with
  `CHORDFLOW_PLUGINS={PLUGINS}` (the baseline's task) and stopped in a `finally`. The `chordflow` commands
  run without it.
- The workflow: two built-in `echo` nodes per record, `{wf}`, outputs `{{"id": "${{b.n}}"}}`, records
  `{{"id": i, "text": "{TEXT}"}}` one per line (written before any timing). Default chunk size ({CHUNK}).
  An untimed job of {sizes.warm:,} records runs first (the workers' first-chunk costs).
- Before any timing the sources are byte-compiled (`compileall`, as `pip install` does): this machine's
  environment sets PYTHONDONTWRITEBYTECODE=1, under which no command would ever write its `.pyc` and each
  would compile ~120 modules of chordflow's again (0.16 s of CPU per process); the baseline's client imports
  them too.
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
- First readable result: a thread polls Redis every {POLL * 1000:.0f} ms from submit start, for the new
  run id in `cf:runs` and then the first field of `cf:{{run}}:ds:out` (a finished chunk's outcomes: what
  `results --done` prints); when it appears, `chordflow results RUN --done --out F` runs once to confirm
  that it prints lines (its own start-up is the gap between the two rows). That command runs during the
  job, on the same 2 cores.
- Results: `chordflow results RUN --out FILE` after `wait` returned, a fresh process; the file is
  then read line by line: line i must be `{{"index": i, "result": {{"id": i}}, "error": null}}`.
- The baseline (`python -m bench.datasets --celery-client FILE`, a fresh process, GNU time %M): what a
  user writes by hand. It reads the whole file into a list (`json.loads` per line), sends a Celery
  `group` of one `{RECORDS_TASK}` task per {CHUNK} records (each runs a PocketFlow `Flow` of two nodes per
  record on a store of its own: `a` puts `{{id, text}}`, `b` puts `{{n: a.id}}`; the task returns `{{id: b.n}}`
  per record), then
  `GroupResult.get()`, checks the results are in input order and writes them to a file as the same rows
  (`json.dumps` per row; the file is checked as chordflow's). The file is our choice: chordflow's wall time ends
  with every row in a file, and so does the baseline's; its wall time less the writing (its results in memory
  only) is given beside each cluster target. A stock `Celery` app with worker/app.py's
  config (msgpack, acks_late, prefetch 1, Celery's own RedisBackend), signing its messages as the workers
  require (bench/variants.py does the same).
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
