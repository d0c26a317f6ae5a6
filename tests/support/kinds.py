"""What a test starts besides this process, as pytest markers: `make test-fast` runs only the tests that start
nothing (`-m "not processes"`), in seconds.

A fixture that starts real processes says so with `@starts(kind)` under its `@pytest.fixture`; every test using
it (directly or through other fixtures) gets the marker `kind` and `processes` (tests/conftest.py). A test that
starts a process itself (a `chordflow` command, a redis-server) carries `@pytest.mark.processes`. Under
`make test-fast` a test that starts a process without saying so fails at once, naming what it started: the fast
loop stays the in-process tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any, TypeVar

#: The markers: a cluster (redis-server and workers), a fault injected into real processes, a browser.
KINDS = ("cluster", "faults", "browser", "processes")
F = TypeVar("F", bound=Callable[..., Any])


def starts(*kinds: str) -> Callable[[F], F]:
    """Tag a fixture function: the tests using it start processes of these kinds."""
    assert set(kinds) <= set(KINDS), kinds

    def tag(fixture: F) -> F:
        fixture.starts = kinds  # type: ignore[attr-defined]
        return fixture

    return tag


def kinds_of(item: Any) -> set[str]:
    """The kinds a collected test starts: its marks, its fixtures' tags, a parameter naming a cluster or Redis
    (a fixture that starts one for that parameter only, with `getfixturevalue`)."""
    found = {mark.name for mark in item.iter_markers() if mark.name in KINDS}
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        for fixturedef in defs:
            found.update(getattr(fixturedef.func, "starts", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    if {"celery", "rabbitmq"} & {value for value in params.values() if isinstance(value, str)}:
        found.add("cluster")  # a backend, broker or store parameter that is a cluster
    elif "redis" in params.values():
        found.add("processes")  # a store on a redis-server
    return found | {"processes"} if found else found


#: Programs whose start makes a test slow: servers, workers, a Python (a `chordflow` command), a browser, a
#: network namespace, a docs build. A short command (`sh -c`, `make -n`, `uname`) is part of an in-process test; a
#: script that starts heavy ones (a quick start through `bash` or `make run`) is marked by hand.
HEAVY = ("redis", "celery", "chordflow", "chrom", "python", "ip", "rabbitmq", "flower", "mkdocs")


class Refused(RuntimeError):
    """A test that starts a heavy process without a marker, under `make test-fast`."""


def refuse_processes() -> None:
    """Make the start of a HEAVY program raise Refused (the fast loop's guard)."""
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        argv = [args] if isinstance(args, str | bytes) else list(args)
        program = os.path.basename(str(argv[0]).split()[0]) if argv else ""
        if program.startswith(HEAVY) or str(argv[0]) == sys.executable:
            raise Refused(f"this test starts {program} ({argv!r}): tag its fixture with @starts(...) or mark the test "
                          "@pytest.mark.processes (tests/support/kinds.py)")  # fmt: skip
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
