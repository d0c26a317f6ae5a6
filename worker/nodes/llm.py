"""`llm`: one chat with a language model through its provider's official client (worker/llm/providers.py).

`model` names the provider and model (`openai/gpt-4o-mini`, `anthropic/claude-sonnet-4-5`, a bare name for
CHORDFLOW_LLM_PROVIDER); `"fake"` (or CHORDFLOW_LLM_MODEL=fake, which makes every llm node offline) answers
offline (worker/llm/fake.py), and nothing else ever does. Every call appends a usage record to the root
accumulator `__llm_calls__` (batch items' records are merged in index order), with `input_tokens` and
`output_tokens` as the provider billed them; `tokens_used` charges them to the node's `tokens_per_minute` bucket.
A 429 (or a 503/529 asking to come back later) raises `Throttled`, so the engine waits and asks again without
counting an attempt (worker/engine/rate_limits.py). A refused key, an unknown model, a missing key or no model at
all raise SameForEveryItem: the batch stops at the first instead of once per item.

`schema` asks for JSON of that shape and writes the parsed answer to `data` (worker/llm/schemas.py): an invalid
answer is asked again (`schema_retries`) with what was wrong, each request its own `__llm_calls__` record, and one
still invalid fails the item with SchemaError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pocketflow import Node

from ir import durations
from ir.errors import SameForEveryItem, Throttled
from ir.templates import references
from worker import settings
from worker.engine import context
from worker.engine.rate_limits import DEFAULT_MAX_WAIT
from worker.llm import answers, budget, fake, prices, providers, schemas
from worker.nodes import provider_batches
from worker.nodes.http import parse_retry_after
from worker.nodes.params import Param
from worker.nodes.registry import register

#: Statuses that ask to come back later: throttles, waited out like a 429 (529: Anthropic "overloaded").
BUSY = {429, 503, 529}


def _attr(obj: Any, name: str) -> Any:
    """`obj.name`, or None: some libraries' attributes are properties that raise when unset."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def rate_limited(exc: BaseException) -> BaseException | None:
    """The exception in `exc`'s chain that says "too many requests, come back later" (a class named *RateLimit*, or
    a BUSY `status_code`), or None. Model libraries often wrap the provider's error, so causes count too."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any("RateLimit" in cls.__name__ for cls in type(current).__mro__) or _attr(current, "status_code") in BUSY:
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


def _positive(value: Any) -> bool:
    return value > 0


def _not_negative(value: Any) -> bool:
    return value >= 0


def _messages(value: Any) -> bool:
    """A list of {role, content} with string values: what every provider takes."""
    return bool(value) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    )


#: The llm node's params, in the order prep reads them (worker/nodes/params.py).
PARAMS = {
    "prompt": Param("the prompt text (this or `messages`)", str),
    "messages": Param(
        "the chat so far, a list of {role, content} (this or `prompt`)", list,
        what="a list of {role, content} objects with string values", check=_messages,
    ),
    "system": Param("system prompt", str),
    "model": Param(
        "`openai/<model>`, `anthropic/<model>`, `llm/<model id>` or a bare name for CHORDFLOW_LLM_PROVIDER "
        "(default: CHORDFLOW_LLM_MODEL); 'fake' answers offline ('fake-throttled:N': throttled N times first, a "
        "test aid)",
        str,
    ),
    "temperature": Param("sampling temperature (number), passed to the model when given", (int, float)),
    "max_tokens": Param(
        "most tokens in the answer (a whole number > 0; Anthropic's default 4096)", int,
        what="a whole number > 0", check=_positive,
    ),
    "timeout": Param(
        "seconds (number > 0) one request may take; unset: the client's default", (int, float),
        what="a positive number of seconds", check=_positive,
    ),
    "base_url": Param("the provider's endpoint (default: OPENAI_BASE_URL / ANTHROPIC_BASE_URL, else its own)", str),
    "cache": Param(
        f"reuse an identical request's answer from any run within this long ({durations.EXAMPLES}); unset: "
        "answers are reused within the run only", str, what=f"a duration {durations.EXAMPLES}",
        check=lambda text: durations.seconds(text) is not None,
    ),
    "schema": Param(
        "a JSON Schema (an object at its root) the answer must match: asked of the provider, validated, the parsed "
        "answer written to `data`", dict,
    ),
    "schema_retries": Param(
        f"more requests (a whole number >= 0, default {schemas.DEFAULT_RETRIES}) an answer that does not match "
        "`schema` may cost, each told what was wrong; then the item fails with SchemaError", int,
        default=schemas.DEFAULT_RETRIES, what="a whole number >= 0", check=_not_negative,
    ),
    "max_throttle_wait": Param(
        "seconds (number > 0, default 300) this call may spend in all waiting out the model's rate-limit errors "
        "before its item fails",
        (int, float), default=DEFAULT_MAX_WAIT, what="a positive number of seconds", check=_positive,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Call:
    """What prep resolved: the model as written, the request, the throttle budget, and what an answer not of the
    request's `schema` may cost in more requests; `made`: the requests answered so far (exec's attempts share it)."""

    model: str
    request: providers.Request
    max_wait: float
    cache: int | None = None  # seconds an answer is kept across runs (`cache`); None: this run only
    schema_retries: int = schemas.DEFAULT_RETRIES
    index: int | None = None  # the batch item's index: a provider batch's answer to its line is its call
    made: list[tuple[providers.Request, providers.Answer]] = field(default_factory=list, compare=False)
    found: dict[str, dict[str, Any] | None] = field(default_factory=dict, compare=False)  # looked up, not yet used

    @property
    def prompt(self) -> str:
        return prompt_of(self.request)


def prompt_of(request: providers.Request) -> str:
    return "\n\n".join(m["content"] for m in request.messages)


def ask(model: providers.Model, call: Call) -> providers.Answer:
    """One request to the provider; a 429 (or 503/529) raises Throttled, waited out by the engine."""
    try:
        return providers.call(model, call.request)
    except SameForEveryItem:
        raise
    except Exception as exc:
        if (limited := rate_limited(exc)) is not None:
            raise Throttled(str(exc), retry_after=retry_after_of(limited), max_wait=call.max_wait) from exc
        raise


def ask_fake(call: Call) -> providers.Answer:
    text, input_tokens, output_tokens = fake.answer(
        call.model, call.request.system, call.prompt, call.max_wait, call.request.schema
    )
    return providers.Answer(text, fake.FAKE, input_tokens, output_tokens)


def spend(call: Call, make: Callable[[], providers.Answer]) -> providers.Answer:
    """`make()`'s answer, the most it can bill reserved against the run's budget first (BudgetExhausted when that
    would pass a cap) and replaced by what it billed after."""
    kept = context.current().budget
    if kept is None:
        return make()
    name = providers.model_of(call.model).name
    tokens = budget.most_of(call.request)
    output = call.request.max_tokens or budget.RESERVED_OUTPUT
    most = budget.Spend(tokens, prices.cost(call.model, name, tokens - output, output) or 0.0)
    kept.reserve(most)
    try:
        answer = make()
    except BaseException:
        kept.settle(most, budget.Spend(0))  # a request that failed billed nothing here
        raise
    used = (answer.input_tokens or 0) + (answer.output_tokens or 0)
    cost = prices.cost(call.model, name, answer.input_tokens, answer.output_tokens) or 0.0
    kept.settle(most, budget.Spend(used, cost))
    return answer


def check_params(params: dict[str, Any]) -> dict[str, str] | str | None:
    """Before any item runs (validation, a local run, `submit`): one of prompt/messages, a literal `schema` usable as
    an answer's shape (checked once here, not per item), and the key a literal model needs in this process."""
    if "prompt" in params and "messages" in params:
        return {"messages": "give `prompt` or `messages`, not both"}
    if "prompt" not in params and "messages" not in params and set(params) <= set(PARAMS):  # (a misspelt one: named)
        return {"prompt": "required (or `messages`)"}
    problems: dict[str, str] = {}
    schema = params.get("schema")
    if isinstance(schema, dict) and not references(schema) and (problem := schemas.problem(schema)) is not None:
        problems["schema"] = problem
    model = params.get("model") or settings.get("llm_model")
    literal = isinstance(model, str) and not references(model) and not fake.offline(model)
    if literal and (problem := providers.missing_key_message(providers.model_of(model))) is not None:
        problems["model"] = problem
    return problems or None


@register("llm")
class LlmNode(Node):
    """Writes the model's `response`; the call happens in exec so the node's retries apply."""

    PARAMS = PARAMS
    check_params = staticmethod(check_params)  # static validation hook (worker/engine/loader.py)
    before_batch = staticmethod(provider_batches.collect)  # `provider_batch` (worker/engine/batch_node.py)

    def prep(self, shared: Any) -> Call:
        values = {name: PARAMS[name].get("llm", self.params, name) for name in PARAMS}
        model = values["model"] or settings.get("llm_model")
        if not model:
            raise SameForEveryItem(
                "llm: no model: set the node's `model` or CHORDFLOW_LLM_MODEL ('fake' answers offline)"
            )
        if not fake.well_formed(model):
            raise ValueError(f"llm: model {model!r} must be 'fake-throttled:N' with N a whole number")
        if values["prompt"] is None and values["messages"] is None:
            raise ValueError("llm: param 'prompt' or 'messages' is required")
        messages = values["messages"] or [{"role": "user", "content": values["prompt"]}]
        request = providers.Request(
            messages=[{"role": m["role"], "content": m["content"]} for m in messages], system=values["system"],
            temperature=values["temperature"], max_tokens=values["max_tokens"], timeout=values["timeout"],
            base_url=values["base_url"], schema=values["schema"],
        )  # fmt: skip
        if values["schema"] is not None and (problem := schemas.problem(values["schema"])) is not None:
            raise ValueError(f"llm: param 'schema' {problem}")  # a templated one; the validator is made once
        cache = None if values["cache"] is None else durations.seconds(values["cache"])
        index = shared.get("__index__")
        return Call(model, request, float(values["max_throttle_wait"]), cache, values["schema_retries"], index)

    def exec(self, call: Call) -> schemas.Reply:
        """The answer; with a `schema`, asked again while it does not match (worker/llm/schemas.py)."""

        def send(request: providers.Request) -> providers.Answer:
            return self.answer(replace(call, request=request))

        return schemas.ask(call.request, call.schema_retries, send, call.made)

    def answered(self, call: Call) -> bool:
        """Whether the run has the answer to the call's first request (a provider batch's, or one reused): then it
        sends nothing, and the engine does not hold it to the node's `rate_limit`."""
        return not call.made and not fake.offline(call.model) and self.kept(call, call.request) is not None

    def kept(self, call: Call, request: providers.Request, *, asking: bool = False) -> dict[str, Any] | None:
        """The run's kept answer to `request`, else None: one lookup for `answered` and the `asking` that follows."""
        kept = context.current().answers
        if kept is None:
            return None
        key = answers.key_of(providers.model_of(call.model), request)
        if key not in call.found:
            call.found[key] = kept.find(key, shared=call.cache is not None)
        return call.found.pop(key) if asking else call.found[key]

    def answer(self, call: Call) -> providers.Answer:
        """One request's answer: one kept in the run, else a new one (the fake's, or the provider's, then kept),
        reserved against the run's budget."""
        if fake.offline(call.model):
            return spend(call, lambda: ask_fake(call))
        model, kept = providers.model_of(call.model), context.current().answers
        prices.table()  # a bad prices file stops the batch before any call is paid
        key = None if kept is None else answers.key_of(model, call.request)
        if key is not None and (found := self.kept(call, call.request, asking=True)) is not None:
            return answers.from_record(found, call.index)
        answer = spend(call, lambda: ask(model, call))
        if key is not None:
            kept.keep(key, answers.to_record(answer), call.cache)  # before the item's outcome: never paid twice
        return answer

    def tokens_used(self, reply: schemas.Reply) -> int:
        """What the call cost, every request of it sent now, for the engine's `tokens_per_minute` bucket (0 when the
        model does not say; a provider batch's answers were not sent now)."""
        return sum((a.input_tokens or 0) + (a.output_tokens or 0) for _, a in reply.exchanges if not a.batch)

    def post(self, shared: Any, call: Call, reply: schemas.Reply) -> str:
        shared["response"] = reply.answer.text
        name = providers.model_of(call.model).name
        for request, answer in reply.exchanges:  # the invalid answers too: they were billed
            usage = {
                "node": self.type_name,
                "model": answer.model,
                "prompt_chars": len(prompt_of(request)),
                "response_chars": len(answer.text),
            }
            for key in ("input_tokens", "output_tokens"):
                if (value := getattr(answer, key)) is not None:
                    usage[key] = value
            usage["cached"] = answer.cached
            tokens = (call.model, name, answer.input_tokens, answer.output_tokens)
            if (priced := prices.cost(*tokens, batch=answer.batch)) is not None:
                usage["cost_usd"] = priced
            if answer.batch:
                usage["provider_batch"] = True
                if priced is not None:
                    usage["saved_usd"] = (prices.cost(*tokens) or 0.0) - priced
            calls = shared.get("__llm_calls__")
            if isinstance(calls, list):
                calls.append(usage)
            else:
                shared["__llm_calls__"] = [usage]
        if reply.error is not None:
            raise reply.error  # after the records: an item that fails still paid for its requests
        if call.request.schema is not None:
            shared["data"] = reply.data
        return "default"
