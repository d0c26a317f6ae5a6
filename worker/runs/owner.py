"""The process that owns a local run: a local run is driven by the process running it, so when that process
is gone (SIGKILL, a closed terminal, a crash) nothing will ever end its record. The embedded store keeps the
owner (pid, host, start time) beside the record, and a reader that finds a `running` run whose owner is gone
reads it as `failed` (`the process running it (pid N) is gone`), which lets `wait` end and `resume` go on.

The start time tells a pid the kernel reused from the owner itself; where it cannot be read (no /proc), the
pid alone decides. An owner on another host cannot be checked and is taken as alive.
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    pid: int
    host: str
    started: str | None  # the process's start time in clock ticks after boot (/proc/<pid>/stat), as text

    def gone(self) -> bool:
        """Whether this process no longer runs (on this host; another host's process cannot be checked)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            pass
        stat = _stat(self.pid)
        if stat is None:
            return False
        state, started = stat
        return state == "Z" or (self.started is not None and started != self.started)  # a zombie, a reused pid

    def cancel(self) -> bool:
        """Ask the process to end the run as cancelled: SIGTERM, which the CLI takes as Ctrl-C (a script calling
        `scheduler.run` without a handler just ends, and its run reads as failed). False: on another host, or
        no longer this process."""
        if self.host != socket.gethostname() or self.gone():
            return False
        try:
            os.kill(self.pid, signal.SIGTERM)
        except OSError:
            return False
        return True

    def why(self) -> str:
        """The error a run whose owner is gone reads with."""
        return f"the process running it (pid {self.pid}) is gone"


def _stat(pid: int) -> tuple[str, str] | None:
    """The process's state and start time (fields 3 and 22 of /proc/<pid>/stat); None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the name in parentheses may hold spaces
    return (fields[0], fields[19]) if len(fields) > 19 else None


def current_owner() -> Owner:
    """This process, as the owner of the runs it drives."""
    stat = _stat(os.getpid())
    return Owner(os.getpid(), socket.gethostname(), stat[1] if stat else None)
