"""A local dataset job's chunks, outcomes and counts in the embedded store (the runs.db of LocalRuns).

The same shape as worker/cluster/datasets/store.py's Redis keys: chunk n's records (dropped once every one of
them succeeded: only a redrive needs them), its outcomes, how many records have an outcome and how many
failed; per job the chunk size, records read, total (once the file is read) and why it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ir import snapshot
from worker.batch.aggregate import ChunkResult
from worker.datasets.job import outcome_and_calls, pack_records, unpack_records
from worker.runs.sqlite import LocalRuns

SCHEMA = """
CREATE TABLE IF NOT EXISTS dataset_chunks (run_id TEXT, n INTEGER, records BLOB, outcome BLOB,
  length INTEGER NOT NULL, covered INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, n));
CREATE TABLE IF NOT EXISTS datasets (run_id TEXT PRIMARY KEY, size INTEGER NOT NULL, total INTEGER,
  read INTEGER NOT NULL DEFAULT 0, stopped TEXT);
CREATE TABLE IF NOT EXISTS dataset_calls (run_id TEXT, model TEXT, name TEXT, value INTEGER NOT NULL,
  PRIMARY KEY (run_id, model, name));
"""


class LocalDataset:
    def __init__(self, run_id: str, runs: LocalRuns | None = None):
        self.run_id = run_id
        self.runs = runs or LocalRuns.default()
        self.db, self.lock = self.runs.db, self.runs.lock
        with self.runs.writing():  # every write: a full disk is raised naming the file (worker/runs/sqlite.py)
            self.db.executescript(SCHEMA)

    def _one(self, query: str, *args: Any) -> Any:
        with self.lock:
            return self.db.execute(query, (self.run_id, *args)).fetchone()

    def start(self, size: int) -> None:
        with self.runs.writing():
            self.db.execute("INSERT OR REPLACE INTO datasets (run_id, size) VALUES (?, ?)", (self.run_id, size))

    def add(self, n: int, records: Sequence[Any], bad: dict[int, str], read: int) -> None:
        with self.runs.writing():
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT OR REPLACE INTO dataset_chunks (run_id, n, records, length) VALUES (?,?,?,?)",
                (self.run_id, n, pack_records(records, bad), len(records)),
            )
            self.db.execute("UPDATE datasets SET read = ? WHERE run_id = ?", (read, self.run_id))
            self.db.execute("COMMIT")

    def finish(self, n: int, chunk: ChunkResult, length: int) -> None:
        """Store chunk n's outcomes, and add its records' model calls to the job's, in one transaction."""
        complete = len(chunk.results) == length and not chunk.failures
        chunk, calls = outcome_and_calls(chunk)
        sums = [(self.run_id, model, name, value) for model, counts in calls.items() for name, value in counts.items()]
        with self.runs.writing():
            self.db.execute("BEGIN")
            self.db.execute(
                "UPDATE dataset_chunks SET outcome = ?, covered = ?, failed = ?,"
                " records = CASE WHEN ? THEN NULL ELSE records END WHERE run_id = ? AND n = ?",
                (snapshot.encode(chunk.to_wire()), len(chunk.results), len(chunk.failures), complete, self.run_id, n),
            )
            self.db.executemany(
                "INSERT INTO dataset_calls VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id, model, name) DO UPDATE SET value = value + excluded.value",
                sums,
            )
            self.db.execute("COMMIT")

    def read_done(self, total: int) -> None:
        with self.runs.writing():
            self.db.execute("UPDATE datasets SET total = ?, read = ? WHERE run_id = ?", (total, total, self.run_id))

    def stop(self, why: str | None) -> None:
        with self.runs.writing():
            self.db.execute("UPDATE datasets SET stopped = ? WHERE run_id = ?", (why, self.run_id))

    # -- reading ------------------------------------------------------------------------------------
    def records(self, n: int) -> tuple[list[Any], dict[int, str]]:
        row = self._one("SELECT records FROM dataset_chunks WHERE run_id = ? AND n = ?", n)
        if row is None or row[0] is None:
            raise LookupError(f"run {self.run_id}: the records of chunk {n} are missing")
        return unpack_records(row[0])

    def outcomes(self, ns: Sequence[int]) -> list[ChunkResult | None]:
        found: dict[int, bytes] = {}
        if ns:
            with self.lock:
                marks = ",".join("?" * len(ns))
                query = f"SELECT n, outcome FROM dataset_chunks WHERE run_id = ? AND n IN ({marks})"
                found = dict(self.db.execute(query, (self.run_id, *ns)).fetchall())
        blobs = [found.get(n) for n in ns]
        return [None if b is None else ChunkResult.from_wire(snapshot.decode(b)) for b in blobs]

    def needing_work(self) -> list[int]:
        """Chunks with a failed record or a record without an outcome (what a redrive runs)."""
        with self.lock:
            rows = self.db.execute(
                "SELECT n FROM dataset_chunks WHERE run_id = ? AND (failed > 0 OR covered < length) ORDER BY n",
                (self.run_id,),
            ).fetchall()
        return [n for (n,) in rows]

    def counts(self) -> dict[str, Any]:
        total, read, stopped = self._one("SELECT total, read, stopped FROM datasets WHERE run_id = ?")
        done, failed, chunks = self._one(
            "SELECT COALESCE(SUM(covered), 0), COALESCE(SUM(failed), 0), COUNT(*) FROM dataset_chunks WHERE run_id = ?"
        )
        return {"total": total, "read": read, "done": done, "failed": failed, "chunks": chunks, "stopped": stopped}

    def model_calls(self) -> dict[str, dict[str, int]]:
        """The counts of the job's model calls, by model (worker/llm/usage.py `summed`)."""
        calls: dict[str, dict[str, int]] = {}
        with self.lock:
            found = self.db.execute("SELECT model, name, value FROM dataset_calls WHERE run_id = ?", (self.run_id,))
            for model, name, value in found.fetchall():
                calls.setdefault(model, {})[name] = value
        return calls

    def chunk_count(self) -> int:
        return int(self._one("SELECT COUNT(*) FROM dataset_chunks WHERE run_id = ?")[0])

    def chunk_size(self) -> int:
        return int(self._one("SELECT size FROM datasets WHERE run_id = ?")[0])

    def chunk_length(self, n: int) -> int:
        row = self._one("SELECT length FROM dataset_chunks WHERE run_id = ? AND n = ?", n)
        return int(row[0]) if row else 0
