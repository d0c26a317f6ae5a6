"""Faults injected into real worker processes at a moment no signal sent from outside can hit: a plugin module
(CHORDFLOW_PLUGINS) that a test's workers load. Nothing in the code under test changes; a worker kills itself.

CHORDFLOW_TEST_KILL_BEFORE_SEND=FILE: the first worker to dispatch a batch (its plan stored in Redis, its chunks
claimed) SIGKILLs itself before sending any chunk, and creates FILE first so that only one does.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from worker.cluster.batches import dispatch

_marker = os.environ.get("CHORDFLOW_TEST_KILL_BEFORE_SEND")
_follow = dispatch.follow


def _dying_follow(*args: Any, **kwargs: Any) -> None:
    try:
        with open(_marker, "x"):  # type: ignore[arg-type]
            pass
    except FileExistsError:
        return _follow(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)


if _marker:
    dispatch.follow = _dying_follow  # dispatch_batch's call only: the chunk tasks hold their own reference
