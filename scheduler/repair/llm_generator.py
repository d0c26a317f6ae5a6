"""The `llm` generator: a language model proposes the repaired workflow, through the clients the `llm` node uses
(worker/llm/providers.py).

The prompt holds the workflow IR, the error, the keys available where it failed (and, after a refused
proposal, that proposal and why static validation refused it); the answer must be the whole repaired IR
as one JSON object. The model is CHORDFLOW_REPAIR_MODEL, else CHORDFLOW_LLM_MODEL, named as the `llm` node
names one (`openai/<model>`, `anthropic/<model>`, a bare name). Like the node, the model `fake` answers offline and
deterministically: `fake_answer` reads only the prompt — so a test with it shows the prompt carries what a
model needs — and corrects the reference the error names to the closest available key.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ir.errors import GeneratorError, SameForEveryItem
from scheduler.repair.failure import closest
from scheduler.repair.generators import RepairRequest, register_generator
from worker import settings
from worker.llm import providers
from worker.llm.fake import FAKE

SYSTEM = "You repair workflow definitions. You answer with JSON only."
PROMPT = """A chordflow workflow failed. Repair the workflow so that it runs.

Change only what the error needs (a misspelt key, node id, node type or param name); keep every node id,
every other param and the edges as they are.

## Workflow (IR)
```json
{workflow}
```

## Error
{error}

## Keys available where it failed
{keys}
{refused}
Answer with the whole repaired workflow as ONE JSON object (the IR) in a ```json block, and nothing else.
"""
REFUSED = """
## Your previous answer was refused by static validation
```json
{workflow}
```
Problems:
{problems}
"""
_JSON_BLOCK = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)


def configured_model() -> str | None:
    return settings.get("repair_model") or settings.get("llm_model")


def build_prompt(request: RepairRequest) -> str:
    refused = ""
    if request.rejected is not None:
        problems = "\n".join(f"- {p}" for p in request.problems) or "- (none given)"
        refused = REFUSED.format(workflow=json.dumps(request.rejected, indent=2), problems=problems)
    return PROMPT.format(
        workflow=json.dumps(request.workflow, indent=2),
        error=request.failure.error,
        keys=", ".join(request.available_keys) or "(none listed)",
        refused=refused,
    )


def extract_ir(text: str) -> dict[str, Any] | None:
    """The workflow in a model's answer: its ```json block, else the outermost {...}; None if there is none."""
    found = _JSON_BLOCK.search(text)
    candidate = found.group(1) if found else text[text.find("{") : text.rfind("}") + 1]
    try:
        value = json.loads(candidate)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("nodes"), list) else None


@register_generator("llm")
class LlmGenerator:
    """Asks the configured model; None when its answer holds no workflow."""

    def __init__(self, model: str | None = None):
        self.model = model or configured_model()

    def generate(self, request: RepairRequest) -> dict[str, Any] | None:
        return extract_ir(self.ask(build_prompt(request)))

    def ask(self, prompt: str) -> str:
        if FAKE in (self.model, settings.get("llm_model")):
            return fake_answer(prompt)
        if not self.model:
            raise GeneratorError(
                "the llm repair generator needs a model (CHORDFLOW_REPAIR_MODEL or CHORDFLOW_LLM_MODEL); "
                "'fake' answers offline"
            )
        request = providers.Request([{"role": "user", "content": prompt}], system=SYSTEM)
        try:
            return providers.call(providers.model_of(self.model), request).text
        except SameForEveryItem as exc:
            raise GeneratorError(f"the llm repair generator: {exc}") from exc


def fake_answer(prompt: str) -> str:
    """The fake model: the prompt's workflow with the reference its error names pointed at the closest
    of the prompt's available keys (a name the error suggests with "did you mean" too)."""
    found = _JSON_BLOCK.search(prompt)
    workflow = found.group(1) if found else "{}"
    error = _section(prompt, "## Error")
    keys = [k.strip() for k in _section(prompt, "## Keys available where it failed").split(",") if k.strip()]
    missing = re.search(r"cannot resolve (\$\{[^}]*\}): '([^']*)' not found", error)
    if missing and (close := closest(missing.group(2), keys)):
        workflow = workflow.replace(missing.group(1), "${" + close + "}")
    for wrong, right in re.findall(r"'([^']+)' \(did you mean '([^']+)'\?\)", error):
        workflow = workflow.replace(f'"{wrong}"', f'"{right}"').replace("${" + wrong, "${" + right)
    return f"Here is the repaired workflow:\n```json\n{workflow}\n```\n"


def _section(prompt: str, heading: str) -> str:
    """The first non-empty line after `heading`."""
    after = prompt.split(heading, 1)[1] if heading in prompt else ""
    return next((line.strip() for line in after.splitlines() if line.strip()), "")
