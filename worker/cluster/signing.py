"""Signed task messages: only holders of the cluster's shared key can make a worker run anything.

Whoever can write to the broker could otherwise hand every worker a node spec to run (a `shell` node is
a command). So every task message a chordflow app publishes - from a client or from a worker (a chord
body, the next `advance`, a retry) - carries an HMAC-SHA256 in the `chordflow_signature` header, and a
worker drops a message whose signature does not verify before any of it is used.

- What is signed: the task name, the task id, the message's expiry and the whole body - args, kwargs, and the
  callbacks, errbacks, chain and chord body that the worker would publish (and sign) after running the task.
  Signing only args and kwargs would let a replayed message carry a new chord body that the worker then signs.
  The canonical encoding (`canonical`) survives the msgpack round trip: tuples become lists, bytes stay bytes.
- Replays: a message expires (`chordflow_expires`, signed) one run TTL after it was sent, and a task that ran to
  the end leaves `cf:done:<task id>` in the state Redis for a run TTL (`SignedTask.after_return`): a delivery of
  it again is acknowledged and not run (`SignedTask.before_start`). A delivery whose task never got there (its
  worker was killed mid-task) has no such mark and runs again.
- Runs: what a worker runs of a run comes from its record in Redis, not from a message. So the record keeps
  a signature of the run's workflow and dataset job (`Signer.sign_run`, when the run is recorded or given an
  edited workflow) and workers refuse a run whose record does not match it (`check_run`).
- Schedules: a worker makes runs of a schedule's template in Redis (worker/cluster/schedules.py). The client that
  adds it signs it (`Signer.sign_schedule`); a worker makes no run of a template that does not verify
  (`schedule_verified`) and signs each run it records with its own key, as a submitting client would.
- Publish: `SigningAMQP.as_task_v2`, where the app builds every task message. It belongs to the app, not
  to the process (a `before_task_publish` receiver would sign for every Celery app in the process, with
  whatever key the environment holds).
- Receive: `verifying_strategy`, the worker's entry point for each message of a task (`Task.Strategy`).
  It checks before the message becomes a request: no state, result, event or chord bookkeeping is ever
  made from a forged message. (Raising `Reject` from the task would be too late: Celery 5.7 then records
  the failure against the message's own chord and errbacks, which publishes them.)
- Key: CHORDFLOW_SECRET_KEY, or the file named by CHORDFLOW_SECRET_KEY_FILE (e.g. a mounted secret).
  Without one, workers refuse to start and clients refuse to send, unless CHORDFLOW_INSECURE=1.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, Task, states
from celery.app.amqp import AMQP
from celery.exceptions import Ignore
from celery.worker.strategy import default as default_strategy

from ir.errors import SigningKeyError, WorkflowAltered, one_line
from worker import settings
from worker.cluster import aging, messages
from worker.cluster.state.keys import done_key
from worker.cluster.state.runstate import client
from worker.runs.record import RunRecord
from worker.settings import Settings

log = logging.getLogger(__name__)

#: The message header that carries the signature (hex HMAC-SHA256).
HEADER = "chordflow_signature"
#: Shorter keys could be guessed offline from any message read off the broker.
MIN_KEY_BYTES = 16
#: The message header that carries its expiry (Unix seconds, an int), signed with the rest.
EXPIRES = "chordflow_expires"
#: Part of every signed text: a new encoding gets a new tag, so old signatures never verify under it.
VERSION = "chordflow-signature-2"
#: The tag of a run's signature: a text of its own, so a run's signature never verifies as a message's.
RUN_VERSION = "chordflow-run-1"
#: The tag of a schedule's signature: a text of its own, never verifying as a run's or a message's.
SCHEDULE_VERSION = "chordflow-schedule-1"
#: Why a message was dropped, when its signature does not verify.
UNSIGNED = (
    "the message has no valid signature (not sent with this cluster's CHORDFLOW_SECRET_KEY, or altered on the way)"
)
HOW_TO_SET = (
    "set CHORDFLOW_SECRET_KEY (or CHORDFLOW_SECRET_KEY_FILE, the path of a file holding it) to the cluster's shared "
    "key on every worker and client; make one with: python -c 'import secrets; print(secrets.token_hex(32))'"
)


def load_key(s: Settings) -> bytes | None:
    """The shared key from the settings (CHORDFLOW_SECRET_KEY, or the file CHORDFLOW_SECRET_KEY_FILE names), or None."""
    if s.secret_key and s.secret_key_file:
        raise SigningKeyError("set CHORDFLOW_SECRET_KEY or CHORDFLOW_SECRET_KEY_FILE, not both")
    if s.secret_key:
        key, source = s.secret_key.encode(), "CHORDFLOW_SECRET_KEY"
    elif s.secret_key_file:
        source = f"CHORDFLOW_SECRET_KEY_FILE ({s.secret_key_file})"
        try:
            with open(s.secret_key_file, "rb") as f:
                key = f.read().strip()  # a secret written with `echo` ends with a newline
        except OSError as exc:
            raise SigningKeyError(f"{source}: cannot read the key: {exc.strerror or exc}") from None
    else:
        return None
    if len(key) < MIN_KEY_BYTES:
        raise SigningKeyError(f"{source}: the key has {len(key)} bytes, it needs {MIN_KEY_BYTES} or more; {HOW_TO_SET}")
    return key


def canonical(value: Any) -> bytes:
    """One byte string per value, equal for a value and its msgpack round trip (tuple or list alike).

    Each part is a type tag plus a length or a fixed width, so no two different values encode alike;
    maps are ordered by their encoded keys. Raises TypeError for a type msgpack would not carry either.
    """
    out = bytearray()
    _feed(value, out.extend)
    return bytes(out)


def _feed(value: Any, write: Callable[[bytes], Any]) -> None:
    """`canonical(value)`, written part by part (straight into the HMAC when signing: no copy of big bytes).

    The most common types are tested first (an `isinstance` of an ABC costs more than the rest together)."""
    if isinstance(value, str):
        _sized(value.encode(), b"S", write)
    elif isinstance(value, dict):  # a Celery Signature too (a dict subclass)
        _feed_map(value, write)
    elif isinstance(value, (list, tuple)):
        write(b"L" + struct.pack(">Q", len(value)))
        for each in value:
            _feed(each, write)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        _sized(value, b"B", write)
    elif value is None or value is True or value is False:
        write(b"N" if value is None else b"T" if value else b"F")
    elif isinstance(value, int):
        _sized(str(value).encode(), b"I", write)
    elif isinstance(value, float):
        write(b"D" + struct.pack(">d", value))
    elif isinstance(value, Mapping):
        _feed_map(value, write)
    else:
        raise TypeError(f"cannot sign a task message holding a {type(value).__name__}")


def _feed_map(value: Mapping[Any, Any], write: Callable[[bytes], Any]) -> None:
    write(b"M" + struct.pack(">Q", len(value)))
    # Distinct keys encode distinctly, so this order is total and the same on both sides.
    for key, each in sorted([(canonical(k), v) for k, v in value.items()], key=_first):
        write(key)
        _feed(each, write)


def _first(pair: tuple[bytes, Any]) -> bytes:
    return pair[0]


def _sized(data: bytes | bytearray | memoryview, tag: bytes, write: Callable[[bytes], Any]) -> None:
    write(tag + struct.pack(">Q", memoryview(data).nbytes))
    write(data)


class Signer:
    """HMAC-SHA256 of (name, id, expiry, body) under one key; of (run id, workflow, dataset) for a run record.
    The key is never shown (no repr of it)."""

    def __init__(self, key: bytes):
        self._key = key

    def __repr__(self) -> str:
        return "Signer(<key>)"

    def sign(self, name: str, task_id: str, body: Any, expires: int) -> str:
        return self._mac([VERSION, name, task_id, expires, body])

    def verify(self, name: Any, task_id: Any, body: Any, expires: Any, signature: Any) -> bool:
        if not (isinstance(name, str) and isinstance(task_id, str) and type(expires) is int):
            return False
        return _matches(lambda: self.sign(name, task_id, body, expires), signature)

    def sign_run(self, run_id: str, workflow: Any, dataset: Any) -> str:
        """The signature a run record keeps: its workflow and its dataset job (None: a plain run), as the record
        holds them once read back (worker/cluster/state/runs.py signs what it wrote, decoded again)."""
        return self._mac([RUN_VERSION, run_id, workflow, dataset])

    def sign_schedule(self, spec: Any) -> str:
        """The signature a schedule keeps (worker/cluster/state/schedules.py `Schedule.spec`: its name, cron, workflow,
        initial store...), as a worker reads it back: workers make runs only of a schedule that matches it."""
        return self._mac([SCHEDULE_VERSION, spec])

    def _mac(self, parts: list[Any]) -> str:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        _feed(parts, mac.update)
        return mac.hexdigest()


def _matches(expected: Callable[[], str], signature: Any) -> bool:
    """Whether `signature` is the one `expected()` computes; False for what no signer could have signed."""
    if not isinstance(signature, str):
        return False
    try:
        mac = expected()
    except (TypeError, UnicodeEncodeError, RecursionError):
        return False
    return hmac.compare_digest(mac.encode(), signature.encode("utf-8", "replace"))


def check_run(signer: Signer | None, run_id: str, record: RunRecord) -> None:
    """Raise WorkflowAltered unless run `run_id`'s workflow and dataset job are what a key holder recorded for
    this run: Redis holds data, and whoever can write it must not choose what a worker runs. The caller fails the
    run (its one WARNING line says why). An insecure worker (no signer) checks nothing."""
    if signer is None:
        return
    if not _matches(lambda: signer.sign_run(run_id, record.workflow, record.dataset), record.signature):
        raise WorkflowAltered(f"run {run_id}: its workflow in Redis does not match its signature (altered?); refused")


def schedule_verified(signer: Signer | None, spec: Any, signature: Any) -> bool:
    """Whether a schedule's template in Redis is what a key holder added (`Signer.sign_schedule`): a worker makes no
    run of one that is not. An insecure worker (no signer) checks nothing."""
    return signer is None or _matches(lambda: signer.sign_schedule(spec), signature)


def signer_for(s: Settings) -> Signer | None:
    key = load_key(s)
    return Signer(key) if key is not None else None


def publishing_signer(app: Celery) -> Signer | None:
    """The signer an app's messages go out with; None only when CHORDFLOW_INSECURE allows unsigned ones."""
    signer = getattr(app, "signer", None)
    if signer is None and not getattr(app, "insecure", False):
        raise SigningKeyError(f"refusing to send unsigned task messages (workers drop them): {HOW_TO_SET}")
    return signer


def run_ttl(app: Celery) -> int:
    """CHORDFLOW_RUN_TTL of the app's settings (of the environment for a plain app): how long a message stays
    valid, and how long a finished task's mark is kept."""
    return (getattr(app, "chordflow_settings", None) or settings.load()).run_ttl


class SigningAMQP(AMQP):
    """Celery's message builder, plus the expiry and signature headers on every task message the app sends."""

    def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(task_id, name, *args, **kwargs)
        signer = publishing_signer(self.app)
        if signer is not None:
            expires = int(time.time()) + run_ttl(self.app)
            message.headers[EXPIRES] = expires
            message.headers[HEADER] = signer.sign(name, task_id, message.body, expires)
        return message


def sign_messages(app: Celery, signer: Signer | None) -> Celery:
    """Make a plain Celery app (one that has not sent anything yet) sign like chordflow's apps do.

    For a client that is not a chordflow app but sends tasks to chordflow workers (the bench's raw-Celery
    baselines). Same as building it with `Celery(amqp=SigningAMQP)` and giving it a `signer`.
    """
    if "amqp" in vars(app):
        raise RuntimeError("sign_messages: the app has already built its message sender")
    app.amqp_cls = SigningAMQP
    app.signer = signer
    app.insecure = signer is None
    return app


def verifying_strategy(task: Task, app: Celery, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """Celery's default strategy behind a signature check: a message that fails it is acked and logged, never run.

    Only protocol-2 messages are accepted (chordflow never sends protocol 1; its task, id and body live elsewhere).
    An insecure worker (no key) accepts every message, as plain Celery does.
    """
    handle = default_strategy(task, app, consumer, **kwargs)
    signer: Signer | None = getattr(app, "signer", None)
    if signer is None:
        return handle

    def verify_then_handle(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **rest: Any) -> Any:
        headers = message.headers or {}
        if body is not None or not _verified(signer, headers, message):
            why = UNSIGNED
        elif headers[EXPIRES] < time.time():
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(headers[EXPIRES]))
            why = f"the message expired at {when} (older than CHORDFLOW_RUN_TTL: a replayed message?)"
        else:
            return handle(message, body, ack, reject, callbacks, **rest)
        name, task_id = (one_line(str(headers.get(k) or "?"))[:200] for k in ("task", "id"))
        log.warning("dropped task %s[%s]: %s", name, task_id, why)
        ack(log, consumer.connection_errors)
        return None

    return verify_then_handle


def _verified(signer: Signer, headers: Mapping[str, Any], message: Any) -> bool:
    """Whether the message is what a key holder signed. Never raises: whatever fails here is a drop, not an
    error in the worker's consumer (which would take the worker down)."""
    try:
        payload = message.payload  # decoded with the app's accepted content types only (never pickle)
        return signer.verify(headers.get("task"), headers.get("id"), payload, headers.get(EXPIRES), headers.get(HEADER))
    except Exception:
        return False


class SignedTask(Task):
    """The base of every task on a chordflow app (built-ins too): its messages reach it only if signed, and a
    task that ran to the end does not run again for another delivery of its message (a replay, or a redelivery
    whose acknowledgement was lost)."""

    Strategy = "worker.cluster.signing:verifying_strategy"

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """Ignore (acknowledged, nothing stored or counted: a chunk's window counts it once) a task marked done, and
        a message another delivery of which began first (a copy sent by aging, or the original it copies)."""
        if _marks_done(self) and client().exists(done_key(task_id)):
            log.warning(
                "skipped task %s[%s]: it ran to the end already (a replayed message, or one delivered again after "
                "its acknowledgement was lost)",
                self.name,
                task_id,
            )
            raise Ignore()
        if not aging.begin(client(), messages.run_of(tuple(args or ())), task_id, run_ttl(self.app)):
            log.info("skipped task %s[%s]: a copy of its message began first (aging)", self.name, task_id)
            raise Ignore()

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Mark the task done once its result is stored and its chunk counted (one SET per task): a worker killed
        before this point has its message delivered again, and that delivery runs."""
        if status == states.SUCCESS and _marks_done(self):
            client().set(done_key(task_id), 1, ex=run_ttl(self.app))


def _marks_done(task: Task) -> bool:
    """Replays are refused on signed workers, for tasks delivered from the broker (not called directly or eagerly)."""
    request = task.request
    return getattr(task.app, "signer", None) is not None and not (request.called_directly or request.is_eager)


def worker_may_start(app: Celery) -> None:
    """Raise SigningKeyError (one line) unless the worker's app has a usable key or runs insecure on purpose."""
    if app.signer is None and not app.insecure:
        raise SigningKeyError(
            f"refusing to start a worker without a signing key: {HOW_TO_SET} (or, on a private broker only, "
            "run unsigned tasks: chordflow worker --insecure, or CHORDFLOW_INSECURE=1)"
        )
