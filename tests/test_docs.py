"""The docs: the generated reference matches the code, the site builds with --strict, and the README is a doorway
whose quick starts and node-type example run as written, printing what it shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.localcluster import RedisServer

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference"
#: What differs between two runs of one command: the run id and the seconds it took.
RUN_ID, SECONDS = re.compile(r"\b[0-9a-f]{12}\b"), re.compile(r"\b\d+\.\d+s\b")


def readme_section(heading: str) -> str:
    """The text under README's `## heading`, up to the next `## `."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def code_blocks(section: str) -> list[str]:
    """The fenced blocks of a section, in order, without their fences."""
    return re.findall(r"^```[a-z]*\n(.*?)^```$", section, flags=re.S | re.M)


def same_but_ids(shown: str, printed: str) -> None:
    """`printed` is `shown` line for line, but for run ids and durations."""

    def masked(text: str) -> list[str]:
        return [SECONDS.sub("<s>", RUN_ID.sub("<run>", line)).rstrip() for line in text.strip().splitlines()]

    assert masked(printed) == masked(shown), printed


def readme_workdir(tmp_path: Path) -> Path:
    """A directory laid out as the repository's root for the README's commands: `.venv` (this interpreter's
    environment, where chordflow is installed) and `examples`."""
    (tmp_path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    return tmp_path


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh shell: none of the suite's CHORDFLOW_* settings, runs kept under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHORDFLOW_")}
    return {**env, "CHORDFLOW_HOME": str(tmp_path / "home"), **extra}


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, encoding="utf-8", timeout=180
    )


# -- the generated reference and the site ---------------------------------------------------------------------


@pytest.mark.processes
def test_the_reference_pages_are_what_the_code_gives(tmp_path: Path) -> None:
    generated = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_reference.py"), str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    fresh = {path.name: path.read_text(encoding="utf-8") for path in tmp_path.glob("*.md")}
    committed = {path.name: path.read_text(encoding="utf-8") for path in REFERENCE.glob("*.md")}
    assert len(fresh) >= 7
    for name in sorted(fresh.keys() | committed.keys()):
        assert name in committed, f"docs/reference/{name} is missing: run `make docs` and commit it"
        assert name in fresh, f"docs/reference/{name} is no longer generated: delete it"
        assert committed[name] == fresh[name], f"docs/reference/{name} is stale: run `make docs` and commit it"


def test_the_reference_covers_every_command_variable_and_node_type() -> None:
    import dataclasses

    from scheduler.cli.group import COMMANDS
    from worker import settings
    from worker.nodes import names

    cli = (REFERENCE / "cli.md").read_text(encoding="utf-8")
    assert [c for c in COMMANDS if f"## `chordflow {c}`" not in cli] == []
    environment = (REFERENCE / "environment.md").read_text(encoding="utf-8")
    variables = [f.metadata["variable"] for f in dataclasses.fields(settings.Settings)]
    assert [v for v in variables if f"| `{v}` |" not in environment] == []
    nodes = (REFERENCE / "nodes.md").read_text(encoding="utf-8")
    built_in = [n for n in names() if not n.startswith("test")]  # the suite's plugin types are not documented
    assert [n for n in built_in if f"## `{n}`" not in nodes] == []


@pytest.mark.processes
def test_the_docs_site_builds_with_strict(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    pages = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in ("guide/workflows", "guide/cluster", "reference/cli", "reference/keyspace", "ARCHITECTURE"):
        assert f"{page}/index.html" in pages


# -- the README -------------------------------------------------------------------------------------------------


def test_the_readme_is_a_doorway_with_a_table_of_contents_first() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    first_list = re.search(r"^(- \[.+\]\(#.+\)\n)+", text, flags=re.M)
    assert first_list is not None and first_list.start() < text.index("\n## ")  # before the first section
    contents = re.findall(r"^- \[(.+)\]\(#(.+)\)$", first_list.group(0), flags=re.M)
    assert [title for title, _ in contents] == headings
    for title, anchor in contents:
        assert anchor == re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    for link in re.findall(r"\]\(((?:docs|examples)/[^)#]+)", text):
        assert (ROOT / link).exists(), link


@pytest.mark.processes
def test_the_local_quick_start_prints_what_the_readme_shows(tmp_path: Path) -> None:
    section = readme_section("Quick start: local")
    command, output = code_blocks(section)
    assert command.strip() == "make run"
    echoed, _, shown = output.partition("\n")  # make echoes the command it runs, then the command prints
    recipe = re.search(r"^run: .*\n\t(.+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), flags=re.M)
    assert recipe is not None and echoed == recipe.group(1).replace("$(BIN)", ".venv/bin")
    ran = bash(echoed, readme_workdir(tmp_path), clean_env(tmp_path))
    assert ran.returncode == 0, ran.stderr
    same_but_ids(shown, ran.stdout)


@pytest.mark.processes
def test_the_cluster_quick_start_runs_as_written(tmp_path: Path) -> None:
    """The four commands but the first: this test's own redis-server stands for `redis-server --daemonize yes`
    (which would bind the machine's port 6379), named by CHORDFLOW_BROKER_URL as the README allows."""
    commands, shown = code_blocks(readme_section("Quick start: a cluster in four commands"))
    lines = commands.strip().splitlines()
    assert len(lines) == 4 and lines[0] == "redis-server --daemonize yes"
    assert lines[2].endswith("&"), "the worker runs in the background"
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    try:
        env = clean_env(tmp_path, CHORDFLOW_BROKER_URL=redis.url)
        script = "\n".join([lines[1], lines[2], "worker=$!", "trap 'kill $worker; wait $worker' EXIT", lines[3]])
        ran = bash(script, readme_workdir(tmp_path), env)
    finally:
        redis.kill()
    assert ran.returncode == 0, ran.stderr + (tmp_path / "worker.log").read_text(encoding="utf-8")
    same_but_ids(shown, ran.stderr + ran.stdout)  # the run id line is on stderr, first


@pytest.mark.processes
def test_the_readme_node_type_runs_as_written(tmp_path: Path) -> None:
    module, workflow, command, shown = code_blocks(readme_section("Write a node type"))
    workdir = readme_workdir(tmp_path)
    (workdir / "shout.py").write_text(module, encoding="utf-8")
    (workdir / "shout.json").write_text(workflow, encoding="utf-8")
    ran = bash(command.strip(), workdir, clean_env(tmp_path))
    assert ran.returncode == 0, ran.stderr
    same_but_ids(shown, ran.stdout)
