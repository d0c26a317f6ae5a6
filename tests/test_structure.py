"""The shape of the code, checked from its imports (read with `ast`, inside functions too): no import
circle, no module using another module's `_private` name, no folder of more than 15 modules, no module of
more than 600 lines, and Redis/Celery imported only inside worker/cluster/ and the few client modules
CLUSTER_CLIENTS names (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import pathlib
import re
from collections import Counter

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("ir", "worker", "scheduler")
CLUSTER_ONLY = ("celery", "kombu", "redis")
#: The client's modules that import one of CLUSTER_ONLY themselves, and why; every other one goes through
#: worker/cluster/.
CLUSTER_CLIENTS = {
    "scheduler.reach": "turns a Redis or broker connection error into one line naming the URL",
    "scheduler.ops.metrics": "reads every run's counts in one pipelined pass per scrape; hooks Celery's worker signals",
    "scheduler.ops.demand": "reads the active runs' windows and the rate-limit buckets, pipelined, per scrape",
    "scheduler.backends.celery": "follows a client-driven batch's progress stream",
}


@functools.cache
def parsed(path: pathlib.Path) -> ast.Module:
    """A module's syntax tree, read once for every check."""
    return ast.parse(path.read_text(), str(path))


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
#: The benches: held to the circle and private-name rules too, and to naming the internals they use.
BENCH = {module_name(p): p for p in sorted((ROOT / "bench").rglob("*.py"))}


def owner(name: str) -> str | None:
    """The module (or package) of ours that `name` (a dotted import path) lands in."""
    while name and name not in MODULES and name not in BENCH:
        name = name.rpartition(".")[0]
    return name or None


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """Nodes under `if TYPE_CHECKING:`: imports for annotations only, exempt from the circle check."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    return skip


class Imports:
    """Every module's imports of our modules, external top-level packages, and private names used."""

    def __init__(self, modules: dict[str, pathlib.Path]) -> None:
        self.edges: dict[str, set[str]] = {}
        self.external: dict[str, set[str]] = {}
        self.private: list[str] = []
        for name, path in modules.items():
            self.read(name, parsed(path))

    def read(self, name: str, tree: ast.AST) -> None:
        skip = type_checking_nodes(tree)
        edges = self.edges.setdefault(name, set())
        external = self.external.setdefault(name, set())
        aliases: dict[str, str] = {}  # local name -> our module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = owner(alias.name)
                    if target is None:
                        external.add(alias.name.partition(".")[0])
                    elif id(node) not in skip and target != name:
                        edges.add(target)
                        aliases[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if owner(node.module) is None:
                    external.add(node.module.partition(".")[0])
                    continue
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    ours = full in MODULES or full in BENCH
                    target = full if ours else owner(node.module)
                    if ours:
                        aliases[alias.asname or alias.name] = full
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        self.private.append(f"{name} imports {node.module}.{alias.name}")
                    if id(node) not in skip and target != name:
                        edges.add(target)
        for node in ast.walk(tree):  # `module._name` through an imported module
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                self.private.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")

    def circles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan, iterative)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []
        counter = 0
        for root in self.edges:
            if root in index:
                continue
            work = [(root, iter(sorted(self.edges.get(root, ()))))]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on_stack.add(root)
            while work:
                node, children = work[-1]
                child = next(children, None)
                if child is not None:
                    if child not in index:
                        index[child] = low[child] = counter
                        counter += 1
                        stack.append(child)
                        on_stack.add(child)
                        work.append((child, iter(sorted(self.edges.get(child, ())))))
                    elif child in on_stack:
                        low[node] = min(low[node], index[child])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
        return found


@pytest.fixture(scope="module")
def imports() -> Imports:
    return Imports(MODULES)


@pytest.fixture(scope="module")
def everything() -> Imports:
    return Imports({**MODULES, **BENCH})


def test_no_import_circle(everything: Imports) -> None:
    assert everything.circles() == []


def test_no_module_uses_another_modules_private_names(everything: Imports) -> None:
    assert everything.private == []


#: What a bench may use without naming it: the public API.
PUBLIC = {"scheduler", "ir", "worker.nodes"}


def test_each_bench_names_the_internal_modules_it_uses(everything: Imports) -> None:
    """A bench measures what users run: the public API; any internal module it reaches into is named in its
    docstring, so a change there knows which bench to run again."""
    unnamed = {}
    for name, path in BENCH.items():
        doc = ast.get_docstring(parsed(path)) or ""
        internal = {m for m in everything.edges.get(name, ()) if m in MODULES and m not in PUBLIC}
        internal = {m for m in internal if not any(other.startswith(m + ".") for other in internal)}
        if missing := sorted(m for m in internal if m not in doc and m.replace(".", "/") not in doc):
            unnamed[name] = missing
    assert unnamed == {}


def test_no_folder_holds_more_than_15_modules() -> None:
    folders = Counter(path.parent.relative_to(ROOT).as_posix() for path in MODULES.values())
    assert {folder: n for folder, n in folders.items() if n > 15} == {}


def test_no_module_is_longer_than_600_lines() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in lengths.items() if n > 600} == {}


def test_imports_go_scheduler_to_worker_to_ir(imports: Imports) -> None:
    upward = [
        f"{name} -> {target}"
        for name, targets in imports.edges.items()
        for target in targets
        if (name.startswith("ir") and not target.startswith("ir"))
        or (name.startswith("worker") and target.startswith("scheduler"))
    ]
    assert upward == []


def test_only_worker_cluster_and_the_named_clients_import_redis_or_celery(imports: Imports) -> None:
    importing = {name for name, packages in imports.external.items() if packages & set(CLUSTER_ONLY)}
    outside = sorted(name for name in importing - set(CLUSTER_CLIENTS) if not name.startswith("worker.cluster"))
    assert outside == []
    assert sorted(set(CLUSTER_CLIENTS) - importing) == []  # an exception that no longer applies goes


def test_local_runs_never_import_the_cluster(imports: Imports) -> None:
    """What a local run loads (the engine, batches, runs, datasets, nodes) reaches no cluster module."""
    local = ("worker.engine", "worker.batch", "worker.runs", "worker.datasets", "worker.nodes")
    seen: set[str] = set()
    todo = [name for name in MODULES if name.startswith(local)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports.edges.get(name, ()))
    assert sorted(name for name in seen if name.startswith("worker.cluster")) == []


def test_every_package_says_what_it_may_import() -> None:
    silent = [
        name
        for name, path in MODULES.items()
        if path.name == "__init__.py" and "import" not in (ast.get_docstring(parsed(path)) or "")
    ]
    assert silent == []


def string_constants(tree: ast.AST) -> set[str]:
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_messages_are_built_in_the_messages_module_and_sent_by_the_sending_one() -> None:
    """What crosses the broker is a typed message (worker/cluster/messages.py, the only module naming a task) sent by
    worker/cluster/sending.py (the only module calling `send_task`): no bare dict or tuple goes to a task elsewhere."""
    from worker.cluster import messages

    names = {messages.ADVANCE, messages.ADVANCE_BRANCH, messages.RUN_CHUNK, messages.MERGE, messages.DATASET_CHUNK}
    naming, sending = [], []
    for name, path in MODULES.items():
        tree = parsed(path)
        if name != "worker.cluster.messages" and string_constants(tree) & names:
            naming.append(name)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        if name != "worker.cluster.sending" and any(call.func.attr == "send_task" for call in calls):  # type: ignore[attr-defined]
            sending.append(name)
    assert not naming, f"modules naming a chordflow task outside worker/cluster/messages.py: {naming}"
    assert not sending, f"modules sending a task outside worker/cluster/sending.py: {sending}"


#: Exception classes defined outside ir/errors.py, and why.
OWN_EXCEPTIONS = {
    "scheduler.cli.ops.CannotServe": "click's own exception: click prints it and exits 1",
}


def test_every_error_lives_in_ir_errors_under_one_root() -> None:
    """Every error chordflow raises on purpose is one of ir/errors.py's, all under ChordflowError (a caller catches
    chordflow's errors with one except); elsewhere only private control-flow exceptions of one module (`_Name`) and
    BaseException signals that no node may catch."""
    from ir import errors

    builtin = {
        name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, Exception)
    }
    found = []
    for name, path in MODULES.items():
        if name == "ir.errors":
            continue
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases} - {"BaseException"}  # signals
            if bases & builtin or any(base.endswith(("Error", "Exception")) for base in bases):
                found.append(f"{name}.{node.name}")
    assert sorted(set(found) - set(OWN_EXCEPTIONS)) == []
    outside = [c.__name__ for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, BaseException) and not issubclass(c, errors.ChordflowError)]  # fmt: skip
    assert outside == []


#: Stands for a batch, a section or a branch when the test builds every key of a run.
PART = "\0"


def run_key_names() -> list[str]:
    """Every key of a run as worker/cluster/state/keys.py builds it, after the run's prefix, with PART in the place
    of each batch, section or branch."""
    from worker.cluster.state import keys

    run, made = keys.RunKeys("r"), []
    for name, attr in vars(keys.RunKeys).items():
        if isinstance(attr, (keys.RunKey, property)):
            made.append(getattr(run, name))
        elif inspect.isfunction(attr) and not name.startswith("_"):
            made.append(attr(run, *[PART] * (len(inspect.signature(attr).parameters) - 1)))
    flat = [key for one in made for key in ([one] if isinstance(one, str) else one)]
    assert all(key.startswith(run.prefix) for key in flat)
    return [key.removeprefix(run.prefix) for key in flat]


def test_redis_key_names_are_built_in_the_keys_module_only() -> None:
    """Every Redis key name is built in worker/cluster/state/keys.py: no other module of ir/, worker/, scheduler/ or
    bench/ holds a string (f-string parts included; docstrings are prose) that looks like one — a `cf:` name, the
    start of a family of a run's keys (`abort:`, `win:`...), a run's key name holding `_` or `:` (`queued_msgs`,
    `ds:out`, a window's `:todo`) — nor calls `run_key` (a run's key by its name, for tests and tools) or another
    `...key` function with a run's key name (a bare word such as `run` is caught there only); and no Lua script
    names a key (it gets its keys as KEYS)."""
    pieces = {piece for name in run_key_names() for piece in name.split(PART) if piece.strip(":")}
    starts = tuple(piece for piece in pieces if piece.endswith(":"))
    whole = {piece for piece in pieces if not piece.endswith(":") and ("_" in piece or ":" in piece)}
    paths = {**MODULES, **{module_name(p): p for p in sorted((ROOT / "bench").rglob("*.py"))}}
    found = []
    for name, path in paths.items():
        if name == "worker.cluster.state.keys":
            continue
        tree = ast.parse(path.read_text(), str(path))
        prose = {
            id(node.body[0].value)  # type: ignore[attr-defined]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                text = node.value
                if text and not any(c.isspace() for c in text) and (text.startswith(("cf:", *starts)) or text in whole):
                    found.append(f"{name}:{node.lineno} {text!r}")
            elif isinstance(node, ast.Call) and (callee := ast.unparse(node.func).split(".")[-1]).endswith("key"):
                named = any(isinstance(arg, ast.Constant) and arg.value in pieces for arg in node.args)
                if callee == "run_key" or named:  # `run_key(run_id, ...)`, `state.key("cancel")`
                    found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    scripts = sorted((ROOT / "worker/cluster/state/lua").glob("*.lua"))
    found += [f"{p.name} names a key" for p in scripts if "'cf:" in p.read_text() or '"cf:' in p.read_text()]
    assert found == [], "key names outside worker/cluster/state/keys.py"


def test_redis_key_names_stay_byte_identical() -> None:
    """Runs in flight and tools outside chordflow read these names (and a run's hash tag keeps its keys in one
    Redis Cluster slot): a change here strands them. Every run's key is in keys.py's docstring table too."""
    from worker.cluster.state import keys

    run = keys.RunKeys("r1")
    built = [
        run.prefix, run.run, run.overrides, run.events, run.queued_messages, run.chunk_ids, run.kept_chunks("n#2"),
        run.abort("n#2"), run.snapshot("n#2", "ab12"), run.window("n#2").plan, run.window("n#2").begun,
        run.permits("n#2"), run.branch_lease("s", "b"), run.joined("s"), run.dataset.job, run.dataset.started,
        run.tombstone, keys.run_key("r1", "store"),
    ]  # fmt: skip
    assert built == [
        "cf:{r1}:", "cf:{r1}:run", "cf:{r1}:overrides", "cf:{r1}:events", "cf:{r1}:queued_msgs", "cf:{r1}:chunks",
        "cf:{r1}:chunks:n#2", "cf:{r1}:abort:n#2", "cf:{r1}:snap:n#2:ab12", "cf:{r1}:win:n#2",
        "cf:{r1}:win:n#2:begun", "cf:{r1}:permits:n#2", "cf:{r1}:lease:s:b", "cf:{r1}:joined:s", "cf:{r1}:ds",
        "cf:{r1}:ds:started", "cf:purged:{r1}", "cf:{r1}:store",
    ]  # fmt: skip
    shared = [keys.RUNS, keys.WINDOWS, keys.QUEUED, keys.AGING_SWEEP, keys.worker_key("w1@h"), keys.done_key("t1")]
    shared += [keys.limit_key("k"), keys.idempotency_key("i"), keys.shared_answer_key("a")]
    assert shared == [
        "cf:runs", "cf:{windows}", "cf:{queued}", "cf:{queued}:sweeping", "cf:{workers}:w1@h", "cf:done:t1",
        "cf:{limit:k}", "cf:{idem:i}", "cf:{answer:a}",
    ]  # fmt: skip
    table = (keys.__doc__ or "").split("Outside any run:")[0]
    untold = {name.split(PART)[0].split(":")[0] for name in run_key_names()}
    assert sorted(word for word in untold if not re.search(rf"\b{word}\b", table)) == []


def test_tests_readme_names_every_test_file() -> None:
    readme = (ROOT / "tests" / "README.md").read_text()
    assert sorted(p.name for p in (ROOT / "tests").rglob("test_*.py") if f"`{p.name}`" not in readme) == []
