"""Write the replay corpus of a release tag with that release's own code: `tests/upgrades/<tag>/`.

    .venv/bin/python tests/upgrades/make_corpus.py v0.1.0

checks the tag out in a temporary `git worktree`, runs this script again inside it (cwd and PYTHONPATH the worktree,
so its `ir`, `worker`, `scheduler` and `tests.support` import before this checkout's; the shared .venv has every
dependency) and removes the worktree. Inside, with a redis-server of its own and one `celery` worker of that
release, it writes (beside `commit`, the tag's commit, which the suite checks out):

- `messages.json`: one message of each kind built by the release's `worker/cluster/messages.py` (an advance, a
  branch's advance, a chunk with its items and an aging copy's with its blocks, a bare merge and one with everything,
  a dataset chunk, a batch's header), each with the fields the release reads back from it; and the messages the
  release really sent for the runs below, taken from its broker.
- `runs.json`: every Redis key of three runs (`corpus.PLAIN`, `BATCH`, `DATASET`), what the release reads of each
  (its run record, its store, a dataset job's counts), the messages in flight for it, and what it must end with:
  a plain run of two `test-count` nodes as submitted (its advance queued); an 8-item batch in chunks of 2 frozen
  mid-batch (chunks 0 and 1 merged into the window, chunk 2 running when its worker was stopped, chunk 3 queued);
  a dataset job of 6 records in chunks of 2 as submitted (its 3 chunks queued).

Releasing vX.Y.Z: tag it, then regenerate from the previous tag (`make_corpus.py vX.Y.W`, the one before) and commit
the new folder beside the older ones: the suite (test_replay.py) replays every folder, so each release is checked
against every earlier one whose formats it still reads. Runs in about 15 s.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import corpus  # this folder's module (the script's own directory is first on sys.path)

PLUGINS = "tests.support.nodes,tests.support.counting_nodes"
#: The corpus runs' workflows and inputs, and what each must end with wherever it is finished.
PLAIN_WORKFLOW = {
    "inputs": {"name": {"description": "who"}},
    "nodes": [
        {"id": "one", "type": "test-count", "params": {"key": "corpus:plain", "label": "${name}"}},
        {"id": "two", "type": "test-count", "params": {"key": "corpus:plain", "label": "${one.label}!"}},
    ],
    "outputs": {"said": {"source": "${two.label}"}},
}
BATCH_WORKFLOW = {
    "nodes": [
        {
            "id": "b",
            "type": "test-count",
            "params": {"key": "corpus:batch", "label": "${item}"},
            "batch": {"items": "${items}", "chunk_size": 2},
        },
        {"id": "after", "type": "test-count", "params": {"key": "corpus:batch", "label": "after"}},
    ]
}
RECORD_WORKFLOW = {
    "inputs": {"record": {"description": "one record"}},
    "nodes": [{"id": "work", "type": "test-count", "params": {"key": "corpus:dataset", "label": "r${record.n}"}}],
    "outputs": {"label": {"source": "${work.label}"}},
}
EXPECT = {
    corpus.PLAIN: {"status": "success", "outputs": {"said": "ada!"}, "effects": {"ada": 1, "ada!": 1}},
    # items 0-3 ran before the corpus was taken: a replay runs 4-7 (the stopped chunk and the queued one) and `after`
    corpus.BATCH: {
        "status": "success", "labels": [str(i) for i in range(8)],
        "effects": {**{str(i): 1 for i in range(4, 8)}, "after": 1},
    },
    corpus.DATASET: {
        "status": "success", "outputs": {"total": 6, "done": 6, "failed": 0},
        "rows": [[i, f"r{i}"] for i in range(6)], "effects": {f"r{i}": 1 for i in range(6)},
    },
}  # fmt: skip


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--inside":
        inside(sys.argv[2], Path(sys.argv[3]))
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tag, out = sys.argv[1], corpus.HERE / sys.argv[1]
    out.mkdir(exist_ok=True)
    sha = subprocess.run(["git", "rev-parse", f"{tag}^{{commit}}"], capture_output=True, text=True, check=True)
    (out / "commit").write_text(sha.stdout)
    with corpus.worktree(tag) as tree:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, __file__, "--inside", tag, str(out)], cwd=tree, env=env, check=True)
    print(f"wrote {out}")


def inside(tag: str, out: Path) -> None:
    """Under the release's code (cwd: its worktree): start its cluster, write the corpus to `out`."""
    os.environ["CHORDFLOW_PLUGINS"] = PLUGINS
    import worker

    assert Path(worker.__file__).is_relative_to(Path.cwd()), f"{worker.__file__}: not the {tag} worktree's code"
    from scheduler.localcluster import Cluster

    cluster = Cluster(Path(tempfile.mkdtemp(prefix="corpus-")), plugins=PLUGINS)
    cluster.env["CHORDFLOW_SECRET_KEY"] = corpus.SECRET_KEY
    cluster.apply_env()
    try:
        runs = {corpus.BATCH: mid_batch(cluster)}  # first, with a worker; the other two are left as submitted
        drop_broker(cluster)
        runs[corpus.PLAIN] = submitted(cluster, corpus.PLAIN)
        runs[corpus.DATASET] = submitted(cluster, corpus.DATASET)
        corpus.write(out / "runs.json", {"tag": tag, "runs": runs})
        corpus.write(out / "messages.json", {"tag": tag, "built": built(), "sent": sent_messages(runs, cluster)})
    finally:
        cluster.stop()


def built() -> list[dict[str, Any]]:
    """One message of each kind, built by the release's messages module, with the fields it reads back."""
    from worker.cluster import messages as m

    snap, items = b"\x81\xa4name\xa3ada", [b"\x92\x01\x02", b"\x91\x03"]  # msgpack, as the snapshot codec writes
    node = {"id": "b", "type": "test-count", "params": {"key": "k", "label": "${item}"}, "batch": {"items": "x"}}
    merge = m.Merge("r1", "b#0", "b", 3, True, 0, ("fork", "left"), "cf:{r1}:snap:b#0:ab")
    made = {
        "advance": m.Advance("r1", 4),
        "advance_branch": m.AdvanceBranch("r1", "fork", "left", 2),
        "chunk": m.Chunk("r1", "b#0", node, snap, 0, "plan1", items=items),
        "chunk_copy": m.Chunk("r1", "b#0", node, {"ref": "cf:{r1}:snap:b#0:ab"}, 2, "plan1", blocks=[1]),
        "merge": m.Merge("r1", "b#0", "b", 3, False),
        "merge_full": merge,
        "dataset_chunk": m.DatasetChunk("r1", 7),
    }
    found = [{"kind": k, "wire": list(v.to_wire()), "fields": dataclasses.asdict(v)} for k, v in made.items()]
    header = m.Header(node, snap, merge, "plan1")
    found.append({"kind": "header", "wire": header.to_wire(), "fields": dataclasses.asdict(header)})
    return found


def mid_batch(cluster: Any) -> dict[str, Any]:
    """The 8-item batch on one worker of the release, stopped while chunk 2 runs its item 5 (a `test-count` hold)
    and chunk 3 waits in the queue."""
    import redis

    import scheduler

    r = redis.Redis.from_url(cluster.redis.url)
    worker = cluster.start_worker("old1")
    r.set("corpus:batch:hold:old1:5", 1, ex=300)
    run_id = scheduler.submit(BATCH_WORKFLOW, {"items": list(range(8))}, run_id=corpus.BATCH)
    deadline = time.monotonic() + 60
    while b"old1 5" not in r.lrange("corpus:batch:runs", 0, -1):
        assert time.monotonic() < deadline, "item 5 never started"
        time.sleep(0.05)
    os.killpg(worker.pid, signal.SIGSTOP)  # nothing of it writes while the state is read
    try:
        return taken(cluster, run_id, broker_messages(r))
    finally:
        worker.kill(signal.SIGKILL)


def submitted(cluster: Any, run_id: str) -> dict[str, Any]:
    """A run as the release's `submit` leaves it (no worker running): recorded, its first messages queued."""
    import scheduler

    if run_id == corpus.PLAIN:
        scheduler.submit(PLAIN_WORKFLOW, {"name": "ada"}, run_id=run_id)
    else:
        scheduler.submit(RECORD_WORKFLOW, items=[{"n": i} for i in range(6)], chunk_size=2, run_id=run_id)
    import redis

    found = taken(cluster, run_id, broker_messages(redis.Redis.from_url(cluster.redis.url)))
    drop_broker(cluster)
    return found


def taken(cluster: Any, run_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Every key of the run, the shared ones' entries for it, what the release reads of it, its messages."""
    import redis

    from worker.cluster.datasets.store import ClusterDataset
    from worker.cluster.state.runs import ClusterRuns

    r = redis.Redis.from_url(cluster.redis.url)
    keys = {}
    for key in sorted(r.scan_iter(match=f"cf:{{{run_id}}}:*")):
        keys[key.decode()] = {"type": r.type(key).decode(), "value": value_of(r, key), "ttl": r.pttl(key)}
    shared = {}
    for key in (b"cf:runs", b"cf:{windows}"):
        entries = {m.decode(): s for m, s in r.zrange(key, 0, -1, withscores=True) if run_id in m.decode()}
        if entries:
            shared[key.decode()] = entries
    runs = ClusterRuns()
    record = runs.get(run_id)
    assert record is not None
    reads = {"record": dataclasses.asdict(record), "store": runs.load_store(run_id)}
    if record.dataset:
        reads["counts"] = ClusterDataset(run_id).counts()
    mine = [m for m in messages if m["args"] and (m["args"][0].get("run") == run_id)]
    return {"keys": keys, "shared": shared, "reads": reads, "messages": mine, "expect": EXPECT[run_id]}


def value_of(r: Any, key: bytes) -> Any:
    kind = r.type(key).decode()
    if kind == "string":
        return r.get(key)
    if kind == "hash":
        return {k.decode(): v for k, v in r.hgetall(key).items()}
    if kind == "list":
        return r.lrange(key, 0, -1)
    if kind == "set":
        return sorted(r.smembers(key))
    if kind == "zset":
        return [[m, s] for m, s in r.zrange(key, 0, -1, withscores=True)]
    if kind == "stream":
        return [[i.decode(), {k.decode(): v for k, v in f.items()}] for i, f in r.xrange(key)]
    raise AssertionError(f"{key!r}: a {kind}")


def broker_messages(r: Any) -> list[dict[str, Any]]:
    """Every chordflow task message on the Redis broker: queued (its queue's lists) or held by a worker (`unacked`),
    as task name, task id, where it was and its arguments (the release's wire)."""
    from kombu.serialization import loads

    envelopes = []
    for key in r.scan_iter():
        if key.startswith((b"cf:", b"corpus:")):  # chordflow's state, the test nodes' counts
            continue
        if r.type(key) == b"list":
            envelopes += [("queued", json.loads(raw)) for raw in r.lrange(key, 0, -1)]
        elif key == b"unacked":
            envelopes += [("running", json.loads(raw)[0]) for raw in r.hvals(key)]
    found = []
    for where, envelope in envelopes:
        headers, content_type = envelope["headers"], envelope["content-type"]
        if not str(headers.get("task", "")).startswith("chordflow."):
            continue
        body = base64.b64decode(envelope["body"])
        args, _, _ = loads(body, content_type, envelope["content-encoding"], accept=[content_type])
        found.append({"task": headers["task"], "id": headers["id"], "where": where, "args": list(args)})
    return sorted(found, key=lambda m: (m["task"], str(m["args"])))


def sent_messages(runs: dict[str, Any], cluster: Any) -> list[dict[str, Any]]:
    """The messages the release really sent, with the fields it reads back; and the batch's stored header."""
    import msgpack

    from worker.cluster import messages as m

    kinds = {m.ADVANCE: m.Advance, m.RUN_CHUNK: m.Chunk, m.DATASET_CHUNK: m.DatasetChunk, m.MERGE: m.Merge}
    found = []
    for run in runs.values():
        for message in run["messages"]:
            fields = dataclasses.asdict(kinds[message["task"]].from_wire(*message["args"]))
            found.append({"kind": message["task"], "wire": message["args"], "fields": fields})
        for key, entry in run["keys"].items():
            if key.endswith(":win:b#0") and "header" in entry["value"]:
                wire = msgpack.unpackb(entry["value"]["header"], raw=False)
                fields = dataclasses.asdict(m.Header.from_wire(wire))
                found.append({"kind": "header", "wire": wire, "fields": fields})
    return found


def drop_broker(cluster: Any) -> None:
    """Empty the broker (every key but chordflow's state and the counts): what was in it is recorded with its run."""
    import redis

    r = redis.Redis.from_url(cluster.redis.url)
    for key in list(r.scan_iter()):
        if not key.startswith((b"cf:", b"corpus:")):
            r.delete(key)


if __name__ == "__main__":
    main()
