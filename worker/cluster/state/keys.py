"""The Redis keyspace, named once: every key chordflow keeps in its state store.

Every key of a run carries the hash tag `{<run_id>}`, so a Lua script touches one slot and the state can
move to Redis Cluster with runs sharded by id. A run's keys expire with it (CHORDFLOW_RUN_TTL); a run that ends
keeps only what `status`, `results` and a resume read (worker/cluster/state/runs.py `ClusterRuns.trim`, a dataset
job's `ClusterDataset.drop_records`), and `chordflow purge` deletes every key under its hash tag, leaving only the
run's tombstone (`cf:purged:{<run_id>}`, below) so that a task of the run still in flight or delivered later writes
none of them back.

Keys of a run, `cf:{<run_id>}:<name>`; `<batch>` is `<node id>#<step>`:
  run                 hash    the run record (worker/runs/record.py RunRecord), a failed run's exception,
                              `workflow_sig`, its workflow's signature (worker/cluster/signing.py), and `updates`,
                              the changes `chordflow update` made (JSON list of {at, changes}), `priority` (an
                              update's goes here too)
  overrides           hash    the batch limits `chordflow update` set, read by chunks and permits: max_concurrent,
                              tolerated_failure_percent, tolerated_failure_count (lua/update_run.lua)
  store               hash    top-level store key -> snapshot-codec bytes
  trail, steps        list    the nodes completed, in order; each step's [action, config hash, reads hash]
  undo                hash    `<step>:<key>` -> what the key held before that step (`v<bytes>`, or `-`: absent)
  events              stream  batch progress (packed outcomes per chunk) and the end marker `wait` wakes on
  branch_events       stream  parallel branches' events, for `wait --stream`
  lease               string  the advance holding the run, with a TTL (lease:<section>:<branch>: a branch's)
  cancel              string  set by `chordflow cancel`
  meta                hash    a client-driven run's description (its backend, status) for `cancel`
  totals              hash    <batch> -> its number of items
  abort:<batch>       string  a fail_fast failure or a threshold crossed: chunks stop between items
  failed:<batch>      hash    failures counted against the batch's threshold (chunk start -> count, `total`)
  dispatched:<batch>  string  the batch was planned (a redelivered advance does not plan it twice)
  win:<batch>         hash    the batch's window (worker/cluster/state/windows.py); win:<batch>:todo, :pending, :out,
                              :items, :next, :begun: blocks to do, chunks in flight, their outcomes, items,
                              claims, the delivery that began each chunk
  result:<batch>      string  the merged BatchResult, written by `chordflow.aggregate`
  chunks:<batch>      hash    a chunk's start -> its outcomes, kept as chunks finish (resume, `results`)
  chunks              list    a client-driven run's chunk task ids (revoked by `cancel`)
  queued              zset    the run's messages sent below the top priority, not yet begun: task id -> when sent
                              (worker/cluster/aging.py); queued_msgs hash: task id -> the packed message
  copies, begun       hash    aging's copies: task id -> its message's first id; first id -> the delivery that began
  snap:<batch>:<sha>  string  a snapshot too large to travel inside each chunk message
  budget              hash    the run's model-call budget (worker/cluster/state/budget.py): caps, spent, reserved
  answers             hash    model answers already paid for: request key -> answer (worker/llm/answers.py)
  permits:<batch>     zset    leased item permits (max_concurrent), `<chunk>/<delivery>/<n>` -> lease deadline
  branches:<section>  hash    a parallel section's finished branches; joined:<section> set: the join
  ds, ds:*            ...     a dataset job's chunks, outcomes, counts, claims (worker/cluster/datasets/)
Outside any run:
  cf:runs             zset    run id -> created time (`chordflow runs`)
  cf:{workers}:<host> string  a live worker's pool size, kept alive by its heartbeat
  cf:{windows}        zset    open batch windows, `<run id>|<batch>` -> last activity (fair dispatch's share)
  cf:{limit:<key>}    hash    a rate-limit bucket (worker/cluster/rate_limits.py): tat, tok, iv, iv_at
  cf:done:<task id>   string  a task that ran to the end on a signed cluster: another delivery of it is skipped
  cf:{queued}         zset    runs with messages sent below the top priority not yet begun: run id -> last send
  cf:{queued}:sweeping string  set NX for one sweep interval: at most one aging sweep starts per interval
  cf:{answer:<key>}   string  a model answer a node keeps across runs (`cache`), for that long
  cf:{idem:<key>}     string  `<run id> <fingerprint>` of the first submit with this idempotency key (a run TTL)
  cf:purged:{<run_id>} string a purged run's tombstone, for a run TTL (every message of the run expires before it):
                              a task of the run is ignored, its stop checks stop it, and the scripts that write a
                              run's progress refuse to (outside the run's `cf:{<run_id>}:` prefix, in its slot)
Celery's own: the broker's queues and kombu's `unacked`, `unacked_index`; no `celery-task-meta-<task id>` of a
chordflow task (every one ignores its result: nothing reads it).
"""

from __future__ import annotations

#: Every run id, scored by its created time.
RUNS = "cf:runs"
#: Prefix of the worker registry's keys; the rest is the worker's hostname (`w1@host`).
WORKERS = "cf:{workers}:"
#: The batches whose windows are open, cluster-wide: `<run id>|<batch>` -> when one of its chunks last began or
#: finished (worker/cluster/state/windows.py): a batch's window shrinks as more batches share the workers.
WINDOWS = "cf:{windows}"
#: The runs with messages sent below the top priority and not yet begun: run id -> when one was last sent
#: (worker/cluster/aging.py sends again one level up those that waited too long).
QUEUED = "cf:{queued}"
#: Prefix of the marks of tasks that ran to the end (worker/cluster/signing.py SignedTask); the rest is the task id.
DONE = "cf:done:"


def run_prefix(run_id: str) -> str:
    """What every key of a run starts with."""
    return f"cf:{{{run_id}}}:"


def run_key(run_id: str, name: str) -> str:
    """The key `name` (see the table above) of a run."""
    return run_prefix(run_id) + name


def worker_key(hostname: str) -> str:
    return WORKERS + hostname


def limit_key(key: str) -> str:
    """A rate-limit bucket: one per `rate_limit.key`, shared by every run (its own hash tag, its own slot)."""
    return f"cf:{{limit:{key}}}"


def purged_key(run_id: str) -> str:
    """A purged run's tombstone: the run's hash tag (so a Lua script of the run may read it, in the run's Redis Cluster
    slot) but not its prefix (so a purge, which deletes everything under the prefix, keeps it)."""
    return f"cf:purged:{{{run_id}}}"


def done_key(task_id: str) -> str:
    """A task's done mark: no hash tag, so the marks of many tasks spread over a Redis Cluster's slots."""
    return DONE + task_id


def idempotency_key(key: str) -> str:
    """The claim of a submit's idempotency key: its own hash tag, so one SET NX decides between concurrent submits."""
    return f"cf:{{idem:{key}}}"


def shared_answer_key(request: str) -> str:
    """A model answer kept across runs (the `llm` node's `cache`), by its request key."""
    return f"cf:{{answer:{request}}}"
