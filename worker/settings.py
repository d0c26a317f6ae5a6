"""Settings read from the environment by the scheduler and every worker (DESIGN section 2)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class Settings:
    broker_url: str
    result_backend: str
    visibility_timeout: int  # seconds; must exceed the longest chunk
    snapshot_inline_bytes: int  # snapshots up to this size travel inside each chunk message
    chunks_per_process: int  # auto chunk size: this many chunks per worker process...
    max_chunk_size: int  # ...but never more items than this in one chunk
    run_ttl: int  # seconds that run state (progress stream, flags, snapshots) stays in Redis
    queue: str
    worker_heartbeat: int = 10  # seconds between a worker's registry refreshes (its entry lives 3 beats)
    snapshot_cache_bytes: int = 256 * 2**20  # a worker process keeps decoded snapshots up to this many encoded bytes
    pool_timeout: float = 30.0  # seconds a send waits for a free broker connection before failing with a clear error
    # The shared key that signs task messages (worker/cluster/signing.py): given itself, or the path of a file holding it.
    secret_key: str | None = field(default=None, repr=False)
    secret_key_file: str | None = None
    insecure: bool = False  # CHORDFLOW_INSECURE: no key is needed; unsigned task messages are sent and run


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def load() -> Settings:
    broker = os.environ.get("CHORDFLOW_BROKER_URL") or DEFAULT_BROKER
    return Settings(
        broker_url=broker,
        result_backend=os.environ.get("CHORDFLOW_RESULT_BACKEND") or broker,
        visibility_timeout=_int("CHORDFLOW_VISIBILITY_TIMEOUT", 3600),
        snapshot_inline_bytes=_int("CHORDFLOW_SNAPSHOT_INLINE_BYTES", 16 * 1024),
        chunks_per_process=_int("CHORDFLOW_CHUNKS_PER_PROCESS", 4),
        max_chunk_size=_int("CHORDFLOW_MAX_CHUNK_SIZE", 5000),
        run_ttl=_int("CHORDFLOW_RUN_TTL", 86400),
        queue=os.environ.get("CHORDFLOW_QUEUE") or "chordflow",
        worker_heartbeat=max(1, _int("CHORDFLOW_WORKER_HEARTBEAT", 10)),
        snapshot_cache_bytes=max(0, _int("CHORDFLOW_SNAPSHOT_CACHE_BYTES", 256 * 2**20)),
        pool_timeout=max(1, _int("CHORDFLOW_POOL_TIMEOUT", 30)),
        secret_key=os.environ.get("CHORDFLOW_SECRET_KEY") or None,
        secret_key_file=os.environ.get("CHORDFLOW_SECRET_KEY_FILE") or None,
        insecure=_flag("CHORDFLOW_INSECURE"),
    )
