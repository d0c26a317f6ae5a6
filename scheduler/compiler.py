"""Compile a workflow IR into a PocketFlow Flow of wrapped nodes (loaded by worker/engine/loader.py)."""

from __future__ import annotations

from typing import Any

from scheduler.cwd import use_cwd_modules
from worker.engine.flow import WorkflowFlow, build_flow
from worker.engine.loader import load


def compile(workflow: Any) -> WorkflowFlow:
    use_cwd_modules()  # a `python` node's function in the working directory, as the CLI sees it
    return build_flow(load(workflow))
