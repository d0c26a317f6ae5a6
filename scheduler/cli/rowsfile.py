"""`--out FILE` of `results` (`sink`), and of `wait` and `run` on a dataset job: its rows (what `results RUN --out
FILE` writes) written to FILE as the job runs, a chunk at a time in input order, so that writing them overlaps the
records still running.

FILE appears whole or not at all: the rows go to a temp file beside it, renamed over FILE once the job succeeded;
a run that fails, is cancelled or is left (Ctrl-C, a timeout) leaves FILE as it was. A symlink is followed (its
target is replaced, with its mode); a FILE that is no regular file (a FIFO, `/dev/stdout`) is written into as the
rows come, as `open(FILE, "w")` would.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from ir.errors import CliUsageError
from scheduler.cli.output import jsonl_chunk
from worker.batch.aggregate import ChunkResult
from worker.datasets.job import NOT_RUN, follow_chunks


def chunk_lines(chunk: ChunkResult | None, start: int, length: int) -> str:
    """The JSON lines of a dataset chunk of `length` records from `start` (its outcomes; None: it never ran), as
    `results` writes its rows."""
    failures = {f.index: f.error for f in chunk.failures} if chunk is not None else {}
    first, results = (chunk.start, chunk.results) if chunk is not None else (start, [])
    return jsonl_chunk(first, results, failures, (start + length, NOT_RUN))


class RowsFile:
    """FILE's rows until `close`. A regular file (or a new one) is written as a temp file in its directory (a rename
    there is atomic), renamed over it at `close` with the file's mode kept; a symlink is followed to its target. A
    FILE that is no regular file (a FIFO, `/dev/stdout`) cannot be replaced whole: the rows go straight into it."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.temp: Path | None = None
        try:  # before the run starts: a FILE that cannot be written is a usage error, not a failed run
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISREG(os.stat(path).st_mode):
                    self.file = self.path.open("w", encoding="utf-8", newline="")
                    return
            self.path = Path(os.path.realpath(path))
            self.temp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.part")
            fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
        except OSError as exc:
            raise CliUsageError(f"--out {path}: cannot write in {self.path.parent}: {exc.strerror or exc}") from None
        with contextlib.suppress(FileNotFoundError):
            os.chmod(fd, stat.S_IMODE(os.stat(self.path).st_mode))  # an existing FILE keeps its mode
        self.file = os.fdopen(fd, "w", encoding="utf-8", newline="")

    def write(self, chunk: ChunkResult | None, start: int, length: int) -> None:
        """A chunk's rows (`chunk_lines`), flushed: the temp file holds every chunk written so far."""
        self.file.write(chunk_lines(chunk, start, length))
        self.file.flush()

    def close(self, keep: bool) -> None:
        """Rename the rows over FILE (`keep`), or delete them; a FILE written into directly is only closed."""
        self.file.close()
        if self.temp is None:
            return
        if keep:
            os.replace(self.temp, self.path)
        else:
            self.temp.unlink(missing_ok=True)


@contextlib.contextmanager
def rows_file(path: str) -> Iterator[RowsFile]:
    """A RowsFile kept when the body returns, dropped when it raises (a failed or cancelled run raises)."""
    out = RowsFile(path)
    try:
        yield out
    except BaseException:
        out.close(keep=False)
        raise
    out.close(keep=True)


@contextlib.contextmanager
def sink(path: str | None) -> Iterator[TextIO]:
    """Where `results` writes: stdout, or FILE whole or not at all (a RowsFile)."""
    if path is None:
        yield sys.stdout
        return
    with rows_file(path) as out:
        yield out.file


@contextlib.contextmanager
def written_as_it_runs(path: str, run_id: str, backend: str) -> Iterator[None]:
    """While the body follows the job to its end, a thread writes its rows as its chunks finish
    (worker/datasets/job.py follow_chunks); once the body returned (the run succeeded) the thread writes the rest
    and FILE is renamed into place. A body that raises stops the thread and leaves no FILE."""
    from scheduler.datasets import reading

    ended, stop = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    store = reading.store_for(run_id, backend)  # here: importing Celery in two threads at once can fail

    def write_rows(out: RowsFile) -> None:
        try:
            for chunk in follow_chunks(store, ended.is_set, ended.wait):
                if stop.is_set():
                    return
                out.write(*chunk)
        except BaseException as exc:  # raised in the command's thread, once it joins this one
            failure.append(exc)

    with rows_file(path) as out:
        writer = threading.Thread(target=write_rows, args=(out,), name="rows-out", daemon=True)
        writer.start()
        try:
            yield
        except BaseException:
            stop.set()
            ended.set()
            writer.join()
            raise
        ended.set()
        writer.join()
        if failure:
            raise failure[0]


def out_option(command: Any) -> Any:
    """`--out FILE` of `wait` and `run`."""
    import click

    return click.option(
        "--out", "rows_out", type=click.Path(dir_okay=False, writable=True), default=None, metavar="FILE",
        help="A dataset job: write its rows (what `results RUN --out FILE` writes) to FILE as its records finish, in "
        "input order; FILE appears once the job succeeded (a failed or cancelled job leaves none).",
    )(command)  # fmt: skip


def not_a_dataset(run: str) -> str:
    """The one-line refusal of `--out` for a run that is not a dataset job."""
    return f"--out: {run} is not a dataset job (--items); `chordflow results RUN --out FILE` writes a run's outputs"
