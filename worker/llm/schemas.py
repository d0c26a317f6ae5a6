"""Structured answers: an `llm` node's `schema` (a JSON Schema) checked once, each answer parsed and validated, and
an invalid one asked again with what was wrong appended to the chat.

A model asked for JSON of a shape (worker/llm/providers.py sends the schema the provider's own way) still answers
outside it now and then: not JSON, a missing field, a value out of its enum. Telling it where it went wrong and
asking again fixes most of those for the price of one more request; an answer still invalid after the node's
`schema_retries` fails its item with SchemaError naming the JSON path (`$.label`). Validation is the `jsonschema`
library's, for the draft the schema names (`$schema`; default 2020-12), formats checked where it knows them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ir.errors import SchemaError, one_line
from worker.llm.providers import Answer, Request

#: More requests an invalid answer may cost, when the node sets no `schema_retries`.
DEFAULT_RETRIES = 2
#: Longest message a SchemaError quotes from the validator (which repeats the offending value).
MESSAGE_CHARS = 200


def problem(schema: Any) -> str | None:
    """What makes `schema` unusable as an answer's shape (one line), or None: it must be a valid JSON Schema whose
    root is an object, the shape both providers' structured outputs answer."""
    import jsonschema.exceptions  # here: 0.1 s of every command's start-up, needed only by a workflow with a schema

    if not isinstance(schema, dict):
        return f"must be a JSON Schema object, got {type(schema).__name__}"
    try:
        validator(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return f"not a valid JSON Schema: {exc.json_path}: {_short(exc.message)}"
    if schema.get("type") != "object":
        return 'its root must be {"type": "object", ...}: providers answer structured output as a JSON object'
    return None


def validator(schema: dict[str, Any]) -> Any:
    """The validator of `schema`, made (and the schema checked) once per process for the same schema: a batch's
    items share it. Raises jsonschema's SchemaError for an invalid schema."""
    return _validator(json.dumps(schema, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _validator(canonical: str) -> Any:
    import jsonschema  # as in `problem`

    schema = json.loads(canonical)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def parsed(schema: dict[str, Any], text: str) -> tuple[Any, SchemaError | None]:
    """(the answer's JSON value, None) when `text` is JSON of `schema`'s shape, else (None, what is wrong): the most
    relevant violation, at its JSON path in the answer."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, SchemaError(f"$: not JSON ({_short(str(exc))})")
    import jsonschema.exceptions  # as in `problem`; imported once `validator` made one

    error = jsonschema.exceptions.best_match(validator(schema).iter_errors(data))
    if error is not None:
        return None, SchemaError(f"{error.json_path}: {_short(error.message)}")
    return data, None


def _short(message: str) -> str:
    text = one_line(message)
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def correction(error: SchemaError) -> str:
    """The message appended after an invalid answer, asking for it again."""
    return (
        f"That answer does not match the required JSON Schema: {error}. "
        "Answer again with JSON that matches the schema, and nothing else."
    )


@dataclass(frozen=True)
class Reply:
    """Every request one call made with its answer, in order (each was billed, the invalid ones too); for a schema,
    the valid answer's `data`, or the `error` the last answer still had after the retries."""

    exchanges: list[tuple[Request, Answer]]
    data: Any = None
    error: SchemaError | None = None

    @property
    def answer(self) -> Answer:
        return self.exchanges[-1][1]


def ask(request: Request, retries: int, send: Callable[[Request], Answer], made: list[tuple[Request, Answer]]) -> Reply:
    """`send(request)`; with a schema, an invalid answer is sent again with the answer and its correction appended to
    the chat, up to `retries` more times. `made` holds the exchanges so far and is appended to as they happen: an
    attempt that raised (a 429 waited out, a timeout retried by the node) goes on from the last answer instead of
    starting over, so no billed answer is asked or recorded twice."""
    while True:
        if made:
            asked, answer = made[-1]
            if asked.schema is None:
                return Reply(list(made))
            data, error = parsed(asked.schema, answer.text)
            if error is None:
                return Reply(list(made), data)
            if len(made) > retries:
                return Reply(list(made), error=error)
            chat = [{"role": "assistant", "content": answer.text}, {"role": "user", "content": correction(error)}]
            request = dataclasses.replace(asked, messages=[*asked.messages, *chat])
        made.append((request, send(request)))
