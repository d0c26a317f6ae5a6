"""The replay corpus of a previous release: reading and writing its files, and a `git worktree` of a tag.

Imported by the suite (`tests.upgrades.corpus`) and by `make_corpus.py`, which runs it under a previous release's
code: so this module imports nothing of chordflow. A corpus is one folder per release tag (`v0.1.0/`), holding
`commit` (the tag's commit: a clone need not carry tags, but every clone of main holds the commit), `messages.json`
(what that release put on the broker) and `runs.json` (what it kept in Redis for three runs). Both
are JSON in which bytes are `{"$b64": "..."}` (a message's snapshot and items travel as msgpack bytes, and a
Redis value is bytes) and every other value is as the release wrote it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Every release the suite replays, oldest first: the folder of each tag here. The last is the previous release.
TAGS = sorted((p.name for p in HERE.glob("v*") if p.is_dir()), key=lambda tag: [int(n) for n in tag[1:].split(".")])
#: The signing key of the corpus's cluster (not a secret: it signs nothing outside these files). A run record keeps
#: its workflow's signature under it, so a replay's workers are given it too, as an upgrade keeps a cluster's key.
SECRET_KEY = "c0ffee" * 10 + "beef"
#: Run ids of the corpus's runs: a plain run as submitted, a run mid-batch, a dataset job as submitted.
PLAIN, BATCH, DATASET = "corpus-plain", "corpus-batch", "corpus-dataset"


def to_json(value: Any) -> Any:
    """`value` with its bytes tagged and its tuples as lists: what `from_json` gives back exactly."""
    if isinstance(value, bytes):
        return {"$b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$b64"}:
            return base64.b64decode(value["$b64"])
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(to_json(value), indent=1, sort_keys=True) + "\n")


def read(tag: str, name: str) -> Any:
    return from_json(json.loads((HERE / tag / name).read_text()))


def commit(tag: str) -> str:
    """The commit `tag` names, as recorded beside its corpus."""
    return (HERE / tag / "commit").read_text().strip()


@contextlib.contextmanager
def worktree(tag: str, repo: Path = ROOT) -> Iterator[Path]:
    """A checkout of `tag`'s recorded commit (a `git worktree` of `repo`, detached) in a temporary folder; removed
    after, and unregistered from `repo` (`git worktree remove --force`, else `prune`)."""
    parent = Path(tempfile.mkdtemp(prefix=f"chordflow-{tag}-"))
    path = parent / parent.name  # a name of its own: git names the worktree's admin folder after it
    add = ["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(path), commit(tag)]
    subprocess.run(add, check=True)
    try:
        yield path
    finally:
        removed = subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False)
        shutil.rmtree(parent, ignore_errors=True)
        if removed.returncode:
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
