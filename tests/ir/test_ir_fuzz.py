"""Any IR, any bytes: `ir.load` returns a Workflow or raises one ValidationError whose problems are one line each.

Documents come from structured generators that stay close to valid workflows (nodes with ids, types,
params, batch blocks, edges, templates) and break them in the ways that once crashed the loader: nesting
of hundreds or thousands of levels, a dict inside itself, template indexes of thousands of digits, odd
types anywhere, mangled JSON text, bytes that are not UTF-8, long strings that are not paths.
`make fuzz` runs the same property with many more examples (CHORDFLOW_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ir
from ir.limits import MAX_DEPTH
from tests.scheduler.cli.test_cli import run_cli

#: Examples of the property test: 5,000 in the suite (about 20 s here), many more under `make fuzz`.
EXAMPLES = int(os.environ.get("CHORDFLOW_FUZZ_EXAMPLES", "5000"))

IDS = ["a", "b", "c", "fetch-page", "données"]
BAD_NAMES = ["", "1a", "-a", "a b", "a\nb", "a\u2028b", "\ud800", "x" * 300, "${a}", "__dunder__"]
ACTIONS = ["default", "retry", "error", "done"]


@dataclass(frozen=True)
class Deep:
    """A value nested `depth` levels, expanded only when the document is built (dict) or written (text).

    (A marker, not the value: hypothesis would walk and print a value a thousand levels deep.)
    """

    depth: int
    kind: str  # "dict" or "list"

    def value(self) -> Any:
        value: Any = {} if self.kind == "dict" else []
        for _ in range(self.depth - 1):
            value = {"x": value} if self.kind == "dict" else [value]
        return value

    def text(self) -> str:
        opener, closer = ('{"x": ', "}") if self.kind == "dict" else ("[", "]")
        return opener * (self.depth - 1) + ("{}" if self.kind == "dict" else "[]") + closer * (self.depth - 1)


@dataclass(frozen=True)
class Huge:
    """An integer of `digits` digits (Python refuses to convert 4,300 or more to or from text)."""

    digits: int

    def value(self) -> int:
        return 7 * 10 ** (self.digits - 1)

    def text(self) -> str:
        return "7" * self.digits


def _built(value: Any) -> Any:
    """The document as Python values: Deep and Huge markers expanded (the document itself is shallow)."""
    if isinstance(value, Deep | Huge):
        return value.value()
    if isinstance(value, dict):
        return {k: _built(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_built(v) for v in value]
    return value


def _written(doc: Any) -> str | None:
    """The document as JSON text (Deep and Huge markers written out), or None when JSON cannot hold it."""
    deep: dict[str, str] = {}

    def marker(value: Any) -> str:
        if not isinstance(value, Deep | Huge):
            raise TypeError(type(value).__name__)
        key = f"@@deep{len(deep)}@@"
        deep[f'"{key}"'] = value.text()
        return key

    try:
        text = json.dumps(doc, default=marker)
    except (TypeError, ValueError):  # a key JSON cannot hold, a value of another type
        return None
    for key, brackets in deep.items():
        text = text.replace(key, brackets)
    return text


# -- values: mostly drawn from lists (each draw costs time), now and then odd ---------------------------------

#: Values of the wrong type or shape for any field.
ODD: list[Any] = [
    None, True, 0, -1, 2.5, float("nan"), float("inf"), "", "a b", "\n", "\ud800", "x" * 300, Huge(5000),
    [], {}, [1, "a"], {"k": None}, (1, (2, (3,))), {1, 2}, frozenset({(1,)}), b"\xff", object(),
    Deep(MAX_DEPTH - 4, "dict"), Deep(MAX_DEPTH, "list"), Deep(MAX_DEPTH + 1, "dict"), Deep(1000, "list"),
]  # fmt: skip
ODD_KEYS = [value for value in ODD if not isinstance(value, list | dict | set | Deep | Huge)]  # hashable, no markers


def pick(good: list[Any], odd_one_in: int = 12, odd: list[Any] = ODD) -> st.SearchStrategy[Any]:
    """One of `good`, or (about one time in `odd_one_in`) one of `odd`: a single draw."""
    copies = max(1, round((odd_one_in - 1) * len(odd) / len(good)))
    return st.sampled_from(good * copies + odd)


def pick_key(good: list[Any]) -> st.SearchStrategy[Any]:
    return pick(good, odd=ODD_KEYS)


DEPTHS = [*range(MAX_DEPTH - 6, MAX_DEPTH + 3), 500, 999, 1000, 1200]
DEEP = [Deep(depth, kind) for depth in DEPTHS for kind in ("dict", "list")]
#: (before, inside the braces around the path, after) a template.
FRAMES = [
    *[("", "", "")] * 4,
    ("text ", "", ""),
    ("", " ", " more"),
    ("${", "", "}"),
    ("", "\n", "${b}"),
    ("$", "", ""),
]
ROOTS = [*IDS, "item", "_error", "x", "1x", "a b", "é-x", ""]
RESTS = ["", "", ".x", "[0]", ".k[1].v", ".1x", "[-1]", "[" + "9" * 19 + "]", "[" + "9" * 5000 + "]", ". x"]
#: Every combination, drawn in one go (a drawn template costs several draws, the bulk of a run's time).
TEMPLATES = [f"{a}${{{pad}{root}{rest}{pad}}}{b}" for a, pad, b in FRAMES for root in ROOTS for rest in RESTS]
templates = st.sampled_from(TEMPLATES)
#: Leaf values of params: about as many plain values as templates, one in six nested deep.
LEAVES = ["text", 3, 1.5, True, None, "${", "$x", "", "a\nb", -0.0] * 100 + TEMPLATES + DEEP * 20
leaves = st.sampled_from(LEAVES)
param_values = st.one_of(
    leaves, st.lists(leaves, max_size=3), st.dictionaries(pick_key(["k", "v"]), st.one_of(leaves, st.lists(leaves)))
)


# -- objects: fields drawn, then ONE draw of an "extra" that adds, breaks, drops or replaces ---------------------


@dataclass(frozen=True)
class Replace:
    """An extra that replaces the whole object (a node that is a number, nodes that are a string...)."""

    value: Any


DROP_FIRST: Any = object()  # an extra that drops the first (required) field
#: Extras every object may get besides its own: replaced by an odd value, a required field dropped, an unknown one.
BREAKS: list[Any] = [DROP_FIRST, {"unknown": 1}, *(Replace(value) for value in ODD[::3])]


def _fields(required: dict[str, Any], optional: dict[str, Any], extras: list[Any]) -> st.SearchStrategy[Any]:
    """The required fields, some optional ones, then one of `extras` (merged over them) or of BREAKS.

    `extras` hold the usual variations, valid and not (`{"as": "1x"}`); `{}` entries make "nothing" likely.
    """

    def build(fields: dict[str, Any], extra: Any) -> Any:
        if extra is DROP_FIRST:
            return dict(list(fields.items())[1:])
        return extra.value if isinstance(extra, Replace) else fields | extra

    return st.builds(build, st.fixed_dictionaries(required, optional=optional), st.sampled_from(extras + BREAKS))


def _odd(field: str, values: list[Any] = ODD[::2]) -> list[dict[str, Any]]:
    return [{field: value} for value in values]


names = pick(IDS, 16, odd=BAD_NAMES + ODD[::2])
texts = pick(["", "a workflow", "données", "a\nb"])
batches = _fields(
    {"items": templates},
    {},
    [{}] * 30
    + [{"as": "row", "error_handling": "continue"}, {"parallel": True, "max_concurrent": 2, "chunk_size": 3}]
    + [{"max_retries": 2, "retry_wait": 0.5}]
    + _odd("items", ["x", "${a} and ${b}", "${", *ODD[::4]])
    + _odd("as", ["1x", "x-y", "", None, 3])
    + _odd("error_handling", ["stop", None, ["continue"]])
    + [{k: v} for k in ("max_concurrent", "max_retries", "chunk_size") for v in (0, -1, "2", 1.5, Huge(5000))]
    + _odd("retry_wait", [-1, float("nan"), "soon"])
    + _odd("parallel", ["yes", 2, None]),
)
nodes = _fields(
    {"id": names, "type": pick(["echo", "noop", "test-upper", "nope"], 16)},
    {"params": st.dictionaries(pick_key(["p", "q", "text", "a\nb", "é"]), param_values, max_size=2), "batch": batches},
    [{}] * 30
    + [{"max_retries": 3, "wait": 0.1}, {"purpose": "why"}]
    + _odd("params")
    + _odd("batch")
    + _odd("max_retries", [0, -1, "3", 2.5, Huge(5000), None])
    + _odd("wait", [-1, float("inf"), "1s"])
    + _odd("purpose", [3, ["a"], "a\nb"]),
)
edges = _fields(
    {"from": names, "to": names}, {}, [{}] * 20 + [{"action": action} for action in ACTIONS] * 5 + _odd("action")
)
#: What a document may have besides nodes and edges; two are drawn, so inputs and outputs can meet.
DOCUMENT_EXTRAS = (
    [{}] * 150
    + [{"inputs": {"x": {"default": leaf}}} for leaf in LEAVES[::40]]
    + [{"inputs": {"x": {}, "folder": {"required": False}}}, {"inputs": {}}, {"inputs": {"x": {"required": "no"}}}]
    + [{"inputs": {key: {}}} for key in ["1x", "a b", "", *ODD_KEYS[::2]]]
    + [{"outputs": {"o": {"source": template}}} for template in TEMPLATES[::12]]
    + [{"outputs": {"o": {"source": "${a.x}", "description": 1}}}, {"outputs": {"o": "${a}"}}]
    + [{"outputs": {key: {"source": "${a}"}}} for key in ["1x", "a b", *ODD_KEYS[::2]]]
    + [{"metadata": {"k": leaf}} for leaf in LEAVES[::60]]
    + [{"start_node": name} for name in [*IDS, "zz", *ODD[::3]]]
    + [{"ir_version": "0.1.0", "name": "wf", "description": "d"}, {"max_steps": 50}]
    + _odd("nodes")
    + _odd("edges")
    + _odd("inputs")
    + _odd("outputs")
    + _odd("metadata")
    + _odd("ir_version", ["9.9", 1, None, Huge(5000), Deep(1000, "dict")])
    + _odd("name", [1, "a\nb", ["x"]])
    + _odd("max_steps", [0, "x", 1.5, Huge(5000)])
)
documents = st.builds(
    lambda fields, first, second: fields | first | second if isinstance(fields, dict) else fields,
    _fields({"nodes": st.lists(nodes, min_size=1, max_size=3)}, {"edges": st.lists(edges, max_size=3)}, [{}] * 30),
    st.sampled_from(DOCUMENT_EXTRAS),
    st.sampled_from(DOCUMENT_EXTRAS),
)


# -- sources: the document as a dict, as JSON text or bytes (whole or mangled), in a file ------------------------


def _inside_itself(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with a dict that contains itself, as only Python callers can make one."""
    loop: dict[str, Any] = {"n": 1}
    loop["self"] = loop
    return (doc if isinstance(doc, dict) else {"nodes": doc}) | {"metadata": loop}


splices = st.sampled_from([*'{}[]",:\\', "\\u", "\\ud800", "\ufeff", "\x00", "7" * 5000, "[" * 1000])


@st.composite
def mangled(draw: st.DrawFn, text: str) -> str:
    """JSON text cut, spliced or sprinkled with JSON punctuation, escapes and odd characters."""
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        insert = draw(st.one_of(splices, st.text()))
        cut = draw(st.integers(0, 3))
        text = text[:at] + insert + text[at + cut :]
    return text


@st.composite
def sources(draw: st.DrawFn, folder: Path) -> Any:
    """The document in one of the forms `ir.load` takes (or something it must refuse)."""
    doc = draw(documents)
    text = _written(doc)
    form = draw(st.sampled_from(["dict", "dict", "self", "model", "text", "text", "mangled", "bytes", "file", "other"]))
    if form == "dict" or (text is None and form not in ("self", "model", "other")):
        return _built(doc)
    if form == "self":
        return _inside_itself(_built(doc))
    if form == "model":  # a Workflow built without `ir.load`: its values were never checked
        try:
            return ir.Workflow.model_validate(_built(doc))
        except (pydantic.ValidationError, RecursionError):
            return _built(doc)
    if form == "text":
        return text
    if form == "mangled":
        return draw(mangled(text))
    if form == "bytes":
        data = draw(mangled(text)).encode("utf-8", "surrogatepass")
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(max_size=4)) + data[at:]
    if form == "file":
        path = folder / draw(st.sampled_from(["wf.json", "wf.yaml", "wf"]))
        path.write_bytes(draw(st.one_of(st.just(text), mangled(text))).encode("utf-8", "surrogatepass"))
        return draw(st.sampled_from([path, str(path)]))
    return draw(
        st.one_of(
            st.text(max_size=40),
            st.binary(max_size=40),
            st.text(min_size=300, max_size=5000, alphabet="w/."),
            st.sampled_from(ODD).map(_built),
            st.lists(nodes, max_size=2).map(_built),
        )
    )


# -- the property ----------------------------------------------------------------------------------------------


def assert_loads_or_explains(source: Any) -> None:
    """`ir.load` returns a Workflow, or raises ValidationError with non-empty one-line problems; nothing else."""
    try:
        wf = ir.load(source)
    except ir.ValidationError as exc:
        assert isinstance(exc, ValueError)
        message = str(exc)
        assert message.strip() and exc.problems
        for problem in exc.problems:
            assert problem.strip() and problem.splitlines() == [problem], problem
            problem.encode("utf-8")  # printable on any UTF-8 terminal (no lone surrogates)
        assert len(message.splitlines()) == (1 if len(exc.problems) == 1 else len(exc.problems) + 1), message
    else:
        assert isinstance(wf, ir.Workflow)
        assert isinstance(ir.load(wf.wire()), ir.Workflow)  # what loaded once loads again from its wire form


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.mark.timeout(300 + EXAMPLES // 50)
def test_any_document_loads_or_is_one_validation_error(folder: Path) -> None:
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(sources(folder))
    def check(source: Any) -> None:
        assert_loads_or_explains(source)

    check()


# -- the CLI on the nasty cases --------------------------------------------------------------------------------

_NODE = '{"id": "a", "type": "echo", "params": {"p": %s}}'
NASTY = {
    "param nested 1,000 deep": ('{"nodes": [' + _NODE % Deep(1000, "dict").text() + "]}").encode(),
    "batch items nested 2,000 deep": b'{"nodes": [{"id": "a", "type": "echo", "batch": {"items": '
    + Deep(2000, "list").text().encode()
    + b"}}]}",
    "index of 5,000 digits in an output": b'{"nodes": [{"id": "a", "type": "echo"}], "outputs": {"o": {"source": "${a['
    + b"9" * 5000
    + b']}"}}}',
    "ir_version of 5,000 digits": b'{"ir_version": ' + b"7" * 5000 + b', "nodes": [{"id": "a", "type": "echo"}]}',
    "not UTF-8 inside a string": b'{"nodes": [{"id": "a", "type": "\xc3\x28"}]}',
    "line breaks in a param name and a template": (
        b'{"inputs": {}, "nodes": [{"id": "a", "type": "echo", "params": {"x\\ny": "${\\n zz}", "q\\u2028": "${b}"}}]}'
    ),
    "two default edges from one node": (
        b'{"nodes": [{"id": "a", "type": "echo"}, {"id": "b", "type": "echo"}, {"id": "c", "type": "echo"}],'
        b' "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "c"}]}'
    ),
    "mangled JSON with a lone surrogate escape": b'{"nodes": [{"id": "\\ud800", "type": "echo", "params": {"p": [}]}',
}


@pytest.mark.parametrize("content", list(NASTY.values()), ids=list(NASTY))
@pytest.mark.processes
def test_cli_validate_explains_nasty_documents_without_a_traceback(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(content)
    proc = run_cli("validate", path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    first, *rest = proc.stderr.splitlines()
    assert first.startswith(f"error: {path}: ")
    assert all(line.startswith("  - ") for line in rest), proc.stderr
