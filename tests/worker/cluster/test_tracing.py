"""OpenTelemetry traces, received by a loopback OTLP receiver: a cluster run is one trace with one root from
`chordflow submit` to its end, across the client and the workers, every chunk under its batch and every traced item
under its chunk, model calls in the GenAI vocabulary; a chunk delivered again after its worker died says so; a local
run the same in one process; without the variables, no span and no tracing SDK imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduler
from scheduler import api
from scheduler.localcluster import Cluster
from tests.support import llm_server, otlp
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.support.llm_server import Provider
from tests.support.otlp import Receiver, Span
from tests.worker.cluster.faults.test_dead_workers import Counts, batch_workflow
from tests.worker.cluster.faults.test_long_chunks import until
from worker import tracing

ITEMS = 40
FAILING = 7  # the item the second batch node fails on
RATIO = 0.25  # of the items traced


def workflow() -> dict[str, Any]:
    prompts = [f"ticket {i}" for i in range(ITEMS)]
    ask = {"id": "ask", "type": "llm", "params": {"prompt": "${item}", "model": "openai/gpt-test"},
           "batch": {"items": "${items}", "chunk_size": 10, "parallel": True, "max_concurrent": 4}}  # fmt: skip
    check = {"id": "check", "type": "test-fail", "params": {"value": "${item}", "fail_on": prompts[FAILING]},
             "batch": {"items": "${items}", "chunk_size": 10, "error_handling": "continue"}}  # fmt: skip
    return {"nodes": [ask, check], "edges": [{"from": "ask", "to": "check"}], "inputs": {"items": {"default": prompts}}}


@pytest.fixture
@starts("cluster")
def traced(tmp_path: Path) -> Iterator[tuple[Receiver, Provider, Cluster, dict[str, str]]]:
    """A receiver, a loopback provider, and a cluster whose workers export to the receiver; the env a client needs."""
    with otlp.receiving() as receiver, llm_server.serving() as provider:
        env = {**os.environ, **llm_server.environment(provider), **otlp.environment(receiver, items=RATIO)}
        env.pop("CHORDFLOW_LLM_MODEL", None)
        cluster = Cluster(tmp_path, plugins=PLUGINS, base_env=env)
        previous = cluster.apply_env()
        try:
            with pytest.MonkeyPatch.context() as patch:  # `wait` reads the workflow: its model needs a key
                for name, value in llm_server.environment(provider).items():
                    patch.setenv(name, value)
                yield receiver, provider, cluster, {**env, **cluster.env}
        finally:
            cluster.restore_env(previous)
            cluster.stop()


def chordflow(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "scheduler.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


#: What a traced process loads to export spans itself: a `submit` client hands its span over instead.
EXPORTING = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp")


def submitting(env: dict[str, str], path: Path) -> tuple[int, list[str], str]:
    """`chordflow submit path` in a process of its own: its pid, what of EXPORTING it loaded, the run id."""
    code = (
        "import atexit, os, sys; from scheduler.cli import main;"
        f"atexit.register(lambda: print(os.getpid(), sorted(m for m in sys.modules if m.startswith({EXPORTING!r}))));"
        f"sys.argv = ['chordflow', 'submit', {str(path)!r}]; main()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    *printed, exited = done.stdout.strip().splitlines()
    pid, loaded = exited.split(" ", 1)
    return int(pid), json.loads(loaded.replace("'", '"')), printed[-1].split()[-1]


def named(spans: list[Span], prefix: str) -> list[Span]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_a_cluster_run_is_one_trace_across_the_client_and_the_workers(
    traced: tuple[Receiver, Provider, Cluster, dict[str, str]], tmp_path: Path
) -> None:
    receiver, provider, cluster, env = traced
    cluster.start_worker("t1")
    cluster.start_worker("t2")
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(workflow()))
    client, loaded, run_id = submitting(env, path)
    assert loaded == [], "the submit client loaded the tracing SDK or the exporter"
    done = api.wait(run_id, timeout=120)
    assert done.status == "success", done.error
    assert done.shared["check"]["error_count"] == 1

    # every span of the run: itself, submit, 4 steps, 2 batches, 8 chunks, the sampled and the failed items, 40 calls
    threshold = int(RATIO * tracing.SPAN)
    items = sum(tracing.picked(i, threshold) for i in range(ITEMS)) * 2 + (not tracing.picked(FAILING, threshold))
    spans = receiver.until(lambda spans: len(spans) >= 16 + items + ITEMS)
    assert len(spans) == 16 + items + ITEMS, sorted(Counter(s.name for s in spans).items())
    (root,) = [s for s in spans if not s.parent]
    assert root.name == "chordflow run" and root.attributes["chordflow.status"] == "succeeded"
    assert {s.trace for s in spans} == {root.trace}  # one trace
    assert {s.attributes.get("chordflow.run_id") for s in spans} == {run_id}
    by_id = {s.span: s for s in spans}
    assert all(s.parent in by_id for s in spans if s.parent), "a span whose parent never arrived"

    def parent(s: Span) -> Span:
        return by_id[s.parent]

    (submit,) = named(spans, "chordflow submit")
    assert parent(submit) is root and submit.pid == client != root.pid  # the client's span; the run ended on a worker
    assert submit.start >= root.start and submit.end >= submit.start
    steps = named(spans, "step ")
    assert sorted(s.name for s in steps) == ["step ask", "step ask", "step check", "step check"]  # dispatch, resume
    assert all(parent(s) is root for s in steps)
    for node in ("ask", "check"):
        (batch,) = named(spans, f"batch {node}")
        assert parent(batch).name == f"step {node}" and batch.attributes["chordflow.items"] == ITEMS
        chunks = [s for s in named(spans, f"chunk {node}") if parent(s) is batch]
        assert sorted(c.attributes["chordflow.chunk.start"] for c in chunks) == [0, 10, 20, 30]
        assert not any(c.attributes["chordflow.delivery.again"] or c.attributes["chordflow.delivery.redelivered"]
                       for c in chunks)  # fmt: skip
    assert len({s.pid for s in spans}) >= 2  # the client's, and the workers' processes
    items = named(spans, "item ")
    assert all(parent(i).name == f"chunk {i.attributes['chordflow.node']}" for i in items)
    assert parent(parent(items[0])).name.startswith("batch ")
    sampled = Counter(i.attributes["chordflow.node"] for i in items if not i.error)
    assert 0 < sampled["ask"] < ITEMS  # a share of the items, not all, not none
    (failed,) = [i for i in items if i.error]  # the one failed item, sampled or not
    assert failed.attributes == {**failed.attributes, "chordflow.node": "check", "chordflow.index": FAILING}
    chats = named(spans, "chat gpt-test")
    assert len(chats) == ITEMS and all(parent(c).name in ("item ask", "chunk ask") for c in chats)
    for chat in chats:
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.request.model"] == "gpt-test"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0 and chat.attributes["gen_ai.usage.output_tokens"] > 0
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats) == provider.input_tokens


@pytest.mark.processes
def test_a_local_run_is_one_trace_in_one_process(tmp_path: Path) -> None:
    with otlp.receiving() as receiver, llm_server.serving() as provider:
        env = {**os.environ, **llm_server.environment(provider), **otlp.environment(receiver, items=1),
               "CHORDFLOW_HOME": str(tmp_path / "home"), "CHORDFLOW_PLUGINS": PLUGINS}  # fmt: skip
        env.pop("CHORDFLOW_LLM_MODEL", None)
        path = tmp_path / "wf.json"
        path.write_text(json.dumps(workflow()))
        chordflow(env, "run", str(path))
        spans = receiver.until(lambda spans: bool(named(spans, "chordflow run")))
    (root,) = [s for s in spans if not s.parent]
    by_id = {s.span: s for s in spans}
    assert root.name == "chordflow run" and len({s.pid for s in spans}) == 1 and len({s.trace for s in spans}) == 1
    assert len(named(spans, "item ask")) == ITEMS and len(named(spans, "item check")) == ITEMS  # a ratio of 1
    assert [s.attributes["chordflow.index"] for s in named(spans, "item check") if s.error] == [FAILING]
    assert all(by_id[c.parent].name == "item ask" for c in named(spans, "chat"))
    assert all(by_id[b.parent].name == f"step {b.name.split()[1]}" for b in named(spans, "batch "))


@pytest.mark.processes
def test_without_the_variables_nothing_is_traced_and_the_tracing_sdk_is_not_imported(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {"CHORDFLOW_HOME": str(tmp_path), "CHORDFLOW_PLUGINS": PLUGINS}
    checked = {**workflow(), "nodes": workflow()["nodes"][1:], "edges": []}
    code = (
        "import json, sys; from scheduler import api; from worker import tracing;"
        f"r = api.run(json.loads({json.dumps(json.dumps(checked))}));"
        "print(tracing.ON, r.status, sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk.trace')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split(None, 2) == ["False", "success", "[]\n"], done.stderr


@pytest.mark.faults
@pytest.mark.processes
def test_a_chunk_delivered_again_after_its_worker_was_killed_says_so_in_its_span(tmp_path: Path) -> None:
    with otlp.receiving() as receiver:
        env = {**os.environ, **otlp.environment(receiver)}
        # a dead delivery comes back within 10 s; a live one under load is renewed well within that
        cluster = Cluster(tmp_path, visibility_timeout=10, plugins=f"{PLUGINS},tests.support.counting_nodes",
                          base_env=env)  # fmt: skip
        previous = cluster.apply_env()
        try:
            counts = Counts(cluster)
            path = tmp_path / "wf.json"
            path.write_text(json.dumps({**batch_workflow(counts, seconds=0.5, chunk_size=3),
                                        "inputs": {"items": {"default": list(range(6))}}}))  # fmt: skip
            first = cluster.start_worker("k1")
            run_id = chordflow({**env, **cluster.env}, "submit", str(path)).split()[-1]
            until(lambda: counts.started_by("k1"), 60, "k1 to start an item")
            killed = counts.started_by("k1")[0] // 3 * 3  # the chunk k1 was running
            first.kill()
            cluster.start_worker("k2")
            done = scheduler.wait(run_id, timeout=120)
            assert done.status == "success", done.error
            spans = receiver.until(lambda spans: bool(named(spans, "chordflow run")))
        finally:
            cluster.restore_env(previous)
            cluster.stop()
    again = [s for s in named(spans, "chunk b") if s.attributes["chordflow.chunk.start"] == killed]
    shown = [s.attributes for s in named(spans, "chunk b")]
    assert [s.attributes["chordflow.delivery.again"] for s in again] == [True], shown  # the killed one never ended
    (batch,) = named(spans, "batch b")
    assert again[0].parent == batch.span and again[0].trace == batch.trace


@pytest.mark.processes
def test_an_item_span_records_what_code_inside_the_item_sets_on_it_and_parents_its_children() -> None:
    code = """if True:
        from opentelemetry import trace
        from worker import tracing
        with tracing.within("r1"), tracing.span("chunk n"):
            with tracing.item("n", 3) as on:
                trace.get_current_span().set_attribute("user.note", "kept")
                trace.get_current_span().set_attribute("user.odd", object())  # cleaned as the SDK cleans it
                trace.get_current_span().add_event("user.event")
                with tracing.span("chat m"):
                    pass
                tracing.failed(on, "ValueError: bad item")
            try:
                with tracing.item("n", 4):
                    raise KeyError("k")
            except KeyError:
                pass
        tracing.flush()
    """
    with otlp.receiving() as receiver:
        env = {**os.environ, **otlp.environment(receiver)}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        spans = receiver.until(lambda spans: len(spans) >= 4)
    by_name = {s.name: s for s in spans if s.name != "item n"}
    first, second = sorted(named(spans, "item n"), key=lambda s: s.attributes["chordflow.index"])
    assert first.attributes == {"chordflow.run_id": "r1", "chordflow.node": "n", "chordflow.index": 3,
                                "user.note": "kept", "user.odd": None}  # fmt: skip
    assert first.error and first.parent == by_name["chunk n"].span and first.trace == by_name["chunk n"].trace
    assert by_name["chat m"].parent == first.span and first.start <= by_name["chat m"].start <= first.end
    assert second.error and not by_name["chunk n"].error  # the exception left the item: its span says so
