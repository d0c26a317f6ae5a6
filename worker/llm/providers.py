"""Which provider answers a model name, and the call itself through the provider's official client.

A model name is `"openai/<model>"` (OpenAI and every OpenAI-compatible server: vLLM, Ollama, LM Studio, a LiteLLM
proxy, OpenRouter), `"anthropic/<model>"` (Claude), `"llm/<model id>"` (the `llm` package and its plugins, when
installed), or a bare name, which goes to CHORDFLOW_LLM_PROVIDER (default `openai`). Credentials and endpoints
come from the providers' own variables (OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL);
a node may set `base_url`. Keys never live in the workflow.

One client per (provider, endpoint, key) per process, shared by every item thread of every chunk: its connection
pool keeps connections alive across items. The clients' own retries are off (`max_retries=0`): the engine retries
an item (`max_retries`) and waits out 429s for the whole rate-limit bucket (worker/engine/rate_limits.py).

A request with a `schema` asks for JSON of that shape the provider's own way: OpenAI's `response_format`
(`json_schema`, strict when the schema allows it: every object closed and all its properties required), a tool
Anthropic is made to call (its `input_schema` the schema, `tool_choice` naming it; the answer is the tool call's
input), the `llm` package's `schema` option. The answer's text is then that JSON; worker/llm/schemas.py checks it.

An answer that would be the same for every item — the key refused (401, 403), the model unknown (404), no key in
this process — raises SameForEveryItem: the batch stops at the first one instead of paying for the same refusal
once per item.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from ir.errors import SameForEveryItem
from worker import settings, tracing

#: Providers a model name may start with (`<provider>/<model>`), and the one a bare name goes to by default.
PROVIDERS = ("openai", "anthropic", "llm")
DEFAULT_PROVIDER = "openai"
#: The variable holding each provider's key, and its endpoint's.
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
URL_VARIABLES = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}
#: What Anthropic's API requires and OpenAI's does not: an answer's length cap, when the node sets none.
ANTHROPIC_MAX_TOKENS = 4096
#: HTTP statuses a provider answers the same way for every request of a batch (the key, the model).
SAME_FOR_EVERY_ITEM = {401: "refused the key", 403: "refused the key", 404: "does not know the model"}
#: Keywords whose values are data, not schemas: never walked for objects.
LITERAL_KEYWORDS = {"enum", "const", "default", "examples", "required", "title", "description"}
#: What the Anthropic tool standing for the answer's shape says it is for.
TOOL_DESCRIPTION = "Give your answer by calling this tool: its input is the answer."


@dataclass(frozen=True)
class Model:
    """A model name split: `provider` and the provider's own `name` for it; `written`, the name as written."""

    provider: str
    name: str
    written: str


@dataclass(frozen=True)
class Request:
    """One call: chat `messages` ({role, content}), and the options a node may set (None: the provider's default);
    `schema`: the JSON Schema (an object at its root) the answer must match."""

    messages: list[dict[str, str]]
    system: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    base_url: str | None = None
    schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class Answer:
    """The model's text, the model that answered, and the tokens it billed (None where it does not say);
    `cached`: a kept answer reused (worker/llm/answers.py), billed nothing this time; `batch`: answered in a provider
    batch (worker/llm/provider_batches.py), billed at its price."""

    text: str
    model: str
    input_tokens: int | None
    output_tokens: int | None
    cached: bool = False
    batch: bool = False


def model_of(written: str) -> Model:
    """`written` split into provider and model: a known provider prefix, else the default provider."""
    provider, slash, rest = written.partition("/")
    if slash and provider in PROVIDERS and rest:
        return Model(provider, rest, written)
    return Model(settings.get("llm_provider") or DEFAULT_PROVIDER, written, written)


def missing_key(model: Model) -> str | None:
    """The provider variable this process lacks to call `model` (None: nothing missing)."""
    variable = KEY_VARIABLES.get(model.provider)
    return variable if variable is not None and not os.environ.get(variable) else None


def missing_key_message(model: Model) -> str | None:
    """One line saying what `model` needs and how to run offline, or None when its key is set."""
    variable = missing_key(model)
    if variable is None:
        return None
    return f'model \'{model.written}\' needs {variable}; "model": "fake" answers offline'


def call(model: Model, request: Request) -> Answer:
    """Ask `model`; the provider's own exceptions pass through (429s, timeouts, a bad request), but for those that
    would be the same for every item: SameForEveryItem."""
    if (problem := missing_key_message(model)) is not None:
        raise SameForEveryItem(problem)
    try:
        with tracing.span(f"chat {model.name}", _asked(model, request), kind="client") as current:
            answer = _ASK[model.provider](model, request)
            if current is not None:
                current.set_attributes(_answered(answer))
            return answer
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        if status in SAME_FOR_EVERY_ITEM:
            raise SameForEveryItem(f"model '{model.written}': the provider {SAME_FOR_EVERY_ITEM[status]} "
                                   f"(HTTP {status}: {_message(exc)})") from exc  # fmt: skip
        raise


def _asked(model: Model, request: Request) -> dict[str, Any]:
    """A model call's span attributes, in OpenTelemetry's GenAI vocabulary: what was asked."""
    if not tracing.ON:
        return {}
    asked = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": model.provider,
        "gen_ai.request.model": model.name,
    }
    if request.max_tokens is not None:
        asked["gen_ai.request.max_tokens"] = request.max_tokens
    if request.temperature is not None:
        asked["gen_ai.request.temperature"] = request.temperature
    return asked


def _answered(answer: Answer) -> dict[str, Any]:
    """What the provider said it billed, and which model answered."""
    told = {"gen_ai.response.model": answer.model, "gen_ai.usage.input_tokens": answer.input_tokens,
            "gen_ai.usage.output_tokens": answer.output_tokens}  # fmt: skip
    return {k: v for k, v in told.items() if v is not None}


def _message(exc: BaseException) -> str:
    """A provider error's own message, on one line and short."""
    return " ".join(str(getattr(exc, "message", None) or exc).split())[:300]


_clients: dict[tuple[int, str, str | None, str | None], Any] = {}
_clients_lock = threading.Lock()


def client(provider: str, base_url: str | None) -> Any:
    """This process's client for `provider` at `base_url` (else the provider's variable, else its own default); by
    pid too: a forked pool process makes its own (a connection pool is not shared across a fork)."""
    key = os.environ.get(KEY_VARIABLES[provider])
    url = base_url or os.environ.get(URL_VARIABLES[provider]) or None
    with _clients_lock:
        found = _clients.get((os.getpid(), provider, url, key))
        if found is None:
            if provider == "openai":
                import openai  # a worker that never calls a model never pays its import

                found = openai.OpenAI(api_key=key, base_url=url, max_retries=0)
            else:
                import anthropic

                found = anthropic.Anthropic(api_key=key, base_url=url, max_retries=0)
            _clients[(os.getpid(), provider, url, key)] = found
        return found


def openai_body(model: Model, request: Request) -> dict[str, Any]:
    """The chat-completions request body for `request` (what a call sends, and a provider batch's line holds)."""
    messages = ([{"role": "system", "content": request.system}] if request.system else []) + request.messages
    body = {"model": model.name, "messages": messages}
    options = {"temperature": request.temperature, "max_tokens": request.max_tokens}
    body |= {name: value for name, value in options.items() if value is not None}
    if request.schema is not None:
        shape = {"name": schema_name(request.schema), "schema": request.schema, "strict": strict(request.schema)}
        body["response_format"] = {"type": "json_schema", "json_schema": shape}
    return body


def openai_answer(response: Any, model: Model) -> Answer:
    """The Answer in a chat completion (the client's object)."""
    usage = getattr(response, "usage", None)
    message = response.choices[0].message
    text = message.content or getattr(message, "refusal", None) or ""  # a refusal: not JSON, so asked again
    return Answer(text, getattr(response, "model", None) or model.name, _tokens(usage, "prompt_tokens"),
                  _tokens(usage, "completion_tokens"))  # fmt: skip


def _openai(model: Model, request: Request) -> Answer:
    body = openai_body(model, request)
    timeout = {} if request.timeout is None else {"timeout": request.timeout}
    response = client("openai", request.base_url).chat.completions.create(**body, **timeout)
    return openai_answer(response, model)


def anthropic_body(model: Model, request: Request) -> dict[str, Any]:
    """The messages request body for `request` (what a call sends, and a provider batch's line holds)."""
    body: dict[str, Any] = {
        "model": model.name, "max_tokens": request.max_tokens or ANTHROPIC_MAX_TOKENS, "messages": request.messages,
    }  # fmt: skip
    if request.system is not None:
        body["system"] = request.system
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.schema is not None:
        name = schema_name(request.schema)
        body["tools"] = [{"name": name, "description": TOOL_DESCRIPTION, "input_schema": request.schema}]
        body["tool_choice"] = {"type": "tool", "name": name}
    return body


def anthropic_answer(response: Any, model: Model, schema: dict[str, Any] | None) -> Answer:
    """The Answer in a message (the client's object): with a `schema`, the forced tool call's input as JSON."""
    calls = [block for block in response.content if getattr(block, "type", "") == "tool_use"]
    if schema is not None and calls:
        text = json.dumps(calls[0].input)
    else:
        text = "".join(getattr(b, "text", "") for b in response.content if getattr(b, "type", "") == "text")
    usage = getattr(response, "usage", None)
    return Answer(text, getattr(response, "model", None) or model.name, _tokens(usage, "input_tokens"),
                  _tokens(usage, "output_tokens"))  # fmt: skip


def _anthropic(model: Model, request: Request) -> Answer:
    body = anthropic_body(model, request)
    options: dict[str, Any] = {} if request.timeout is None else {"timeout": request.timeout}
    if "temperature" in body:  # the messages API takes it; newer clients no longer name it as an argument
        options["extra_body"] = {"temperature": body.pop("temperature")}
    response = client("anthropic", request.base_url).messages.create(**body, **options)
    return anthropic_answer(response, model, request.schema)


def _llm_package(model: Model, request: Request) -> Answer:
    try:
        import llm
    except ImportError:
        raise SameForEveryItem(f"model '{model.written}' needs the `llm` package (pip install llm)") from None
    handle = llm.get_model(model.name)
    prompt = "\n\n".join(m["content"] for m in request.messages)
    options: dict[str, Any] = {} if request.temperature is None else {"temperature": request.temperature}
    if request.schema is not None:
        options["schema"] = request.schema
    response = handle.prompt(prompt, system=request.system, **options)
    text = response.text()  # an `llm` Response is lazy: the request happens here
    usage = response.usage() if callable(getattr(response, "usage", None)) else None
    return Answer(text, str(getattr(handle, "model_id", model.name)), _tokens(usage, "input"), _tokens(usage, "output"))


def schema_name(schema: dict[str, Any]) -> str:
    """The name a provider shows the model for the answer's shape: the schema's `title` when it is a valid name
    (letters, digits, `_`, `-`, at most 64), else "answer"."""
    title = schema.get("title")
    return title if isinstance(title, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", title) else "answer"


def strict(schema: Any) -> bool:
    """Whether OpenAI's strict mode (the answer constrained to the schema) takes `schema`: every object in it lists
    each of its properties as required and allows no others. Otherwise the request is not strict, and the answer's
    validation (worker/llm/schemas.py) catches what the model gets wrong."""
    if isinstance(schema, list):
        return all(strict(part) for part in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        names = set(schema.get("properties") or {})
        if schema.get("additionalProperties") is not False or set(schema.get("required") or ()) != names:
            return False
    return all(strict(value) for key, value in schema.items() if key not in LITERAL_KEYWORDS)


_ASK = {"openai": _openai, "anthropic": _anthropic, "llm": _llm_package}


def _tokens(usage: Any, name: str) -> int | None:
    value = getattr(usage, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
