"""`llm`: one prompt to a language model, with a deterministic fake for tests and offline runs.

The fake answers when the model is "fake", when CHORDFLOW_LLM_MODEL is "fake", or when the `llm`
package is not installed; otherwise the `llm` package does the call. Every call appends a usage
record to the root accumulator `__llm_calls__` (batch items' records are merged in index order).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pocketflow import Node

from worker import settings
from worker.nodes.params import param
from worker.nodes.registry import register

FAKE = "fake"


def fake_response(model: str | None, system: str | None, prompt: str) -> str:
    """The same inputs always give the same answer, so tests and resumed runs can compare."""
    digest = hashlib.sha256(json.dumps([model, system, prompt]).encode("utf-8")).hexdigest()[:10]
    return f"fake:{digest}: {prompt[:40]}"


def llm_package() -> Any | None:
    """The `llm` package, or None when it is not importable."""
    try:
        import llm
    except ImportError:
        return None
    return llm


@register("llm")
class LlmNode(Node):
    """Writes the model's `response`; the call happens in exec so the node's retries apply."""

    PARAMS = {
        "prompt": "(required) the prompt text",
        "model": "model name for the `llm` package (default: CHORDFLOW_LLM_MODEL, else llm's default); "
        "'fake' gives a deterministic offline answer",
        "system": "system prompt",
        "temperature": "sampling temperature (number), passed to the model when given",
    }

    def prep(self, shared: Any) -> dict[str, Any]:
        prompt = param("llm", self.params, "prompt", str, required=True)
        temperature = param("llm", self.params, "temperature", (int, float))
        model = param("llm", self.params, "model", str) or settings.get("llm_model")
        system = param("llm", self.params, "system", str)
        return {"prompt": prompt, "model": model, "system": system, "temp": temperature}

    def exec(self, prep_res: dict[str, Any]) -> tuple[str, str]:
        prompt, model, system = prep_res["prompt"], prep_res["model"], prep_res["system"]
        package = None if FAKE in (model, settings.get("llm_model")) else llm_package()
        if package is None:
            return fake_response(model, system, prompt), FAKE
        options = {} if prep_res["temp"] is None else {"temperature": prep_res["temp"]}
        handle = package.get_model(model) if model else package.get_model()
        return handle.prompt(prompt, system=system, **options).text(), str(getattr(handle, "model_id", model))

    def post(self, shared: Any, prep_res: dict[str, Any], exec_res: tuple[str, str]) -> str:
        response, model_name = exec_res
        shared["response"] = response
        usage = {
            "node": self.type_name,
            "model": model_name,
            "prompt_chars": len(prep_res["prompt"]),
            "response_chars": len(response),
        }
        calls = shared.get("__llm_calls__")
        if isinstance(calls, list):
            calls.append(usage)
        else:
            shared["__llm_calls__"] = [usage]
        return "default"
