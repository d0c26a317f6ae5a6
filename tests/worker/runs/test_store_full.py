"""A full disk under the embedded store: one line naming the file, `<CHORDFLOW_HOME>/runs.db: disk full`.

For real: CHORDFLOW_HOME on a 1 MiB tmpfs mounted here (the suite runs as root), a workflow whose store grows
past it, run by the CLI as a process.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scheduler.cli.test_cli import assert_one_line_error, cli_env, run_cli, write_wf

BLOB = "import os\n\ndef blob(n, **_):\n    return os.urandom(n).hex()\n"


@contextlib.contextmanager
def tiny_disk(where: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (unmounted on the way out)."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True, timeout=30)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=30)


def _env(tmp_path: Path, home: Path) -> dict[str, str]:
    (tmp_path / "blobmod.py").write_text(BLOB, encoding="utf-8")
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return cli_env(CHORDFLOW_HOME=str(home), PYTHONPATH=pythonpath)


@pytest.mark.processes
def test_a_full_disk_under_the_run_store_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """Four nodes of 400 KB each: the second or third checkpoint no longer fits in 1 MiB."""
    nodes = [{"id": n, "type": "python", "params": {"function": "blobmod:blob", "n": 200_000}} for n in "abcd"]
    wf = {"nodes": nodes, "edges": [{"from": a, "to": b} for a, b in zip("abc", "bcd", strict=True)]}
    path = write_wf(tmp_path, wf)
    with tiny_disk(tmp_path / "home") as home:
        proc = run_cli("run", path, "--output", "json", env=_env(tmp_path, home))
        line = assert_one_line_error(proc, 1)
        assert line == f"error: {home / 'runs.db'}: disk full"
        report = json.loads(proc.stdout)
        assert (report["status"], report["error"]) == ("failed", f"{home / 'runs.db'}: disk full")
        # The store is still readable: the run's record is there, from before the disk filled up.
        status = run_cli("status", report["run_id"], "--json", env=_env(tmp_path, home))
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["steps"] < 4


@pytest.mark.processes
def test_a_full_disk_under_a_dataset_job_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A local dataset job keeps its chunks' outcomes in the same file (worker/datasets/sqlite.py)."""
    wf = {
        "inputs": {"record": {}},
        "nodes": [{"id": "big", "type": "python", "params": {"function": "blobmod:blob", "n": "${record.n}"}}],
        "outputs": {"blob": {"source": "${big.result}"}},
    }
    items = tmp_path / "records.jsonl"
    items.write_text("".join(json.dumps({"n": 20_000}) + "\n" for _ in range(200)), encoding="utf-8")
    path = write_wf(tmp_path, wf)
    with tiny_disk(tmp_path / "home") as home:
        proc = run_cli("run", path, "--items", items, "--chunk-size", "10", env=_env(tmp_path, home))
        assert assert_one_line_error(proc, 1) == f"error: {home / 'runs.db'}: disk full"


def test_the_store_raises_store_full_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    """In process: StoreFull (an OSError, ENOSPC) from the checkpoint's transaction, which is rolled back, so
    the store still answers reads and smaller writes."""
    import errno

    from ir.errors import StoreFull
    from worker.engine.steps import Step
    from worker.runs.record import RunRecord
    from worker.runs.sqlite import LocalRuns

    with tiny_disk(tmp_path / "home") as home:
        runs = LocalRuns(home / "runs.db")
        try:
            runs.create(RunRecord("full-1", {"nodes": []}, "local", "running", "a"), {})
            big = Step(node="a", action=None, next_node="b", changed={"a": os.urandom(2_000_000)})
            with pytest.raises(StoreFull) as raised:
                runs.checkpoint("full-1", 0, big)
            assert raised.value.errno == errno.ENOSPC and str(raised.value) == f"{home / 'runs.db'}: disk full"
            assert not runs.db.in_transaction
            record = runs.get("full-1")
            assert record is not None and record.step == 0
            runs.set_status("full-1", "failed", "disk full")
            assert runs.get("full-1").status == "failed"  # type: ignore[union-attr]
        finally:
            runs.db.close()
