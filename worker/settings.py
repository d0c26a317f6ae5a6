"""Every CHORDFLOW_* environment variable chordflow reads, in one typed model (`Settings`).

`load()` gives all of them, `get(name)` one; both read the environment as it is at the call (tests change it
with monkeypatch), through a cache keyed on the variables' values: a call costs their lookups, not a parse.
A bad value raises ValueError with one line naming the variable. Most are checked by `load()`, as the
scheduler and every worker need them together; those in CHECKED_ON_USE only where they are read (`get`), so
a bad CHORDFLOW_MAX_STEPS stops the runs that use it, not a worker's start.

`warn_unknown()` names, once per process, each CHORDFLOW_* variable nothing reads (a misspelt one would
otherwise be silently ignored).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "CHORDFLOW_"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"


def _var(name: str, default: Any, meaning: str, **options: Any) -> Any:
    """A field read from the environment variable `name` (spelt out, so a grep for it finds this line)."""
    return Field(default, validation_alias=name, description=meaning, **options)


class Settings(BaseSettings):
    """The settings of the scheduler and of every worker; frozen and hashable (one Celery app per value)."""

    model_config = SettingsConfigDict(frozen=True, case_sensitive=True, env_ignore_empty=True, populate_by_name=True)

    # The cluster: read together by `load()`.
    broker_url: str = _var("CHORDFLOW_BROKER_URL", DEFAULT_BROKER, "the Celery broker: redis://... or amqp://...")
    result_backend: str = _var(
        "CHORDFLOW_RESULT_BACKEND", "", "where run state and results live (Redis); unset: the broker",
        validate_default=True,
    )  # fmt: skip
    redis_master_name: str = _var(
        "CHORDFLOW_REDIS_MASTER_NAME",
        "",
        "the primary's name, when a Redis URL is sentinel://... (Sentinel)",
    )
    wait_replicas: int = _var(
        "CHORDFLOW_WAIT_REPLICAS", 0, "a chunk's outcomes count once this many Redis replicas hold them (WAIT)"
    )
    visibility_timeout: int = _var(
        "CHORDFLOW_VISIBILITY_TIMEOUT", 3600, "seconds before a dead worker's delivery comes back, at most 30"
    )
    snapshot_inline_bytes: int = _var(
        "CHORDFLOW_SNAPSHOT_INLINE_BYTES", 16 * 1024, "snapshots up to this size travel inside each chunk message"
    )
    chunks_per_process: int = _var("CHORDFLOW_CHUNKS_PER_PROCESS", 4, "auto chunk size: chunks per worker process...")
    max_chunk_size: int = _var("CHORDFLOW_MAX_CHUNK_SIZE", 5000, "...but never more items than this in one chunk")
    chunk_seconds: float = _var(
        "CHORDFLOW_CHUNK_SECONDS", 2.0, "auto chunk size: about this much measured work per chunk, within those caps"
    )
    priority_aging: int = _var(
        "CHORDFLOW_PRIORITY_AGING", 60, "seconds a batch's chunk waits in the queue before the next go one level up"
    )
    run_ttl: int = _var(
        "CHORDFLOW_RUN_TTL", 86400, "seconds run state (progress stream, flags, snapshots) stays in Redis"
    )
    queue: str = _var("CHORDFLOW_QUEUE", "chordflow", "the queue chunks are sent to and workers consume")
    broker_heartbeat: int = _var(
        "CHORDFLOW_BROKER_HEARTBEAT", 10, "AMQP: seconds between heartbeats; a silent peer is dropped after two"
    )
    queue_type: Literal["classic", "quorum"] = _var(
        "CHORDFLOW_QUEUE_TYPE", "classic", "AMQP: the queue's type, classic (with priorities) or quorum (replicated)"
    )
    worker_heartbeat: int = _var(
        "CHORDFLOW_WORKER_HEARTBEAT", 10, "seconds between a worker's registry refreshes (its entry lives 3 beats)"
    )
    outage_seconds: int = _var(
        "CHORDFLOW_OUTAGE_SECONDS", 60, "seconds a Redis command retries a lost connection; then the task is given back"
    )
    snapshot_cache_bytes: int = _var(
        "CHORDFLOW_SNAPSHOT_CACHE_BYTES", 256 * 2**20, "a worker process keeps decoded snapshots up to this size"
    )
    pool_timeout: float = _var(
        "CHORDFLOW_POOL_TIMEOUT", 30, "seconds a send waits for a free broker connection (an integer)"
    )
    secret_key: str | None = _var(
        "CHORDFLOW_SECRET_KEY", None, "the shared key that signs task messages (worker/cluster/signing.py)", repr=False
    )
    secret_key_file: str | None = _var("CHORDFLOW_SECRET_KEY_FILE", None, "or the path of a file holding it")
    insecure: bool = _var("CHORDFLOW_INSECURE", False, "1/true/yes/on: no key needed; unsigned messages sent and run")

    # Read where they are used (`get`), each call.
    plugins: str = _var("CHORDFLOW_PLUGINS", "", "comma-separated modules that register node types or generators")
    home: Path | None = _var("CHORDFLOW_HOME", None, "directory of the local runs' store; unset: ~/.chordflow")
    max_steps: int | None = _var(
        "CHORDFLOW_MAX_STEPS", None, "node executions in a run without its own max_steps; unset: 10,000"
    )
    log_format: Literal["text", "json"] = _var("CHORDFLOW_LOG_FORMAT", "text", "a worker's log lines: text or json")
    http_connections: int = _var(
        "CHORDFLOW_HTTP_CONNECTIONS", 8, "connections the http node keeps open per process; more calls wait for one"
    )
    llm_model: str | None = _var("CHORDFLOW_LLM_MODEL", None, "the `llm` node's model; 'fake' answers offline")
    repair_generator: str | None = _var("CHORDFLOW_REPAIR_GENERATOR", None, "the repair generator; unset: auto")
    repair_model: str | None = _var("CHORDFLOW_REPAIR_MODEL", None, "the llm repair generator's model; unset: LLM")
    dashboard_basic_auth: str | None = _var(
        "CHORDFLOW_DASHBOARD_BASIC_AUTH", None, "`chordflow dashboard` users: user:password[,...]", repr=False
    )

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable of field `name`."""
        return str(cls.model_fields[name].validation_alias)

    @field_validator(
        "visibility_timeout", "snapshot_inline_bytes", "chunks_per_process", "max_chunk_size", "run_ttl",
        "worker_heartbeat", "snapshot_cache_bytes", "pool_timeout", "max_steps", "http_connections", "outage_seconds",
        "wait_replicas", "broker_heartbeat", "priority_aging", mode="before",
    )  # fmt: skip
    @classmethod
    def _integer(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        if info.field_name == "max_steps" and not value.strip():
            return None
        try:
            return int(value)
        except ValueError:
            name = cls.variable(str(info.field_name))
            raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None

    @field_validator(
        "worker_heartbeat", "pool_timeout", "http_connections", "outage_seconds", "broker_heartbeat", "priority_aging"
    )
    @classmethod
    def _at_least_one(cls, value: float) -> float:
        return max(1, value)

    @field_validator("redis_master_name")
    @classmethod
    def _stripped(cls, value: str) -> str:
        return value.strip()

    @field_validator("snapshot_cache_bytes", "wait_replicas")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        return max(0, value)

    @field_validator("result_backend")
    @classmethod
    def _broker_by_default(cls, value: str, info: ValidationInfo) -> str:
        return value or info.data.get("broker_url") or DEFAULT_BROKER

    @field_validator("insecure", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        return value.strip().lower() in ("1", "true", "yes", "on") if isinstance(value, str) else value

    @field_validator("log_format", "queue_type", mode="before")
    @classmethod
    def _choice(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        name = str(info.field_name)
        choices = {"log_format": ("text", "json"), "queue_type": ("classic", "quorum")}[name]
        value = value.strip().lower() or choices[0]
        if value not in choices:
            raise ValueError(f"{cls.variable(name)} must be '{choices[0]}' or '{choices[1]}', got {value!r}")
        return value


# Callers written for the former dataclass call `dataclasses.replace(settings.load(), ...)`: they still can.
Settings.__dataclass_fields__ = dataclasses.make_dataclass("Settings", list(Settings.model_fields)).__dataclass_fields__

#: Fields whose bad value fails only the code that reads them (`get`); `load()` leaves them at their default.
CHECKED_ON_USE = frozenset({"plugins", "home", "max_steps", "log_format", "http_connections", "llm_model",
                            "repair_generator", "repair_model", "dashboard_basic_auth"})  # fmt: skip
#: CHORDFLOW_* variables read by chordflow's own tests and Makefile, not by chordflow: known, so no warning.
TEST_VARIABLES = frozenset({"CHORDFLOW_FUZZ_EXAMPLES", "CHORDFLOW_TEST_BROKER"})
VARIABLES = tuple(Settings.variable(name) for name in Settings.model_fields)
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
    """The settings of one environment (the values of VARIABLES), every bad value replaced by its field's
    default, and {field: the one line that says why its value is bad}."""
    try:
        return Settings(), {}
    except ValidationError as exc:
        errors = {}
        for error in exc.errors(include_url=False):
            name = next(n for n in Settings.model_fields if Settings.variable(n) == error["loc"][0])
            cause = error.get("ctx", {}).get("error")
            errors.setdefault(name, str(cause) if cause else f"environment variable {error['loc'][0]}: {error['msg']}")
    return Settings(**{name: Settings.model_fields[name].default for name in errors}), errors


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
