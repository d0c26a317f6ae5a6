"""Fair dispatch between runs: how long a 3-item run submitted 4 s into big batches waits, before
(main, exported with `git archive`) and after (this tree), and what fairness costs the big runs.

Before is by default the commit this tree branched from main at (`git merge-base HEAD main`): main itself may
hold other changes (a faster executor) that are not this one's. Scenarios, each on a fresh cluster (its own
redis-server, two solo workers) of the tree under test, the two trees taking turns scenario by scenario so both
see the same machine load:
  alone    one 60,000-item batch of 1 ms items (bench-sleep), nothing else: the big run's cost alone
  small    the same batch, and 4 s after it a 3-item run (normal, then `--priority high`: after only)
  small3   three such batches at once, then the 3-item run (normal, then high)
  noop     1,000,000 no-op items alone: the per-item cost on a quiet cluster (best of 2 per tree: ~5 s runs)
Times are the run records' `updated - created` (written by the cluster). Writes FAIRNESS.md into --out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import Session, arguments, load_average, log, machine_facts

HERE = Path(__file__).parent
REPO = HERE.parents[1]
#: Targets of fair dispatch (seconds, ratio).
SMALL_TARGET, HIGH_TARGET, COST_TARGET = 5.0, 3.0, 1.10


def scenarios(quick: bool) -> list[tuple[str, dict[str, Any]]]:
    n, noop = (6_000, 100_000) if quick else (60_000, 1_000_000)
    return [
        ("alone", {"scenario": "alone", "items": n}),
        ("small", {"scenario": "small", "items": n}),
        ("small high", {"scenario": "small", "items": n, "priority": "high"}),
        ("small3", {"scenario": "small", "items": n, "big": 3}),
        ("small3 high", {"scenario": "small", "items": n, "big": 3, "priority": "high"}),
        ("noop", {"scenario": "alone", "items": noop, "noop": True, "repeat": 2}),
    ]


def export(ref: str, into: Path) -> str:
    """`ref`'s tree into `into` (`merge-base`: where HEAD branched from main); returns its commit."""
    if ref == "merge-base":
        ref = git("merge-base", "HEAD", "main")
    commit = subprocess.run(["git", "rev-parse", ref], cwd=REPO, capture_output=True, text=True, check=True)
    archive = subprocess.Popen(["git", "archive", ref], cwd=REPO, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    archive.wait()
    return commit.stdout.strip()[:10]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def best(tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """`run`, `repeat` times (default once); the run whose slowest big run was fastest."""
    runs = [run(tree, spec) for _ in range(spec.get("repeat", 1))]
    return min(runs, key=lambda r: max(r.get("big_s") or [float("inf")]))


def run(tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """One scenario against `tree`, in a child process started in it (so it and its workers import that tree)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)]), "CHORDFLOW_PLUGINS": ""}
    child = subprocess.run(
        [sys.executable, "-m", "fairness_driver", json.dumps(spec)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if child.returncode != 0:
        return {"error": (child.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(child.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = arguments(
        "bench.fairness", __doc__ or "", "FAIRNESS.md", "6,000 items and 100,000 no-op items instead",
        argv, lambda p: p.add_argument("--before", default="merge-base", help="the git ref measured as before"),
    )  # fmt: skip
    session = Session(args)
    session.facts = machine_facts()
    session.facts["load average at start (1/5/15 min)"] = load_average()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cf-before-") as tmp:
        before = export(args.before, Path(tmp))
        trees = {f"before ({args.before} {before})": Path(tmp), "after (this tree)": REPO}
        for name, spec in scenarios(args.quick):
            for label, tree in trees.items():
                if "priority" in spec and label.startswith("before"):
                    continue  # main has no priorities
                log(f"{name}: {label} ...")
                started = time.monotonic()
                results[f"{name}|{label}"] = best(tree, spec)
                log(f"{name}: {label}: {results[f'{name}|{label}']} ({time.monotonic() - started:.0f} s)")
    session.finish()
    text = report(results, list(trees), session)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "FAIRNESS.md").write_text(text)
    print(text)
    return 0


def report(results: dict[str, dict[str, Any]], labels: list[str], session: Session) -> str:
    before, after = labels

    def get(name: str, label: str) -> dict[str, Any]:
        return results.get(f"{name}|{label}", {})

    def cell(r: dict[str, Any], key: str) -> str:
        if "error" in r:
            return f"error: {r['error']}"
        value = r.get(key)
        if value is None:
            return "-"
        if isinstance(value, list):
            return " / ".join(f"{v:.1f}" for v in value)
        return f"{value:.1f}"

    lines = [
        "# Fair dispatch between runs", "",
        f"Command: `{session.command}` — {session.duration:.0f} s. Two solo workers (2 processes) per scenario, "
        "each scenario on a fresh cluster, before and after taking turns. Seconds from submit to end (run record).",
        "", "| scenario | tree | small run (s) | big run(s) (s) | every index once | load 1-min start / end |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, _spec in scenarios(session.quick):
        for label in labels:
            r = get(name, label)
            if not r:
                continue
            ok = "-" if "error" in r else ("yes" if r.get("big_ok") and r.get("small_ok", True) else "NO")
            load = "-" if "error" in r else f"{r['load_start']:.2f} / {r['load_end']:.2f}"
            lines.append(f"| {name} | {label} | {cell(r, 'small_s')} | {cell(r, 'big_s')} | {ok} | {load} |")
    lines += ["", "## Targets", ""]

    def verdict(value: float | None, target: float, what: str) -> str:
        if value is None:
            return f"- {what}: not measured"
        return f"- {what}: {value:.2f} (target <= {target}): {'PASS' if value <= target else 'FAIL'}"

    def small(name: str) -> float | None:
        return get(name, after).get("small_s")

    def big(name: str, label: str) -> float | None:
        values = get(name, label).get("big_s")
        return max(values) if values else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    lines += [
        verdict(small("small"), SMALL_TARGET, "3-item run behind one big run, after (s)"),
        verdict(small("small high"), HIGH_TARGET, "the same with --priority high (s)"),
        verdict(small("small3"), SMALL_TARGET, "3-item run behind three big runs, after (s)"),
        verdict(small("small3 high"), HIGH_TARGET, "the same with --priority high (s)"),
        verdict(ratio(big("alone", after), big("alone", before)), COST_TARGET, "big run alone, after / before"),
        verdict(ratio(big("small", after), big("alone", after)), COST_TARGET, "big run with the small one / alone"),
        verdict(ratio(big("noop", after), big("noop", before)), COST_TARGET, "1,000,000 no-op items, after / before"),
        "", "## Machine", "",
        *[f"- {k}: {v}" for k, v in session.facts.items()],
    ]  # fmt: skip
    return "\n".join(lines) + "\n"
