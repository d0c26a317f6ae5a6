"""Every CHORDFLOW_* environment variable chordflow reads, in one typed table (`Settings`).

`load()` gives all of them, `get(name)` one; both read the environment as it is at the call (tests change it
with monkeypatch), through a cache keyed on the variables' values: a call costs their lookups, not a parse.
A bad value raises ValueError with one line naming the variable. Most are checked by `load()`, as the
scheduler and every worker need them together; those in CHECKED_ON_USE only where they are read (`get`), so
a bad CHORDFLOW_MAX_STEPS stops the runs that use it, not a worker's start.

`warn_unknown()` names, once per process, each CHORDFLOW_* variable nothing reads (a misspelt one would
otherwise be silently ignored).

A frozen dataclass whose fields each name their variable and the reader of its text (an integer, a flag, one
of two words), not a pydantic model: every `chordflow` command reads its settings first, and importing
pydantic for that cost each command about 0.1 s, most of the start of `wait`, `status` and `results` (which
load no workflow). The readers are the few rules the variables need, each error one line naming the variable.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

PREFIX = "CHORDFLOW_"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"

#: How a variable's text (set, not empty) becomes its value: (text, variable) -> value, or ValueError (one line).
Reader = Callable[[str, str], Any]


def _text(text: str, variable: str) -> str:
    return text


def _stripped(text: str, variable: str) -> str:
    return text.strip()


def _path(text: str, variable: str) -> Path:
    return Path(text)


def _flag(text: str, variable: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def _number(text: str, variable: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"environment variable {variable} must be a number, got {text!r}") from None


def _integer(at_least: int | None = None, blank: Any = ...) -> Reader:
    """An integer, raised to `at_least`; text of spaces only is `blank` when given."""

    def read(text: str, variable: str) -> Any:
        if blank is not ... and not text.strip():
            return blank
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"environment variable {variable} must be an integer, got {text!r}") from None
        return value if at_least is None else max(at_least, value)

    return read


def _choice(first: str, *others: str) -> Reader:
    """One of the words, any case; text of spaces only is the first."""
    words = (first, *others)
    shown = ", ".join(f"'{w}'" for w in words[:-1]) + f" or '{words[-1]}'"

    def read(text: str, variable: str) -> str:
        value = text.strip().lower() or first
        if value not in words:
            raise ValueError(f"{variable} must be {shown}, got {value!r}")
        return value

    return read


def _ratio(text: str, variable: str) -> float:
    value = _number(text, variable)
    if not 0 <= value <= 1:
        raise ValueError(f"environment variable {variable} must be a ratio from 0 to 1, got {text!r}")
    return value


def _var(variable: str, default: Any, meaning: str, read: Reader = _text, repr: bool = True) -> Any:
    """A field read from the environment variable `variable` (spelt out, so a grep for it finds this line)."""
    return dataclasses.field(
        default=default, repr=repr, metadata={"variable": variable, "meaning": meaning, "read": read}
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """The settings of the scheduler and of every worker; frozen and hashable (one Celery app per value)."""

    # The cluster: read together by `load()`.
    broker_url: str = _var("CHORDFLOW_BROKER_URL", DEFAULT_BROKER, "the Celery broker: redis://... or amqp://...")
    result_backend: str = _var(
        "CHORDFLOW_RESULT_BACKEND", "", "where run state and results live (Redis); unset: the broker",
    )  # fmt: skip
    redis_master_name: str = _var(
        "CHORDFLOW_REDIS_MASTER_NAME",
        "",
        "the primary's name, when a Redis URL is sentinel://... (Sentinel)",
        read=_stripped,
    )
    wait_replicas: int = _var(
        "CHORDFLOW_WAIT_REPLICAS",
        0,
        "a chunk's outcomes count once this many Redis replicas hold them (WAIT)",
        read=_integer(at_least=0),
    )
    visibility_timeout: int = _var(
        "CHORDFLOW_VISIBILITY_TIMEOUT",
        3600,
        "seconds before a dead worker's delivery comes back, at most 30",
        read=_integer(),
    )
    snapshot_inline_bytes: int = _var(
        "CHORDFLOW_SNAPSHOT_INLINE_BYTES",
        16 * 1024,
        "snapshots up to this size travel inside each chunk message",
        read=_integer(),
    )
    chunks_per_process: int = _var(
        "CHORDFLOW_CHUNKS_PER_PROCESS", 4, "auto chunk size: chunks per worker process...", read=_integer()
    )
    max_chunk_size: int = _var(
        "CHORDFLOW_MAX_CHUNK_SIZE", 5000, "...but never more items than this in one chunk", read=_integer()
    )
    chunk_seconds: float = _var(
        "CHORDFLOW_CHUNK_SECONDS",
        2.0,
        "auto chunk size: about this much measured work per chunk, within those caps",
        read=_number,
    )
    priority_aging: int = _var(
        "CHORDFLOW_PRIORITY_AGING",
        60,
        "seconds a run's message below high priority waits in the queue before it is sent again one level up",
        read=_integer(at_least=1),
    )
    run_ttl: int = _var(
        "CHORDFLOW_RUN_TTL",
        86400,
        "seconds run state (progress stream, flags, snapshots) stays in Redis",
        read=_integer(),
    )
    queue: str = _var("CHORDFLOW_QUEUE", "chordflow", "the queue chunks are sent to and workers consume")
    broker_heartbeat: int = _var(
        "CHORDFLOW_BROKER_HEARTBEAT",
        10,
        "AMQP: seconds between heartbeats; a silent peer is dropped after two",
        read=_integer(at_least=1),
    )
    queue_type: Literal["classic", "quorum"] = _var(
        "CHORDFLOW_QUEUE_TYPE",
        "classic",
        "AMQP: the queue's type, classic (with priorities) or quorum (replicated)",
        read=_choice("classic", "quorum"),
    )
    worker_heartbeat: int = _var(
        "CHORDFLOW_WORKER_HEARTBEAT",
        10,
        "seconds between a worker's registry refreshes (its entry lives 3 beats)",
        read=_integer(at_least=1),
    )
    drain_grace: float = _var(
        "CHORDFLOW_DRAIN_GRACE",
        25.0,
        "seconds a worker told to stop (SIGTERM) gives its items in flight; those not started go back at once",
        read=_number,
    )
    outage_seconds: int = _var(
        "CHORDFLOW_OUTAGE_SECONDS",
        60,
        "seconds a Redis command retries a lost connection; then the task is given back",
        read=_integer(at_least=1),
    )
    snapshot_cache_bytes: int = _var(
        "CHORDFLOW_SNAPSHOT_CACHE_BYTES",
        256 * 2**20,
        "a worker process keeps decoded snapshots up to this size",
        read=_integer(at_least=0),
    )
    pool_timeout: float = _var(
        "CHORDFLOW_POOL_TIMEOUT",
        30,
        "seconds a send waits for a free broker connection (an integer)",
        read=_integer(at_least=1),
    )
    secret_key: str | None = _var(
        "CHORDFLOW_SECRET_KEY", None, "the shared key that signs task messages (worker/cluster/signing.py)", repr=False
    )
    secret_key_file: str | None = _var("CHORDFLOW_SECRET_KEY_FILE", None, "or the path of a file holding it")
    insecure: bool = _var(
        "CHORDFLOW_INSECURE", False, "1/true/yes/on: no key needed; unsigned messages sent and run", read=_flag
    )

    # Read where they are used (`get`), each call.
    plugins: str = _var("CHORDFLOW_PLUGINS", "", "comma-separated modules that register node types or generators")
    home: Path | None = _var(
        "CHORDFLOW_HOME", None, "directory of the local runs' store; unset: ~/.chordflow", read=_path
    )
    max_steps: int | None = _var(
        "CHORDFLOW_MAX_STEPS",
        None,
        "node executions in a run without its own max_steps; unset: 10,000",
        read=_integer(blank=None),
    )
    log_format: Literal["text", "json"] = _var(
        "CHORDFLOW_LOG_FORMAT", "text", "a worker's log lines: text or json", read=_choice("text", "json")
    )
    http_connections: int = _var(
        "CHORDFLOW_HTTP_CONNECTIONS",
        8,
        "connections the http node keeps open per process; more calls wait for one",
        read=_integer(at_least=1),
    )
    llm_model: str | None = _var("CHORDFLOW_LLM_MODEL", None, "the `llm` node's model; 'fake' answers offline")
    llm_prices: str | None = _var(
        "CHORDFLOW_LLM_PRICES", None, "a JSON file (or JSON) of model -> USD per 1M tokens {input, output}"
    )
    llm_provider: Literal["openai", "anthropic", "llm"] = _var(
        "CHORDFLOW_LLM_PROVIDER",
        "openai",
        "the provider of a bare model name (`gpt-4o-mini`): openai, anthropic or llm",
        read=_choice("openai", "anthropic", "llm"),
    )
    repair_generator: str | None = _var("CHORDFLOW_REPAIR_GENERATOR", None, "the repair generator; unset: auto")
    repair_model: str | None = _var("CHORDFLOW_REPAIR_MODEL", None, "the llm repair generator's model; unset: LLM")
    trace_items: float = _var(
        "CHORDFLOW_TRACE_ITEMS",
        0.01,
        "with tracing on: the share of a batch's items traced (failed ones all are)",
        read=_ratio,
    )
    dashboard_basic_auth: str | None = _var(
        "CHORDFLOW_DASHBOARD_BASIC_AUTH", None, "`chordflow dashboard` users: user:password[,...]", repr=False
    )

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable of field `name`."""
        return str(_FIELD_OF[name].metadata["variable"])


_FIELD_OF = {field.name: field for field in dataclasses.fields(Settings)}  # name -> field, in declaration order
FIELDS = tuple(_FIELD_OF)
#: Fields whose bad value fails only the code that reads them (`get`); `load()` leaves them at their default.
CHECKED_ON_USE = frozenset({"plugins", "home", "max_steps", "log_format", "http_connections", "llm_model",
                            "llm_prices", "llm_provider", "repair_generator", "repair_model",
                            "dashboard_basic_auth", "trace_items"})  # fmt: skip
#: CHORDFLOW_* variables read by chordflow's own tests and Makefile, not by chordflow: known, so no warning.
TEST_VARIABLES = frozenset({"CHORDFLOW_FUZZ_EXAMPLES", "CHORDFLOW_TEST_BROKER"})
VARIABLES = tuple(Settings.variable(name) for name in _FIELD_OF)
KNOWN = frozenset(VARIABLES) | TEST_VARIABLES


def load() -> Settings:
    """Every setting, from the environment now; ValueError (one line) for a bad value outside CHECKED_ON_USE."""
    loaded, errors = _read(_environment())
    for name, message in errors.items():
        if name not in CHECKED_ON_USE:
            raise ValueError(message)
    urls = (loaded.broker_url, loaded.result_backend)
    if not loaded.redis_master_name and any(url.split(";", 1)[0].startswith("sentinel:") for url in urls):
        name = Settings.variable("redis_master_name")
        raise ValueError(f"a sentinel:// Redis URL needs {name}, the name of the primary the sentinels watch")
    if loaded.result_backend == loaded.broker_url and loaded.broker_url.startswith(("amqp:", "amqps:", "pyamqp:")):
        raise ValueError(
            "CHORDFLOW_RESULT_BACKEND must name a Redis server when CHORDFLOW_BROKER_URL is RabbitMQ (amqp://): "
            "run state lives in Redis"
        )
    return loaded


def get(name: str) -> Any:
    """One setting (a field name, e.g. "max_steps"), from the environment now; ValueError if its value is bad."""
    loaded, errors = _read(_environment())
    if name in errors:
        raise ValueError(errors[name])
    return getattr(loaded, name)


def _environment() -> tuple[str | None, ...]:
    return tuple(map(os.environ.get, VARIABLES))


@functools.lru_cache(maxsize=64)
def _read(environment: tuple[str | None, ...]) -> tuple[Settings, dict[str, str]]:
    """The settings of one environment (the values of VARIABLES, an empty one unset), every bad value replaced
    by its field's default, and {field: the one line that says why its value is bad}."""
    values, errors = {}, {}
    for field, text in zip(_FIELD_OF.values(), environment, strict=True):
        if text:
            try:
                values[field.name] = field.metadata["read"](text, field.metadata["variable"])
            except ValueError as exc:
                errors[field.name] = str(exc)
    broker = values.get("broker_url", DEFAULT_BROKER)
    values["result_backend"] = values.get("result_backend") or broker  # unset: the broker
    return Settings(**values), errors


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning line for each CHORDFLOW_* variable in `environ` (default: the environment) nothing reads."""
    environ = os.environ if environ is None else environ
    suffixes = [name.removeprefix(PREFIX) for name in sorted(KNOWN)]
    lines = []
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in KNOWN):
        close = difflib.get_close_matches(name.removeprefix(PREFIX), suffixes, n=1) if len(name) <= 100 else []
        hint = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
        lines.append(f"chordflow: unknown environment variable {name}{hint}")
    return lines


@functools.cache
def warn_unknown() -> None:
    """Print `unknown()`'s lines on stderr, once per process (`chordflow worker` starts the CLI, then a worker)."""
    for line in unknown():
        print(line, file=sys.stderr)
