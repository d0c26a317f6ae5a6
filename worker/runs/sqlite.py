"""The embedded store of local runs: run records, checkpoints and cut-short batches in SQLite.

One file, `$CHORDFLOW_HOME/runs.db` (default `~/.chordflow`). A checkpoint is one transaction that
writes only the top-level keys a node changed, fenced on the step number so a stale writer changes
nothing. Values are stored with the snapshot codec; a value it cannot encode is recorded as such, and
only resuming that run needs it. Each record keeps the process that drives it (worker/runs/owner.py): a run
whose owner is gone reads as failed. Each step's trail entry keeps the node's action and hashes
(worker/engine/config_hash.py), and an undo log keeps what the keys a step overwrote held before, so a resume
with an edited workflow can take the run back to before its first changed node (`rewind`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ir import snapshot
from ir.errors import SnapshotError, StoreDiskError, StoreFull, Unrecoverable
from worker import settings
from worker.batch.aggregate import ChunkResult
from worker.batch.rows import Row, rows_of_aggregate, rows_of_chunks
from worker.engine.steps import Step
from worker.runs.owner import Owner, current_owner
from worker.runs.record import FINAL, RunRecord, TrailStep, trail_action
from worker.waits import Waiting, sleep

COLUMNS = "run_id, workflow, backend, status, node, step, error, created, updated, source, batches, dataset, format"
#: What a record is read as: its columns, what its `wait` node waits for (if it waits), and its owner (last).
READ = f"{COLUMNS}, (SELECT waiting FROM waits WHERE waits.run_id = runs.run_id AND waiting IS NOT NULL), owner"
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, workflow TEXT NOT NULL, backend TEXT NOT NULL, status TEXT NOT NULL,
  node TEXT, step INTEGER NOT NULL, error TEXT, created REAL NOT NULL, updated REAL NOT NULL,
  source TEXT, batches TEXT NOT NULL DEFAULT '{}', dataset TEXT, owner TEXT, format INTEGER);
CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created);
CREATE TABLE IF NOT EXISTS store (run_id TEXT, key TEXT, value BLOB, type TEXT, PRIMARY KEY (run_id, key));
CREATE TABLE IF NOT EXISTS trail (run_id TEXT, step INTEGER, node TEXT, action TEXT, config TEXT, reads TEXT,
  keys TEXT, PRIMARY KEY (run_id, step));
CREATE TABLE IF NOT EXISTS undo (run_id TEXT, step INTEGER, key TEXT, value BLOB, type TEXT,
  PRIMARY KEY (run_id, step, key));
CREATE TABLE IF NOT EXISTS chunks (run_id TEXT, batch TEXT, start INTEGER, value BLOB,
  PRIMARY KEY (run_id, batch, start));
CREATE TABLE IF NOT EXISTS branches (run_id TEXT, section TEXT, branch TEXT, value BLOB,
  PRIMARY KEY (run_id, section, branch));
CREATE TABLE IF NOT EXISTS answers (run_id TEXT, key TEXT, value TEXT, PRIMARY KEY (run_id, key));
CREATE TABLE IF NOT EXISTS kept_answers (key TEXT PRIMARY KEY, value TEXT, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS waits (run_id TEXT, key TEXT, began REAL NOT NULL, waiting TEXT, released TEXT,
  PRIMARY KEY (run_id, key));
CREATE TABLE IF NOT EXISTS signals (run_id TEXT, event TEXT, data TEXT, PRIMARY KEY (run_id, event));
"""


#: SQL for the step number of a batch key (`<node id>#<step>`) held in `column`.
_STEP_OF = "CAST(substr({column}, instr({column}, '#') + 1) AS INTEGER)"


def home() -> Path:
    return settings.get("home") or Path.home() / ".chordflow"


class LocalRuns:
    """Run records and checkpoints of local runs (a RunStore, worker/runs/store.py). Thread-safe; one
    connection per process and file."""

    #: A local run is driven by the process running it.
    durable = False

    _open: dict[Path, LocalRuns] = {}
    _open_lock = threading.Lock()

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        with self.writing():
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            columns = {row[1] for row in self.db.execute("PRAGMA table_info(runs)")}
            for column in ("dataset", "owner", "format"):  # a file from before
                if column not in columns:
                    self.db.execute(f"ALTER TABLE runs ADD COLUMN {column} TEXT")
            trail = {row[1] for row in self.db.execute("PRAGMA table_info(trail)")}
            for column in ("action", "config", "reads", "keys"):  # a file from before step hashes
                if column not in trail:
                    self.db.execute(f"ALTER TABLE trail ADD COLUMN {column} TEXT")

    @classmethod
    def default(cls) -> LocalRuns:
        path = home() / "runs.db"
        with cls._open_lock:
            if path not in cls._open:
                cls._open[path] = cls(path)
            return cls._open[path]

    @property
    def where(self) -> str:
        return str(self.path)

    @contextlib.contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """Hold the store for a write (every write path goes through here): a transaction left open by an
        error is rolled back, and a full or failing disk is raised as StoreFull / StoreDiskError naming the
        file (`<CHORDFLOW_HOME>/runs.db: disk full`) instead of SQLite's words, which name none."""
        with self.lock:
            try:
                yield self.db
            except BaseException as exc:
                if self.db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and (disk := _disk_error(exc, self.path)) is not None:
                    raise disk from exc
                raise

    # -- records ------------------------------------------------------------------------------------
    def create(self, record: RunRecord, store: Mapping[str, Any], encoded: Mapping[str, bytes] | None = None) -> None:
        now = time.time()
        record.created = record.updated = now
        with self.writing():
            self.db.execute("BEGIN")
            self.db.execute(
                f"INSERT INTO runs ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (record.run_id, json.dumps(record.workflow), record.backend, record.status, record.node,
                 record.step, record.error, now, now, record.source, "{}",
                 json.dumps(record.dataset) if record.dataset else None, record.format),
            )  # fmt: skip
            self._own(record.run_id)
            self._write_keys(record.run_id, dict(store), [])
            if encoded:
                rows = [(record.run_id, str(key), value, None) for key, value in encoded.items()]
                self.db.executemany("INSERT OR REPLACE INTO store VALUES (?,?,?,?)", rows)
            self.db.execute("COMMIT")

    def get(self, run_id: str) -> RunRecord | None:
        with self.lock:
            row = self.db.execute(
                f"SELECT {READ} FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
        return self._alive(row) if row else None

    def recent(self, status: str | None = None, limit: int = 20) -> list[RunRecord]:
        with self.lock:  # the unfinished runs first (a few): one whose owner is gone is recorded failed
            unfinished = self.db.execute(
                f"SELECT {READ} FROM runs WHERE status NOT IN ({','.join('?' * len(FINAL))})", FINAL
            ).fetchall()
        for row in unfinished:
            self._alive(row)
        query = f"SELECT {READ} FROM runs"
        args: tuple[Any, ...] = ()
        if status:
            query, args = query + " WHERE status = ?", (status,)
        with self.lock:
            rows = self.db.execute(query + " ORDER BY created DESC LIMIT ?", (*args, limit)).fetchall()
        return [_record(row) for row in rows]

    def _own(self, run_id: str) -> None:
        """Make this process the run's owner (on creating it, and on setting it running: `resume`, `redrive`)."""
        me = current_owner()
        self.db.execute(
            "UPDATE runs SET owner = ? WHERE run_id = ?", (json.dumps([me.pid, me.host, me.started]), run_id)
        )

    def _alive(self, row: tuple[Any, ...]) -> RunRecord:
        """The record of `row`; an unfinished run whose owner is gone is recorded failed first (only if it still
        has that owner: a resume may have taken it over since it was read)."""
        record, held = _record(row), row[-1]
        if record.status in FINAL or held is None or not (gone := Owner(*json.loads(held))).gone():
            return record
        record.status, record.error, record.updated = "failed", gone.why(), time.time()
        update = "UPDATE runs SET status = ?, error = ?, updated = ? WHERE run_id = ? AND owner = ? AND status = ?"
        args = (record.status, record.error, record.updated, record.run_id, held, row[3])
        with self.writing():
            self.db.execute(update, args)
        return record

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        with self.lock:
            rows = self.db.execute(
                "SELECT run_id FROM runs WHERE substr(run_id, 1, ?) = ? LIMIT ?", (len(prefix), prefix, limit)
            ).fetchall()
        return [row[0] for row in rows]

    def exception(self, run_id: str) -> tuple[str, str, str] | None:
        """None: a local run's exception reaches its caller directly, in the process that ran it."""
        return None

    def owner(self, run_id: str) -> Owner | None:
        with self.lock:
            row = self.db.execute("SELECT owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return Owner(*json.loads(row[0])) if row and row[0] else None

    def set_status(self, run_id: str, status: str, error: str | None = None, node: str | None = None) -> None:
        with self.writing():
            self.db.execute(
                "UPDATE runs SET status = ?, error = ?, node = COALESCE(?, node), updated = ? WHERE run_id = ?",
                (status, error, node, time.time(), run_id),
            )
            if status == "running":
                self._own(run_id)
            if status == "succeeded":  # only a resume reads the branches kept mid-section
                self.db.execute("DELETE FROM branches WHERE run_id = ?", (run_id,))

    def purge(self, run_id: str) -> None:
        """Every row of the run, in one transaction: each table with a `run_id` column, so also the tables other
        modules keep in this file (a dataset job's, worker/datasets/sqlite.py) without naming them here."""
        with self.writing():
            tables = [name for (name,) in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            self.db.execute("BEGIN")
            for table in tables:
                if "run_id" in {row[1] for row in self.db.execute(f'PRAGMA table_info("{table}")')}:
                    self.db.execute(f'DELETE FROM "{table}" WHERE run_id = ?', (run_id,))
            self.db.execute("COMMIT")

    # -- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, run_id: str, step: int, result: Step, batch: dict[str, int] | None = None) -> bool:
        """Record one finished step; False (nothing written) when the run is no longer at `step`."""
        with self.writing():
            self.db.execute("BEGIN")
            moved = self.db.execute(
                "UPDATE runs SET step = ?, node = ?, status = 'running', updated = ? WHERE run_id = ? AND step = ?",
                (step + 1, result.next_node, time.time(), run_id, step),
            ).rowcount
            if not moved:
                self.db.execute("ROLLBACK")
                return False
            touched = [*map(str, result.changed), *result.deleted]
            self._log_undo(run_id, step, [key for key in touched if key not in result.created])
            self._write_keys(run_id, result.changed, result.deleted)
            entry = (result.node, trail_action(result.action), result.config, result.reads, json.dumps(touched))
            self.db.execute(
                "INSERT OR REPLACE INTO trail (run_id, step, node, action, config, reads, keys) VALUES (?,?,?,?,?,?,?)",
                (run_id, step, *entry),
            )
            if batch is not None:  # its aggregate is in the store now: the outcomes it kept as it ran go
                self.db.execute("DELETE FROM chunks WHERE run_id = ? AND batch = ?", (run_id, f"{result.node}#{step}"))
                self._set_batch(run_id, result.node, batch)
            self.db.execute("COMMIT")
            return True

    def _set_batch(self, run_id: str, node: str, counts: dict[str, int]) -> None:
        """The record's `batches` entry of `node`: {total, done, failed}."""
        self.db.execute(
            "UPDATE runs SET batches = json_set(batches, '$.' || json_quote(?), json(?)) WHERE run_id = ?",
            (node, json.dumps(counts), run_id),
        )

    def _write_keys(self, run_id: str, changed: Mapping[str, Any], deleted: list[str]) -> None:
        rows = []
        for key, value in changed.items():
            try:
                rows.append((run_id, str(key), snapshot.encode(value, label=str(key)), None))
            except SnapshotError:
                rows.append((run_id, str(key), None, type(value).__name__))
        self.db.executemany("INSERT OR REPLACE INTO store VALUES (?,?,?,?)", rows)
        if deleted:
            self.db.executemany("DELETE FROM store WHERE run_id = ? AND key = ?", [(run_id, k) for k in deleted])

    def _log_undo(self, run_id: str, step: int, keys: list[str]) -> None:
        """Keep what the keys a step is about to overwrite or delete held before it, so `rewind` can take
        the store back to before that step (a key the trail lists without an undo row was absent). Copied
        inside SQLite, nothing encoded; a step writing only new keys (a node's namespace, the first time
        it runs) copies nothing and costs no statement."""
        copy = "INSERT OR IGNORE INTO undo SELECT run_id, ?, key, value, type FROM store WHERE run_id = ? AND key "
        if len(keys) == 1:  # the usual step: one key, looked up directly (no JSON to build and parse)
            self.db.execute(copy + "= ?", (step, run_id, keys[0]))
        elif keys:
            self.db.execute(copy + "IN (SELECT value FROM json_each(?))", (step, run_id, json.dumps(keys)))

    def load_store(self, run_id: str) -> dict[str, Any]:
        with self.lock:
            rows = self.db.execute("SELECT key, value, type FROM store WHERE run_id = ?", (run_id,)).fetchall()
        store: dict[str, Any] = {}
        for key, value, kind in rows:
            if value is None:
                raise Unrecoverable(f"run {run_id}: the store key '{key}' (a {kind}) could not be checkpointed")
            store[key] = snapshot.decode(value)
        return store

    def load_key(self, run_id: str, key: str) -> Any:
        with self.lock:
            row = self.db.execute("SELECT value FROM store WHERE run_id = ? AND key = ?", (run_id, key)).fetchone()
        return None if row is None or row[0] is None else snapshot.decode(row[0])

    def trail(self, run_id: str) -> list[str]:
        """The nodes completed so far, in step order."""
        with self.lock:
            rows = self.db.execute("SELECT node FROM trail WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
        return [row[0] for row in rows]

    # -- model answers already paid for (worker/llm/answers.py) ----------------------------------------------------
    def answers(self, run_id: str) -> LocalAnswers:
        return LocalAnswers(self, run_id)

    # -- waits and signals (worker/waits.py) ---------------------------------------------------------------------
    def waits(self, run_id: str) -> LocalWaits:
        return LocalWaits(self, run_id)

    def signal(self, run_id: str, event: str, data: Any) -> None:
        """Keep `event` with its data until a wait of the run takes it (its process looks every POLL_SECONDS)."""
        with self.writing() as db:
            db.execute("INSERT OR REPLACE INTO signals VALUES (?,?,?)", (run_id, event, json.dumps(data)))

    # -- branches of a parallel section that has not reached its fan-in (worker/engine/sections.py) -------------
    def save_branch(self, run_id: str, section: str, branch: str, value: bytes) -> None:
        with self.writing():
            self.db.execute("INSERT OR REPLACE INTO branches VALUES (?,?,?,?)", (run_id, section, branch, value))

    def load_branches(self, run_id: str, section: str) -> dict[str, Any]:
        with self.lock:
            rows = self.db.execute(
                "SELECT branch, value FROM branches WHERE run_id = ? AND section = ?", (run_id, section)
            ).fetchall()
        return {branch: snapshot.decode(value) for branch, value in rows}

    def steps(self, run_id: str) -> list[TrailStep]:
        """The steps completed so far, in order, with their actions and hashes."""
        with self.lock:
            rows = self.db.execute(
                "SELECT node, action, config, reads FROM trail WHERE run_id = ? ORDER BY step", (run_id,)
            ).fetchall()
        return [TrailStep(*row) for row in rows]

    # -- the primitives of `rewind` (worker/runs/store.py) ------------------------------------------------
    def undo_from(self, run_id: str, step: int) -> dict[str, Any]:
        first: dict[str, int] = {}  # each key touched from `step` on -> the first step that touched it
        with self.lock:
            for at, keys in self.db.execute(
                "SELECT step, keys FROM trail WHERE run_id = ? AND step >= ? ORDER BY step", (run_id, step)
            ):
                for key in json.loads(keys or "[]"):
                    first.setdefault(key, at)
            return {
                key: self.db.execute(
                    "SELECT value, type FROM undo WHERE run_id = ? AND step = ? AND key = ?", (run_id, at, key)
                ).fetchone()
                for key, at in first.items()
            }

    def cut(self, run_id: str, step: int, before: dict[str, Any]) -> None:
        with self.writing():  # rolled back on any error
            self.db.execute("BEGIN")
            for key, old in before.items():
                if old is None:  # absent before that step
                    self.db.execute("DELETE FROM store WHERE run_id = ? AND key = ?", (run_id, key))
                else:
                    self.db.execute("INSERT OR REPLACE INTO store VALUES (?,?,?,?)", (run_id, key, *old))
            for table in ("undo", "trail"):
                self.db.execute(f"DELETE FROM {table} WHERE run_id = ? AND step >= ?", (run_id, step))
            for table, column in (("chunks", "batch"), ("branches", "section")):  # keyed `<node>#<step>`
                where = f"run_id = ? AND {_STEP_OF.format(column=column)} >= ?"
                self.db.execute(f"DELETE FROM {table} WHERE {where}", (run_id, step))
            self.db.execute("UPDATE runs SET step = ?, updated = ? WHERE run_id = ?", (step, time.time(), run_id))
            self.db.execute("COMMIT")

    def set_workflow(self, run_id: str, workflow: dict[str, Any], source: str | None, node: str | None) -> None:
        """Give a run an edited workflow and the node it goes on with (None: the flow has ended)."""
        with self.writing():
            self.db.execute(
                "UPDATE runs SET workflow = ?, source = COALESCE(?, source), node = ?, updated = ? WHERE run_id = ?",
                (json.dumps(workflow), source, node, time.time(), run_id),
            )

    # -- batches cut short --------------------------------------------------------------------------
    def save_chunks(
        self, run_id: str, batch: str, chunks: list[ChunkResult], counts: dict[str, int] | None = None
    ) -> None:
        """Keep outcomes of a batch still running; `counts` ({total, done, failed} so far) go in the record's
        `batches`, which `status` and `runs` show (the step's checkpoint writes the final ones)."""
        rows = [(run_id, batch, c.start, snapshot.encode(c.to_wire())) for c in chunks if c.results]
        with self.writing():
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR REPLACE INTO chunks VALUES (?,?,?,?)", rows)
            if counts is not None:
                self._set_batch(run_id, batch.rsplit("#", 1)[0], counts)
            self.db.execute("COMMIT")

    def saved_chunks(self, run_id: str, batch: str) -> list[ChunkResult]:
        with self.lock:
            rows = self.db.execute(
                "SELECT value FROM chunks WHERE run_id = ? AND batch = ? ORDER BY start", (run_id, batch)
            ).fetchall()
        return [ChunkResult.from_wire(snapshot.decode(row[0])) for row in rows]

    def batch_rows(self, run_id: str, node: str) -> Iterator[Row]:
        """The items of node's batch, streamed from the stored aggregate (or, for a batch cut short, from
        the chunks it kept); LookupError when the node has no batch results."""
        with self.lock:
            found = self.db.execute(
                "SELECT rowid FROM store WHERE run_id = ? AND key = ? AND value IS NOT NULL", (run_id, node)
            ).fetchone()
            batches = self.db.execute(
                "SELECT DISTINCT batch FROM chunks WHERE run_id = ? AND batch LIKE ?", (run_id, f"{node}#%")
            ).fetchall()
        if found is not None:
            with contextlib.suppress(LookupError):
                return rows_of_aggregate(lambda: self.db.blobopen("store", "value", found[0], readonly=True))
        if batches:
            last = max((b for (b,) in batches), key=lambda b: int(b.rsplit("#", 1)[1]))
            return rows_of_chunks(self.saved_chunks(run_id, last))
        raise LookupError(f"run {run_id} has no batch results for node '{node}'")


class LocalWaits:
    """A local run's waits and signals (worker/waits.py Waits): its process sleeps while it waits; a signal from
    any process (`chordflow signal`) is a row it reads at its next look."""

    def __init__(self, runs: LocalRuns, run_id: str):
        self.runs, self.run_id = runs, run_id
        self.shown: Waiting | None = None  # what this process last recorded as the run's wait

    def begin(self, key: str, now: float) -> float:
        with self.runs.writing() as db:
            db.execute("INSERT OR IGNORE INTO waits (run_id, key, began) VALUES (?,?,?)", (self.run_id, key, now))
            return float(db.execute(*self._row("began", key)).fetchone()[0])

    def take(self, key: str, event: str) -> tuple[bool, Any]:
        with self.runs.writing() as db:
            released = db.execute(*self._row("released", key)).fetchone()
            if released is not None and released[0] is not None:
                return True, json.loads(released[0])
            db.execute("BEGIN IMMEDIATE")
            found = db.execute(
                "SELECT data FROM signals WHERE run_id = ? AND event = ?", (self.run_id, event)
            ).fetchone()
            if found is None:
                db.execute("ROLLBACK")
                return False, None
            db.execute("UPDATE waits SET released = ? WHERE run_id = ? AND key = ?", (found[0], self.run_id, key))
            db.execute("DELETE FROM signals WHERE run_id = ? AND event = ?", (self.run_id, event))
            db.execute("COMMIT")
        return True, json.loads(found[0])

    def hold(self, waiting: Waiting, cancelled: threading.Event) -> None:
        if self.shown != waiting:  # a provider batch's counts change as it goes
            with self.runs.writing() as db:
                db.execute(
                    "UPDATE waits SET waiting = ? WHERE run_id = ? AND key = ?",
                    (json.dumps(waiting.to_wire()), self.run_id, waiting.key),
                )
            self.shown = waiting
        sleep(waiting, cancelled)

    def end(self, key: str) -> None:
        with self.runs.writing() as db:
            db.execute("UPDATE waits SET waiting = NULL WHERE run_id = ? AND key = ?", (self.run_id, key))
        self.shown = None

    def _row(self, column: str, key: str) -> tuple[str, tuple[str, str]]:
        return f"SELECT {column} FROM waits WHERE run_id = ? AND key = ?", (self.run_id, key)


class LocalAnswers:
    """A local run's model answers (worker/llm/answers.py Answers), each committed as it comes; those a node keeps
    across runs (`cache`) in `kept_answers` until their time is up."""

    def __init__(self, runs: LocalRuns, run_id: str):
        self.runs, self.run_id = runs, run_id

    def find(self, key: str, shared: bool) -> dict[str, Any] | None:
        with self.runs.lock:
            row = self.runs.db.execute(
                "SELECT value FROM answers WHERE run_id = ? AND key = ?", (self.run_id, key)
            ).fetchone()
            if row is None and shared:
                row = self.runs.db.execute(
                    "SELECT value FROM kept_answers WHERE key = ? AND until > ?", (key, time.time())
                ).fetchone()
        return None if row is None else json.loads(row[0])

    def known(self, keys: list[str]) -> set[str]:
        with self.runs.lock:
            rows = self.runs.db.execute("SELECT key FROM answers WHERE run_id = ?", (self.run_id,)).fetchall()
        return set(keys) & {row[0] for row in rows}

    def keep(self, key: str, answer: dict[str, Any], share_for: int | None) -> None:
        value = json.dumps(answer)
        with self.runs.writing() as db:
            db.execute("INSERT OR REPLACE INTO answers VALUES (?,?,?)", (self.run_id, key, value))
            if share_for is not None:
                db.execute("INSERT OR REPLACE INTO kept_answers VALUES (?,?,?)", (key, value, time.time() + share_for))


def _disk_error(exc: sqlite3.OperationalError, path: Path) -> StoreDiskError | None:
    """SQLITE_FULL / SQLITE_IOERR as an OSError naming the file; None for any other error."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary result code
    if code == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc):
        return StoreFull(errno.ENOSPC, "disk full", str(path))
    if code == sqlite3.SQLITE_IOERR or "disk I/O error" in str(exc):
        return StoreDiskError(errno.EIO, "disk I/O error", str(path))
    return None


def _record(row: tuple[Any, ...]) -> RunRecord:
    run_id, workflow, backend, status, node, step, error, created, updated, source, batches, dataset, written = row[:13]
    return RunRecord(
        run_id, json.loads(workflow), backend, status, node, step, error, created, updated, source,
        json.loads(batches), json.loads(dataset) if dataset else None, format=int(written or 0),
        waiting=json.loads(row[13]) if row[13] else None,
    )  # fmt: skip
