"""Provider batches: an `llm` batch node with `provider_batch` has its items' requests answered by the provider's
batch API (half price, within hours), and asks synchronously only what the provider has not answered by the
deadline.

It happens before the batch runs its items, and fills the run's kept answers (worker/llm/answers.py): each line's
answer is kept under its request's key, as a synchronous call's would be. Then the batch runs as any batch does:
an item whose request was answered in a provider batch finds its answer (billed at the batch price), one whose
line the provider refused fails with the provider's message, and one the provider did not answer in time is asked
synchronously, with every rule of a normal `llm` batch (rate limits, budget, cache, error handling).

Crash-safety: what the provider batches are lives in the run's kept answers under `provider-batches:<batch key>`
(where the run's state lives: Redis, or the embedded store), written before each step that depends on it: a group
records when it is about to be created before it is, and its id right after. A group found with the first and not
the second (its creator died in between) looks for the batch it may have created (`batch_apis.find`) before making
one, so a group of items is in at most one provider batch. The run waits for them the way a `wait` node waits
(worker/waits.py): no worker is held on a cluster; a look at the batches is due every POLL_FRACTION of their age,
between POLL_MIN and POLL_MAX seconds, and at the deadline. `cancel` cancels them (here, or, on a cluster, the
advance that finds the run cancelled: `cancel_listed`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import ChainMap, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ir.errors import BudgetExhausted, RunCancelled, SameForEveryItem
from worker.batch.backend import BatchJob
from worker.batch.cloning import clone_node
from worker.engine import context
from worker.llm import answers, batch_apis, budget, fake, prices, providers
from worker.llm.batch_apis import Line
from worker.store import NamespacedStore
from worker.waits import MemoryWaits, Waiting

log = logging.getLogger(__name__)

#: Where a batch's provider batches are recorded among the run's kept answers.
PREFIX = "provider-batches:"
#: Seconds between two looks at running provider batches: a tenth of their age, within these bounds.
POLL_MIN, POLL_MAX, POLL_FRACTION = 1.0, 60.0, 0.1
#: The providers whose batch APIs are used (others' items are asked synchronously).
BATCHING = ("openai", "anthropic")


@dataclass(frozen=True)
class Asked:
    """An item's request as its `llm` node would send it: the line, its answer's key, how long it is kept (`cache`)."""

    line: Line
    key: str
    cache: int | None


def collect(job: BatchJob) -> None:
    """Have the provider answer what it can of `job`'s items by the deadline, each answer kept for its item; returns
    once every provider batch has ended and its answers are kept (at once when they were before). On a cluster, a
    wait for the provider ends the advance (Suspended) and the run comes back here when a look is due."""
    spec = job.batch.provider_batch
    if spec is None:
        return
    ctx = context.current()
    if ctx.answers is None:  # a flow run with no record: kept for this process's run of the batch
        ctx.answers = answers.MemoryAnswers()
    kept, name = ctx.answers, PREFIX + job.key
    state = kept.find(name, shared=False)
    if state is not None and state.get("done"):
        return
    waits = ctx.waits if ctx.waits is not None else MemoryWaits()
    began = waits.begin(job.key, time.time())
    asked: dict[int, Asked] | None = None
    if state is None:
        asked = requests_of(job, range(len(job.items)), skip_kept=True)
        state = {"token": secrets.token_hex(8), "deadline": began + spec.seconds, "groups": groups_of(asked)}
        kept.keep(name, state, None)
    batches = Batches(job, state, lambda: kept.keep(name, state, None))
    try:
        while True:
            if ctx.cancelled.is_set():
                raise RunCancelled(f"run cancelled during batch node '{job.node_id}'")
            batches.go_on(time.time())
            if batches.ended():
                if asked is None:
                    asked = requests_of(job, batches.indices())
                batches.keep_answers(asked, kept)
                waits.end(job.key)
                return
            due = batches.next_look(time.time(), began)
            waiting = Waiting(job.key, job.node_id, due, None, batches.shown(), state["deadline"])
            while time.time() < due:
                waits.hold(waiting, ctx.cancelled)  # a cluster's ends the advance here
    except RunCancelled:
        batches.cancel()
        raise


class Batches:
    """A batch's provider batches, as recorded in `state`: {token, deadline, groups: [{provider, model, base_url,
    indices, state (new, running, cancelling, ended, refused, kept), id, since, reserved, total, done, failed}],
    done}; `save()` records `state` where the run's state lives."""

    def __init__(self, job: BatchJob, state: dict[str, Any], save: Any):
        self.job, self.state, self.save = job, state, save
        self.groups: list[dict[str, Any]] = state["groups"]

    def go_on(self, now: float) -> None:
        """Create the groups not yet in a provider batch, look at the running ones, and at the deadline cancel
        what the provider has not answered."""
        for number, group in enumerate(self.groups):
            if group["state"] == "new":
                self.create(number, group, now)
        for group in self.groups:
            if group["state"] in ("running", "cancelling"):
                progress = batch_apis.look(group["provider"], group["base_url"], group["id"])
                group.update(total=progress.total, done=progress.done, failed=progress.failed)
                if progress.state == "ended":
                    group["state"] = "ended"
                elif now >= self.state["deadline"] and group["state"] == "running":
                    batch_apis.cancel(group["provider"], group["base_url"], group["id"])
                    group["state"] = "cancelling"
                    log.info("provider batch %s: the deadline came with %d of %d lines answered; the rest is asked "
                             "synchronously", group["id"], progress.done, progress.total)  # fmt: skip
        self.save()

    def create(self, number: int, group: dict[str, Any], now: float) -> None:
        """Put `group` in a provider batch: the one its creator made before it died, if any, else a new one."""
        metadata = {"chordflow_batch": self.state["token"], "chordflow_group": f"{self.job.key}:{number}"}
        taken = {g["id"] for g in self.groups if g.get("id")}
        asked = requests_of(self.job, group["indices"])
        lines = [asked[i].line for i in group["indices"] if i in asked]
        found = None
        if group.get("since") is not None:  # it was about to be created: maybe it was
            found = batch_apis.find(group["provider"], group["base_url"], metadata, group["since"], len(lines), taken)
        else:
            if not self.reserve(group, lines):
                return
            group["since"] = now
            self.save()  # before the provider batch exists: whoever comes next looks for it
        if found is None:
            try:
                found = batch_apis.create(group["provider"], group["base_url"], lines, metadata)
            except SameForEveryItem:
                raise
            except Exception as exc:  # no batch API there (an OpenAI-compatible server): its items are asked one by one
                log.warning("provider batch of %d lines not created (%s): they are asked synchronously",
                            len(lines), exc)  # fmt: skip
                group["state"] = "refused"
                self.save()
                return
        group.update(id=found, state="running", total=len(group["indices"]))
        self.save()

    def reserve(self, group: dict[str, Any], lines: list[Line]) -> bool:
        """Hold the most `lines` can bill against the run's budget (recorded in `group`); False when that would pass
        a cap: the group is not sent, and its items meet the budget when they are asked synchronously."""
        kept = context.current().budget
        if kept is None:
            return True
        most = budget.Spend(0)
        for line in lines:
            tokens = budget.most_of(line.request)
            output = line.request.max_tokens or budget.RESERVED_OUTPUT
            usd = prices.cost(line.model.written, line.model.name, tokens - output, output, batch=True) or 0.0
            most = budget.Spend(most.tokens + tokens, most.usd + usd)
        try:
            kept.reserve(most)
        except BudgetExhausted as exc:
            log.warning("provider batch of %d lines not created: %s", len(lines), exc)
            group["state"] = "refused"
            self.save()
            return False
        group["reserved"] = [most.tokens, most.usd]
        return True

    def ended(self) -> bool:
        return all(group["state"] in ("ended", "refused", "kept") for group in self.groups)

    def indices(self) -> list[int]:
        return [i for group in self.groups if group["state"] == "ended" for i in group["indices"]]

    def keep_answers(self, asked: dict[int, Asked], kept: answers.Answers) -> None:
        """Every ended batch's answers kept for their items (a refused line: the provider's message), what they
        billed settled against the budget; then the batch is done."""
        for group in self.groups:
            if group["state"] != "ended":
                continue
            billed = budget.Spend(0)
            lines = {i: asked[i].line for i in group["indices"] if i in asked}
            for index, got in batch_apis.results(group["provider"], group["base_url"], group["id"], lines):
                if isinstance(got, str):
                    kept.keep(asked[index].key, {"error": got}, None)
                    continue
                kept.keep(asked[index].key, answers.to_record(got, index), asked[index].cache)
                model = asked[index].line.model
                usd = prices.cost(model.written, model.name, got.input_tokens, got.output_tokens, batch=True)
                tokens = (got.input_tokens or 0) + (got.output_tokens or 0)
                billed = budget.Spend(billed.tokens + tokens, billed.usd + (usd or 0.0))
            if (reserved := group.get("reserved")) is not None and (spent := context.current().budget) is not None:
                spent.settle(budget.Spend(*reserved), billed)
            group["state"] = "kept"
            self.save()
        self.state["done"] = True
        self.save()

    def next_look(self, now: float, began: float) -> float:
        pace = min(POLL_MAX, max(POLL_MIN, (now - began) * POLL_FRACTION))
        deadline = self.state["deadline"]
        return min(now + pace, deadline) if now < deadline else now + POLL_MIN

    def shown(self) -> tuple[dict[str, Any], ...]:
        """Each provider batch as a waiting run shows it (and as `cancel_listed` finds it)."""
        keys = ("provider", "id", "base_url", "state", "total", "done", "failed")
        return tuple({k: g.get(k) for k in keys} for g in self.groups if g.get("id"))

    def cancel(self) -> None:
        cancel_listed(self.shown())
        for group in self.groups:
            if group["state"] == "running":
                group["state"] = "cancelling"
        self.save()


def cancel_listed(batches: Iterable[dict[str, Any]]) -> None:
    """Cancel the provider batches a cancelled run was waiting for (what has not ended)."""
    for batch in batches:
        if batch.get("id") and batch.get("state") in ("running", "cancelling"):
            try:
                batch_apis.cancel(batch["provider"], batch.get("base_url"), batch["id"])
            except Exception as exc:  # ended meanwhile, or the provider away: it expires on its own
                log.warning("could not cancel provider batch %s: %s", batch["id"], exc)


def requests_of(job: BatchJob, indices: Iterable[int], skip_kept: bool = False) -> dict[int, Asked]:
    """Index -> the request each item's `llm` node would send, its templates resolved against the item, for the
    items a provider batch can answer (a model of a batching provider; not offline; one line per distinct request;
    with `skip_kept`, none already answered). An item whose params do not resolve is left to run, and fail, as any
    item does; an error the same for every item (no model) stops the batch here."""
    chain = clone_node(job.chain)  # NamespacedNode > TemplateNode > LlmNode
    templated = chain.inner
    node = templated.inner
    found: dict[int, Asked] = {}
    seen: set[str] = set()
    for index in indices:
        item = ChainMap({job.node_id: {}, job.batch.alias: job.items[index], "__index__": index}, job.shared)
        try:
            if templated.dynamic:
                node.params = templated.compiled.resolve(item)
            call = node.prep(NamespacedStore(item, job.node_id))
        except SameForEveryItem:
            raise
        except Exception:
            continue
        model = providers.model_of(call.model)
        if fake.offline(call.model) or model.provider not in BATCHING:
            continue
        key = answers.key_of(model, call.request)
        if key not in seen:
            seen.add(key)
            found[index] = Asked(Line(index, model, call.request), key, call.cache)
    if skip_kept and found:
        kept = context.current().answers
        answered = kept.known([a.key for a in found.values()])
        found = {i: a for i, a in found.items() if a.key not in answered}
    return found


def groups_of(asked: dict[int, Asked]) -> list[dict[str, Any]]:
    """The fewest provider batches the lines fit: one model and endpoint each, within the provider's limits."""
    by_model: dict[tuple[str, str, str | None], list[Asked]] = defaultdict(list)
    for one in asked.values():
        by_model[(one.line.model.provider, one.line.model.name, one.line.request.base_url)].append(one)
    groups = []
    for (provider, model, base_url), lines in by_model.items():
        most, most_bytes = batch_apis.LIMITS[provider]
        indices: list[int] = []
        size = 0
        for one in lines:
            line_size = one.line.size()
            if indices and (len(indices) >= most or size + line_size > most_bytes):
                groups.append(_group(provider, model, base_url, indices))
                indices, size = [], 0
            indices.append(one.line.index)
            size += line_size
        if indices:
            groups.append(_group(provider, model, base_url, indices))
    return groups


def _group(provider: str, model: str, base_url: str | None, indices: list[int]) -> dict[str, Any]:
    return {"provider": provider, "model": model, "base_url": base_url, "indices": indices, "state": "new",
            "id": None, "since": None, "total": len(indices), "done": 0, "failed": 0}  # fmt: skip
