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
  resumed             string  when the run was last resumed, by Redis's clock: a chunk that began before it stops
  meta                hash    a client-driven run's description (its backend, status) for `cancel`
  driver              string  a client-driven run's driving process is alive: set with a TTL (DRIVER_LEASE) and
                              renewed while it waits on a batch; gone, aging forgets the run's queued messages
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
  waits               hash    the run's waits (worker/cluster/waits.py): `began:<batch>` -> when a wait began,
                              `released:<batch>` -> the data of the signal that released it
  signals             hash    signals sent to the run and not yet taken by a wait: event -> its data (JSON)
  permits:<batch>     zset    leased item permits (max_concurrent), `<chunk>/<delivery>/<n>` -> lease deadline
  branches:<section>  hash    a parallel section's finished branches; joined:<section> set: the join
  ds, ds:*            ...     a dataset job's chunks, outcomes, counts, claims (worker/cluster/datasets/)
Outside any run:
  cf:runs             zset    run id -> created time (`chordflow runs`)
  cf:{workers}:<host> string  a live worker's pool size, kept alive by its heartbeat
  cf:{windows}        zset    open batch windows, `<run id>|<batch>` -> last activity (fair dispatch's share)
  cf:{limit:<key>}    hash    a rate-limit bucket (worker/cluster/rate_limits.py): tat, tok, iv, iv_at, call_us
  cf:done:<task id>   string  a task that ran to the end on a signed cluster: another delivery of it is skipped
  cf:{queued}         zset    runs with messages sent below the top priority not yet begun: run id -> last send
  cf:{queued}:sweeping string  set NX for one sweep interval: at most one aging sweep starts per interval
  cf:{timers}         zset    waiting runs: `<run id>|<batch>` -> when its next advance is due (0: now, a signal
                              or a cancel came) (worker/cluster/waits.py)
  cf:{timers}:sweeping string set NX for one sweep interval: at most one timer sweep starts per interval
  cf:{answer:<key>}   string  a model answer a node keeps across runs (`cache`), for that long
  cf:{idem:<key>}     string  `<run id> <fingerprint>` of the first submit with this idempotency key (a run TTL)
  cf:{schedules}      hash    schedule name -> its signed template, packed (worker/cluster/state/schedules.py)
  cf:{schedules}:due  zset    active schedules: name -> its next fire time (a paused one has none); each fire
                              claims cf:{idem:schedule:<name>:<fire epoch>}, so it makes one run (schedules.py)
  cf:{schedules}:sweeping string set NX for one sweep interval: at most one schedule sweep starts per interval
  cf:purged:{<run_id>} string a purged run's tombstone, for a run TTL (every message of the run expires before it):
                              a task of the run is ignored, its stop checks stop it, and the scripts that write a
                              run's progress refuse to (outside the run's `cf:{<run_id>}:` prefix, in its slot)

Who owns a run's keys (reads and writes them; `ClusterRuns.trim` and `purge` delete across them all):
  ClusterRuns (worker/cluster/state/runs.py, stateless: every method takes the run id) owns the run's record and
    history: run, overrides, store, trail, steps, undo, chunks:<batch>, branches:<section>, joined:<section>; it
    writes the end marker on `events` and cuts `totals` on a rewind; a run's Lease (worker/cluster/advance.py)
    holds `lease` and `lease:<section>:<branch>` through it.
  RunState (worker/cluster/state/runstate.py, bound to one run) owns what the run's tasks share while it runs:
    cancel, resumed, meta, driver, totals, events, branch_events, chunks, abort:, failed:, dispatched:, result:,
    snap:, permits:<batch>; and through it BatchWindow (windows.py) win:<batch>*, RedisBudget (budget.py) budget
    and RedisAnswers (answers.py) answers.
  Aging (worker/cluster/sending.py records, aging.py sweeps; it reads `driver`): queued, queued_msgs, copies,
    begun.
  ClusterDataset (worker/cluster/datasets/store.py): ds, ds:*.
  RedisWaits (worker/cluster/waits.py): waits, signals, and the run's `waiting` field of `run`.
Every name is built here (`RunKeys`: an attribute per key of a run, a method per family of them) and nowhere else
(tests/test_structure.py checks it); a Lua script gets its keys as KEYS.

Celery's own: the broker's queues and kombu's `unacked`, `unacked_index`; no `celery-task-meta-<task id>` of a
chordflow task (every one ignores its result: nothing reads it).
"""

from __future__ import annotations

from typing import NamedTuple

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
#: Set NX for one sweep interval by the sweeper that sweeps then (worker/cluster/aging.py).
AGING_SWEEP = QUEUED + ":sweeping"
#: Waiting runs, cluster-wide: `<run id>|<batch>` -> when its next advance is due (worker/cluster/waits.py).
TIMERS = "cf:{timers}"
#: Set NX for one sweep interval by the sweeper that fires timers then (worker/cluster/waits.py).
TIMER_SWEEP = TIMERS + ":sweeping"
#: Prefix of the marks of tasks that ran to the end (worker/cluster/signing.py SignedTask); the rest is the task id.
DONE = "cf:done:"
#: Schedules, cluster-wide: name -> its signed template, packed (worker/cluster/state/schedules.py).
SCHEDULES = "cf:{schedules}"
#: The active schedules: name -> when it next fires (worker/cluster/schedules.py sweeps the due ones).
SCHEDULES_DUE = SCHEDULES + ":due"
#: Set NX for one sweep interval by the sweeper that fires schedules then (worker/cluster/schedules.py).
SCHEDULE_SWEEP = SCHEDULES + ":sweeping"


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


def once_key(tag: str, call: str) -> str:
    """Where a Lua script run once per call keeps its reply (worker/cluster/state/once.py): under the hash tag of
    the script's keys (a run's id), so a purge of the run takes it too."""
    return f"cf:{{{tag}}}:once:{call}"


def done_key(task_id: str) -> str:
    """A task's done mark: no hash tag, so the marks of many tasks spread over a Redis Cluster's slots."""
    return DONE + task_id


def idempotency_key(key: str) -> str:
    """The claim of a submit's idempotency key: its own hash tag, so one SET NX decides between concurrent submits."""
    return f"cf:{{idem:{key}}}"


def shared_answer_key(request: str) -> str:
    """A model answer kept across runs (the `llm` node's `cache`), by its request key."""
    return f"cf:{{answer:{request}}}"


class RunKey:
    """A key of a run named by its place after the run's prefix: `RunKeys.<attribute>` is the whole key."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, keys: RunKeys, owner: type) -> str:
        return keys.prefix + self.name


class WindowKeys(NamedTuple):
    """A batch's window (worker/cluster/state/windows.py), `win:<batch>` and its parts."""

    plan: str  # hash: plan id, limits, chunk header, measured items and seconds, priority, `ended`, `error`
    todo: str  # list: the blocks left to do
    pending: str  # hash: chunk start -> the chunk in flight
    out: str  # hash: chunk start -> the finished chunk's outcomes
    items: str  # hash: block start -> its items
    next: str  # hash: delivery -> the chunks its finish claimed
    begun: str  # hash: `<plan>:<chunk start>` -> the task that began the chunk


class DatasetKeys(NamedTuple):
    """A dataset job's keys (worker/cluster/datasets/store.py), `ds` and `ds:<part>`."""

    job: str  # hash: chunk size, records read and written, done, failed, model calls, total, stopped, resent
    todo: str  # list: chunks stored and not yet sent
    pending: str  # set: chunks sent and not finished
    out: str  # hash: chunk -> its outcomes
    cov: str  # hash: chunk -> its items covered
    fails: str  # hash: chunk -> its failed items
    rec: str  # hash: chunk -> its packed records
    next: str  # string: the next chunk to send
    reader: str  # string: the reader's lease, with a TTL
    claim: str  # hash: chunk -> the claim of the delivery that started it last
    started: str  # set: the chunks a task has begun


class RunKeys:
    """Every key of one run (the table above): an attribute per key, a method per family (a batch's, a section's)."""

    run = RunKey("run")  # hash: the run record, its exception, workflow signature, updates, priority
    overrides = RunKey("overrides")  # hash: the batch limits `chordflow update` set
    store = RunKey("store")  # hash: top-level store key -> snapshot-codec bytes
    trail = RunKey("trail")  # list: the nodes completed, in order
    steps = RunKey("steps")  # list: each completed step's [action, config hash, reads hash]
    undo = RunKey("undo")  # hash: `<step>:<key>` -> what the key held before that step
    events = RunKey("events")  # stream: batch progress and the end marker
    branch_events = RunKey("branch_events")  # stream: parallel branches' events
    lease = RunKey("lease")  # string: the advance holding the run
    cancel = RunKey("cancel")  # string: set by `chordflow cancel`
    resumed = RunKey("resumed")  # string: when the run was last resumed, by Redis's clock
    meta = RunKey("meta")  # hash: a client-driven run's description
    driver = RunKey("driver")  # string: a client-driven run's driving process, alive while it lasts
    totals = RunKey("totals")  # hash: batch -> its number of items
    chunk_ids = RunKey("chunks")  # list: a client-driven run's chunk task ids
    queued = RunKey("queued")  # zset: messages sent below the top priority, not yet begun -> when sent
    queued_messages = RunKey("queued_msgs")  # hash: such a message's task id -> the packed message
    copies = RunKey("copies")  # hash: aging's copies: task id -> its message's first id
    begun = RunKey("begun")  # hash: a message's first id -> the delivery that began it
    snapshots = RunKey("snap:")  # prefix of the snapshots (`snapshot`)
    budget = RunKey("budget")  # hash: the run's model-call budget
    answers = RunKey("answers")  # hash: model answers already paid for
    waits = RunKey("waits")  # hash: when each wait began, the data that released it
    signals = RunKey("signals")  # hash: event -> data, until a wait takes it

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.prefix = run_prefix(run_id)  # what every key of the run starts with
        self.tombstone = purged_key(run_id)  # string: the run was purged (outside the prefix, in its slot)

    def branch_lease(self, section: str, branch: str) -> str:  # string: the advance holding a parallel branch
        return f"{self.prefix}lease:{section}:{branch}"

    def abort(self, batch: str) -> str:  # string: the batch stops (fail_fast, a threshold crossed)
        return f"{self.prefix}abort:{batch}"

    def failed(self, batch: str) -> str:  # hash: failures counted against the batch's threshold
        return f"{self.prefix}failed:{batch}"

    def dispatched(self, batch: str) -> str:  # string: the batch was planned
        return f"{self.prefix}dispatched:{batch}"

    def window(self, batch: str) -> WindowKeys:  # the batch's window
        plan = f"{self.prefix}win:{batch}"
        return WindowKeys(plan, *(f"{plan}:{part}" for part in WindowKeys._fields[1:]))

    def result(self, batch: str) -> str:  # string: the merged BatchResult
        return f"{self.prefix}result:{batch}"

    def kept_chunks(self, batch: str) -> str:  # hash: chunk start -> its outcomes, kept as chunks finish
        return f"{self.prefix}chunks:{batch}"

    def snapshot(self, batch: str, digest: str) -> str:  # string: a snapshot too large for each chunk message
        return f"{self.snapshots}{batch}:{digest}"

    def permits(self, batch: str) -> str:  # zset: leased item permits -> lease deadline
        return f"{self.prefix}permits:{batch}"

    def branches(self, section: str) -> str:  # hash: a parallel section's finished branches
        return f"{self.prefix}branches:{section}"

    def joined(self, section: str) -> str:  # set: the branches that joined their section
        return f"{self.prefix}joined:{section}"

    @property
    def dataset(self) -> DatasetKeys:  # a dataset job's keys
        job = self.prefix + "ds"
        return DatasetKeys(job, *(f"{job}:{part}" for part in DatasetKeys._fields[1:]))
