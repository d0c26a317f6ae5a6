"""Every error chordflow raises on purpose, in one place.

User errors (bad IR, bad input, unresolvable templates, values that cannot travel) are ValueErrors
with one-line messages that name the location; the CLI prints them without a traceback.
"""

from __future__ import annotations

import reprlib

#: What `str.splitlines` breaks a line on, each mapped to its escape: a problem stays one line.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
    """`text` as one printable line: line breaks escaped, lone surrogates (unwritable as UTF-8) too."""
    return text.translate(_LINE_BREAKS).encode("utf-8", "backslashreplace").decode("utf-8")


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist, short.maxtuple, short.maxset = 2, 4, 4, 4, 4
    short.maxfrozenset = short.maxdeque = short.maxarray = 4
    short.maxstring = short.maxother = short.maxlong = 60
    return short


_SHORT_REPR = _short_repr()


def shown(value: object, limit: int = 60) -> str:
    """A user's value inside a message: a repr (strings quoted and escaped) cut to about `limit` characters.

    Never raises and never grows with the value: a huge int, a deep or long container stay short.
    """
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= limit else text[: limit - 4] + "..." + text[0]
    if type(value) is int and value.bit_length() > 4 * limit:  # repr() may refuse 4,300+ digits
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:
        text = _SHORT_REPR.repr(value)
    except Exception:  # a user object whose repr fails
        text = f"<{type(value).__name__}>"
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_key(name: str) -> str:
    """A param name inside a location (`nodes[0] (id 'a').params.<name>`): as written, or quoted and cut when long."""
    return name if len(name) <= 40 else shown(name, 40)


class ChordflowError(Exception):
    """Base of chordflow's own errors."""


class ValidationError(ChordflowError, ValueError):
    """The workflow IR is invalid. Holds every problem found, each naming its location.

    Each problem is one line, whatever text it quotes: the CLI prints one line per problem.
    """

    def __init__(self, problems: list[str] | str, *, source: str | None = None):
        problems = [problems] if isinstance(problems, str) else list(problems)
        self.problems = [one_line(p) for p in problems if p] or ["invalid workflow"]
        self.source = one_line(source) if source else None
        prefix = f"{self.source}: " if self.source else ""
        if len(self.problems) == 1:
            message = prefix + self.problems[0]
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            message = f"{prefix}{len(self.problems)} problems:\n{lines}"
        super().__init__(message)


class UnknownRun(ChordflowError, LookupError):
    """No run store holds the run asked for (the message says where it looked; `run_id` is the id asked for)."""

    def __init__(self, message: str, run_id: str = ""):
        super().__init__(message)
        self.run_id = run_id

    def __str__(self) -> str:  # LookupError's would quote the message as a key
        return str(self.args[0]) if self.args else ""


class AmbiguousRunId(UnknownRun):
    """A run id prefix (4 characters or more) that starts several runs' ids: the message lists them."""


class TemplateError(ChordflowError, ValueError):
    """A template could not be resolved at run time."""


class BatchItemsError(ChordflowError, ValueError):
    """`batch.items` did not resolve to a list."""


class BatchItemFailed(ChordflowError, RuntimeError):
    """A fail_fast batch item failed without raising (error action, `error` key or "Error:" value)."""


class SnapshotError(ChordflowError, ValueError):
    """A value in the shared store cannot travel to a worker."""


class NodeTypeError(ChordflowError, ValueError):
    """A node type is unknown or a plugin could not be imported."""


class RemoteError(ChordflowError, RuntimeError):
    """An exception raised on a worker whose type cannot be imported on the scheduler side."""

    def __init__(self, type_name: str, message: str):
        self.type_name = type_name
        super().__init__(f"{type_name}: {message}")


class RunCancelled(ChordflowError, RuntimeError):
    """The run was cancelled (chordflow cancel, Ctrl-C)."""


class BackendError(ChordflowError, RuntimeError):
    """The distributed backend failed (broker gone, chunk crashed) rather than a user item."""


class ReplicationLost(ChordflowError, RuntimeError):
    """Fewer Redis replicas than CHORDFLOW_WAIT_REPLICAS acknowledged a chunk's outcomes in time: a failover could
    lose them, so the chunk fails instead of counting as done (worker/cluster/state/connection.py)."""


class StepLimitExceeded(ChordflowError, RuntimeError):
    """A run executed more nodes than its step limit (`max_steps`): almost always a loop nothing ends."""


class BatchThresholdExceeded(ChordflowError, RuntimeError):
    """A `continue` batch had more failed items than its `tolerated_failure_percent` / `_count` allow."""


class SubworkflowFailed(ChordflowError, RuntimeError):
    """A `workflow` node's sub-workflow ended failed (an unhandled `error` action): the node raises this."""


class EventTimedOut(ChordflowError, TimeoutError):
    """A `wait` node's event did not come within its `timeout`: the node's error (an `error` edge takes it)."""


class LineRefused(ChordflowError, RuntimeError):
    """A provider batch answered an item's request with an error (the provider's message): the item's error."""


class WaitTimeout(ChordflowError, TimeoutError):
    """`wait` gave up before the run ended (the run goes on)."""


class Throttled(ChordflowError, RuntimeError):
    """The service asked to slow down (HTTP 429, or 503 with Retry-After). Raised by a node's exec; the engine
    waits (`retry_after` seconds, else a backoff with jitter) and calls again without counting an attempt, and
    holds back the node's rate-limit bucket for every caller (worker/engine/rate_limits.py). Past `max_wait`
    seconds of such waits in one call the item fails (ThrottledTooLong)."""

    def __init__(self, message: str, retry_after: float | None = None, max_wait: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.max_wait = max_wait


class SameForEveryItem(ChordflowError, RuntimeError):
    """An item's error that every other item would meet too (a model provider refused the key, does not know the
    model, or this process has no key): not the item's failure but the batch's. The batch stops at the first,
    whatever its `error_handling`, and fails with it, instead of paying for the same refusal once per item."""


class SchemaError(ChordflowError, RuntimeError):
    """An `llm` node's answer was not JSON of its `schema`'s shape, and still was not after `schema_retries` more
    requests, each told what was wrong: the item fails. The message is `<path>: <what>`, the path being where in
    the answer it failed (`$.label`, `$` for the whole answer) (worker/llm/schemas.py)."""


class BudgetExhausted(SameForEveryItem):
    """The run's model calls would bill more than its `budget` allows: no further call starts (calls in flight
    finish), and the run fails with `budget exhausted: <spent> of <cap> tokens`, keeping its outcomes; a larger
    budget (`chordflow update RUN --budget-tokens N`) and `resume` go on without paying again for an answer."""


class ThrottledTooLong(ChordflowError, RuntimeError):
    """A call was throttled (HTTP 429/503) for longer in all than its bounded wait: the item fails, naming why."""


class Fenced(ChordflowError, RuntimeError):
    """This process's claim on a run (or a branch) was taken over while it ran — it was paused past its lease,
    and another worker went on from the checkpoint: it stops at its next write and does nothing more."""


class RunPurged(Fenced):
    """The run was purged (`chordflow purge`) while this task held it, or before its message was delivered: the
    task stops where it learns it and writes nothing of the run back (the run's tombstone says so)."""


class NewerFormat(ChordflowError, RuntimeError):
    """A task message written in a wire format newer than this worker reads (a newer release sent it during a
    rolling upgrade): handed back to the broker for a worker that knows it, never misread."""


class Outage(ChordflowError, RuntimeError):
    """chordflow's own state (Redis, the broker) stayed out of reach past the outage budget: not the node's
    failure. Items and error routes let it through, and the task gives its work back to be delivered again."""


class IdempotencyConflict(ValidationError):
    """A submit's idempotency key was already used, within the run TTL, by a run of another workflow or other
    inputs (`existing`: that run's id). The same workflow and inputs return the existing run instead."""

    def __init__(self, key: str, existing: str):
        super().__init__(
            f"idempotency key '{key}' was used by run {existing} with another workflow or other inputs; "
            f"use a new key (see `chordflow status {existing}`)"
        )
        self.existing = existing


class UnknownSchedule(ValidationError):
    """No schedule of that name (`chordflow schedule remove|pause|resume`, scheduler/schedules.py): one line, exit 2
    as every user error (`name`: the name asked for)."""

    def __init__(self, name: str):
        super().__init__(f"no schedule named {name!r} (`chordflow schedule list` shows them)")
        self.name = name


# -- raised by the run stores, the cluster's signing, the command line, the dashboard and repair -----------


class Unrecoverable(ChordflowError, LookupError):
    """A run cannot go on from its checkpoint (a value could not be stored, or its undo log is missing)."""


class StoreDiskError(ChordflowError, OSError):
    """The embedded store's file could not be written: `<file>: disk I/O error` (errno, strerror, filename)."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class StoreFull(StoreDiskError):
    """The disk holding the embedded store is full: `<file>: disk full`."""


class SigningKeyError(BackendError):
    """No usable signing key: none is set (and CHORDFLOW_INSECURE is not), or the one set cannot be used."""


class WorkflowAltered(BackendError):
    """A run whose workflow or dataset job in Redis is not what a key holder recorded: no worker runs it."""


class UsersError(ChordflowError, ValueError):
    """CHORDFLOW_DASHBOARD_BASIC_AUTH is missing (and `--unauthenticated` was not given) or is not
    `user:password[,...]`."""


class GeneratorError(ChordflowError):
    """A repair generator cannot work here (e.g. the `llm` generator without the `llm` package)."""


class CliUsageError(ChordflowError):
    """Bad command-line usage detected by chordflow itself (exit 2, one line)."""


class WorkflowFailed(ChordflowError):
    """The run finished with status "failed" (an unhandled `error` action): exit 1."""
