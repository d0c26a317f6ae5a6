"""`llm`: one prompt to a language model, with a deterministic fake for tests and offline runs.

The fake answers when the model is "fake" (or "fake-throttled:N"), when CHORDFLOW_LLM_MODEL is "fake", or
when the `llm` package is not installed; otherwise the `llm` package does the call. Every call appends a
usage record to the root accumulator `__llm_calls__` (batch items' records are merged in index order), with
`input_tokens`/`output_tokens` when the model reports them; `tokens_used` charges them to the node's
`tokens_per_minute` bucket. A rate-limit error from the model library raises `Throttled`, so the engine waits
and asks again without counting an attempt (worker/engine/rate_limits.py).

The fake's token counts are words (whitespace-separated): input = words of system + prompt, output = words of
the answer. `fake-throttled:N` is a test aid: it answers Throttled (Retry-After FAKE_RETRY_AFTER seconds) to
the first N calls of each (model, system, prompt) in this process, then like `fake`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from typing import Any

from pocketflow import Node

from ir.errors import Throttled
from worker import settings
from worker.engine.rate_limits import DEFAULT_MAX_WAIT
from worker.nodes.http import parse_retry_after
from worker.nodes.params import Param
from worker.nodes.registry import register

FAKE = "fake"
FAKE_THROTTLED = "fake-throttled:"
#: Seconds the throttled fake asks to wait: short, so tests stay fast, and fixed, so they stay deterministic.
FAKE_RETRY_AFTER = 0.05

_throttled_calls: dict[tuple[str, str | None, str], int] = {}
_throttled_lock = threading.Lock()


def fake_response(model: str | None, system: str | None, prompt: str) -> str:
    """The same inputs always give the same answer, so tests and resumed runs can compare."""
    digest = hashlib.sha256(json.dumps([model, system, prompt]).encode("utf-8")).hexdigest()[:10]
    return f"fake:{digest}: {prompt[:40]}"


def fake_tokens(system: str | None, prompt: str, response: str) -> tuple[int, int]:
    """(input, output) tokens the fake reports: whitespace-separated words, so tests can predict them."""
    return len((system or "").split()) + len(prompt.split()), len(response.split())


def is_fake(model: str | None) -> bool:
    """Whether `model` names the offline fake ("fake", "fake-throttled:N")."""
    return model == FAKE or (model or "").startswith(FAKE_THROTTLED)


def _fake_throttles(model: str) -> bool:
    """False for a fake-throttled:N model name whose N is not a whole number (0 or more)."""
    return not model.startswith(FAKE_THROTTLED) or model[len(FAKE_THROTTLED) :].isdigit()


def llm_package() -> Any | None:
    """The `llm` package, or None when it is not importable."""
    try:
        import llm
    except ImportError:
        return None
    return llm


def _attr(obj: Any, name: str) -> Any:
    """`obj.name`, or None: some libraries' attributes are properties that raise when unset."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def rate_limited(exc: BaseException) -> BaseException | None:
    """The exception in `exc`'s chain that says "too many requests" (a class named *RateLimit*, or
    `status_code` 429), or None. Model libraries often wrap the provider's error, so causes count too."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any("RateLimit" in cls.__name__ for cls in type(current).__mro__) or _attr(current, "status_code") == 429:
            return current
        current = current.__cause__ or current.__context__
    return None


def retry_after_of(exc: BaseException) -> float | None:
    """Seconds the service asked to wait: a `retry_after` attribute, else a Retry-After header on the error
    or on its `response`; None when none says."""
    value = _attr(exc, "retry_after")
    if value is None:
        for headers in (_attr(exc, "headers"), _attr(_attr(exc, "response"), "headers")):
            if headers is not None and callable(_attr(headers, "get")):
                value = headers.get("retry-after") or headers.get("Retry-After")
                if value is not None:
                    break
    return parse_retry_after(value)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reported_tokens(response: Any) -> tuple[int | None, int | None]:
    """(input, output) tokens an `llm` Response reports (`.usage()` in recent versions); None where it does not."""
    usage = _attr(response, "usage")
    if callable(usage):
        try:
            usage = usage()
        except Exception:  # a model that cannot say: the call itself succeeded
            usage = None
    return _count(_attr(usage, "input")), _count(_attr(usage, "output"))


def usage_totals(store: Mapping[str, Any]) -> dict[str, int] | None:
    """{"calls", "input_tokens", "output_tokens"} over the store's `__llm_calls__` (None without that list):
    what `chordflow status` and `results` report. Entries without counts add a call and no tokens."""
    calls = store.get("__llm_calls__")
    if not isinstance(calls, list):
        return None
    totals = {"calls": len(calls), "input_tokens": 0, "output_tokens": 0}
    for entry in calls:
        if isinstance(entry, dict):
            for key in ("input_tokens", "output_tokens"):
                totals[key] += _count(entry.get(key)) or 0
    return totals


def _fake_call(model: str | None, system: str | None, prompt: str, max_wait: float) -> dict[str, Any]:
    if model is not None and model.startswith(FAKE_THROTTLED):
        limit = int(model[len(FAKE_THROTTLED) :])
        with _throttled_lock:
            seen = _throttled_calls[(model, system, prompt)] = _throttled_calls.get((model, system, prompt), 0) + 1
        if seen <= limit:
            raise Throttled(
                f"fake model {model}: rate limited (call {seen} of the first {limit})",
                retry_after=FAKE_RETRY_AFTER,
                max_wait=max_wait,
            )
    response = fake_response(model, system, prompt)
    input_tokens, output_tokens = fake_tokens(system, prompt, response)
    return {"response": response, "model": FAKE, "input_tokens": input_tokens, "output_tokens": output_tokens}


#: The llm node's params, in the order prep reads them (worker/nodes/params.py).
PARAMS = {
    "prompt": Param("(required) the prompt text", str, required=True),
    "temperature": Param("sampling temperature (number), passed to the model when given", (int, float)),
    "model": Param(
        "model name for the `llm` package (default: CHORDFLOW_LLM_MODEL, else llm's default); 'fake' gives a "
        "deterministic offline answer ('fake-throttled:N': throttled N times first, a test aid)",
        str,
    ),
    "system": Param("system prompt", str),
    "max_throttle_wait": Param(
        "seconds (number > 0, default 300) this call may spend in all waiting out the model's rate-limit errors "
        "before its item fails",
        (int, float), default=DEFAULT_MAX_WAIT, what="a positive number of seconds", check=lambda t: t > 0,
    ),
}  # fmt: skip


@register("llm")
class LlmNode(Node):
    """Writes the model's `response`; the call happens in exec so the node's retries apply."""

    PARAMS = PARAMS

    def prep(self, shared: Any) -> dict[str, Any]:
        prompt, temperature, model, system, max_wait = (PARAMS[name].get("llm", self.params, name) for name in PARAMS)
        model = model or settings.get("llm_model")
        if model is not None and not _fake_throttles(model):
            raise ValueError(f"llm: model {model!r} must be 'fake-throttled:N' with N a whole number")
        return {"prompt": prompt, "model": model, "system": system, "temp": temperature, "max_wait": float(max_wait)}

    def exec(self, prep_res: dict[str, Any]) -> dict[str, Any]:
        prompt, model, system = prep_res["prompt"], prep_res["model"], prep_res["system"]
        package = None if is_fake(model) or settings.get("llm_model") == FAKE else llm_package()
        if package is None:
            return _fake_call(model, system, prompt, prep_res["max_wait"])
        options = {} if prep_res["temp"] is None else {"temperature": prep_res["temp"]}
        try:
            handle = package.get_model(model) if model else package.get_model()
            response = handle.prompt(prompt, system=system, **options)
            text = response.text()  # an `llm` Response is lazy: the request happens here
        except Exception as exc:
            if (limited := rate_limited(exc)) is not None:
                raise Throttled(str(exc), retry_after=retry_after_of(limited), max_wait=prep_res["max_wait"]) from exc
            raise
        input_tokens, output_tokens = reported_tokens(response)
        name = str(getattr(handle, "model_id", model))
        return {"response": text, "model": name, "input_tokens": input_tokens, "output_tokens": output_tokens}

    def tokens_used(self, exec_res: dict[str, Any]) -> int:
        """What the call cost, for the engine's `tokens_per_minute` bucket (0 when the model does not say)."""
        return (exec_res.get("input_tokens") or 0) + (exec_res.get("output_tokens") or 0)

    def post(self, shared: Any, prep_res: dict[str, Any], exec_res: dict[str, Any]) -> str:
        response = exec_res["response"]
        shared["response"] = response
        usage = {
            "node": self.type_name,
            "model": exec_res["model"],
            "prompt_chars": len(prep_res["prompt"]),
            "response_chars": len(response),
        }
        for key in ("input_tokens", "output_tokens"):
            if exec_res.get(key) is not None:
                usage[key] = exec_res[key]
        calls = shared.get("__llm_calls__")
        if isinstance(calls, list):
            calls.append(usage)
        else:
            shared["__llm_calls__"] = [usage]
        return "default"
