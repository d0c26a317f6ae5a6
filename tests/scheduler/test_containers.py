"""deploy/docker-compose.yml run as real containers: podman-compose starts Redis, two workers, the dashboard and the
metrics endpoint from deploy/Dockerfile's image; a batch submitted from this host (`chordflow submit`, against the
containers' Redis) survives one worker container stopped mid-batch (`podman stop` with the file's
stop_grace_period): every item's side effect happens exactly once, the run succeeds, the dashboard lists it and
the metrics endpoint serves chordflow_ metrics.

The images come from `make container-env` (Makefile: podman installed when missing, the base image built from
Debian's packages once, chordflow's rebuilt only where the code changed; `make test` builds them before the
suite starts). An override file, written here, changes only what a test must own: the images' names, free host
ports, Redis published on the loopback so that this host's `chordflow` reaches it, the counting node type mounted
into the workers, and the signing key as a file (podman-compose has no runtime secrets from the environment).
Every container, network and volume of the test's compose project is removed afterwards, also after a failure.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scheduler.localcluster import free_port

pytestmark = [pytest.mark.processes, pytest.mark.timeout(1200)]  # a first `make container-env` builds the images

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
PODMAN_COMPOSE = Path(sys.executable).parent / "podman-compose"
#: The items of the batch, each `SECONDS` of work in chunks of `CHUNK`: about 6 s on the two workers' four
#: processes, so that the worker stopped after its first chunk leaves most of the batch to the other.
ITEMS, SECONDS, CHUNK = 96, 0.25, 4
#: What the operator exports (docker-compose.yml's header); the key also goes to this host's client.
OPERATOR_ENV = {
    "REDIS_PASSWORD": "redis-pw-" + uuid.uuid4().hex,
    "CHORDFLOW_SECRET_KEY": uuid.uuid4().hex * 2,
    "FLOWER_BASIC_AUTH": "flower:flower-pw",
    "CHORDFLOW_DASHBOARD_BASIC_AUTH": "ops:dash-pw",
}
#: Services started: Flower is left out (tests/scheduler/test_deploy.py asks it, as a process).
SERVICES = ("redis", "worker", "dashboard", "metrics")


def container_env() -> dict[str, str]:
    """`make container-env`: podman's flags and configuration here, and the images, built when missing."""
    made = subprocess.run(
        ["make", "-s", "--no-print-directory", "container-env"], cwd=ROOT, capture_output=True, text=True, timeout=1100
    )
    assert made.returncode == 0, made.stderr[-3000:]
    return dict(line.split("=", 1) for line in made.stdout.splitlines() if "=" in line)


def outside_env() -> dict[str, str]:
    """This process's environment without any CHORDFLOW_* variable: under `make test` the suite's own cluster may be
    applied to it (its broker, result backend, key), which must not reach the containers' clients."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CHORDFLOW_")}


def wait_for(what: str, ready: Callable[[], Any], timeout: float = 120) -> Any:
    """Poll `ready` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, redis.RedisError):
            if found := ready():
                return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)


def grace_seconds(duration: str) -> int:
    """A compose duration (`30s`, `11m`, `1m30s`) in whole seconds."""
    scale = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * scale[unit] for n, unit in re.findall(r"(\d+)([hms])", duration))


def get(url: str, auth: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Project:
    """One compose project of deploy/docker-compose.yml plus an override file, on podman."""

    def __init__(self, tmp_path: Path, podman: dict[str, str]):
        self.name = f"cftest{os.getpid()}x{uuid.uuid4().hex[:6]}"
        self.podman_env = {**outside_env(), "CONTAINERS_CONF": podman["CONTAINERS_CONF"]}
        self.podman_flags = shlex.split(podman["PODMAN_FLAGS"])
        self.ports = {name: free_port() for name in ("redis", "dashboard", "metrics", "flower")}
        key_file = tmp_path / "chordflow_secret_key"
        key_file.write_text(OPERATOR_ENV["CHORDFLOW_SECRET_KEY"])
        key_file.chmod(0o644)  # read by the workers' user
        image = podman["CONTAINER_IMAGE"]
        override = {
            "services": {
                "redis": {"image": podman["CONTAINER_REDIS"], "ports": [f"127.0.0.1:{self.ports['redis']}:6379"]},
                "worker": {
                    "image": image,
                    "environment": {"PYTHONPATH": "/plugins"},
                    "volumes": [f"{ROOT / 'tests'}:/plugins/tests:ro"],
                },
                **{name: {"image": image} for name in ("flower", "dashboard", "metrics")},
            },
        }
        self.override = tmp_path / "override.yml"
        self.override.write_text(
            yaml.safe_dump(override)
            # compose's merge tag: the key from this file instead of the environment (the file above)
            + f"secrets:\n  chordflow_secret_key: !override\n    file: {key_file}\n"
        )
        self.compose_env = {
            **self.podman_env,
            **OPERATOR_ENV,
            "CHORDFLOW_PLUGINS": "tests.support.counting_nodes",
            "FLOWER_PORT": str(self.ports["flower"]),
            "DASHBOARD_PORT": str(self.ports["dashboard"]),
            "METRICS_PORT": str(self.ports["metrics"]),
        }

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(PODMAN_COMPOSE), "--podman-args", shlex.join(self.podman_flags), "-p", self.name,
                "-f", str(COMPOSE), "-f", str(self.override), *args]  # fmt: skip
        return subprocess.run(argv, env=self.compose_env, capture_output=True, text=True, timeout=timeout)

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = ["podman", *self.podman_flags, *args]
        return subprocess.run(argv, env=self.podman_env, capture_output=True, text=True, timeout=timeout)

    def containers(self, service: str | None = None) -> list[str]:
        """The project's containers (of one service), by name."""
        labels = ["--filter", f"label=io.podman.compose.project={self.name}"]
        if service:
            labels += ["--filter", f"label=com.docker.compose.service={service}"]
        listed = self.podman("ps", "-a", *labels, "--format", "{{.Names}}")
        return sorted(listed.stdout.split())

    def logs(self) -> str:
        return "\n".join(
            f"--- {c}\n" + (out := self.podman("logs", "--tail", "40", c)).stdout + out.stderr
            for c in self.containers()
        )

    def remove(self) -> None:
        """Everything the project made: containers, its network, its volume (also after a half-made `up`)."""
        self.compose("down", "-v", "-t", "5")
        self.purge(self.name)

    def purge(self, name: str) -> None:
        """Whatever is left of the compose project `name`."""
        label = f"label=io.podman.compose.project={name}"
        leftover = self.podman("ps", "-aq", "--filter", label).stdout.split()
        if leftover:
            self.podman("rm", "-f", "-t", "0", *leftover)
        for kind in ("network", "volume"):
            names = self.podman(kind, "ls", "-q", "--filter", label).stdout.split()
            if names:
                self.podman(kind, "rm", "-f", *names)

    def purge_orphans(self) -> None:
        """Projects of this test whose pytest process is gone (killed before it could clean up)."""
        listed = self.podman("ps", "-a", "--format", '{{index .Labels "io.podman.compose.project"}}').stdout
        for name in set(listed.split()):
            if (found := re.fullmatch(r"cftest(\d+)x\w+", name)) and not Path(f"/proc/{found[1]}").exists():
                self.purge(name)


@contextlib.contextmanager
def project_up(tmp_path: Path) -> Iterator[Project]:
    project = Project(tmp_path, container_env())
    project.purge_orphans()
    try:
        up = project.compose("up", "-d", "--scale", "worker=2", *SERVICES)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield project
    except BaseException:
        print(project.logs())  # shown by pytest with the failure
        raise
    finally:
        project.remove()


def test_compose_file_runs_as_containers_and_a_stopped_worker_loses_nothing(tmp_path: Path) -> None:
    grace = yaml.safe_load(COMPOSE.read_text())["services"]["worker"]["stop_grace_period"]
    key = f"containers:{uuid.uuid4().hex[:8]}"
    workflow = tmp_path / "wf.json"
    workflow.write_text(json.dumps({
        "name": "containers-check",
        "nodes": [
            {"id": "make", "type": "echo", "params": {"numbers": list(range(ITEMS))}},
            {"id": "each", "type": "test-count", "params": {"key": key, "label": "${n}", "seconds": SECONDS},
             "batch": {"items": "${make.numbers}", "as": "n", "chunk_size": CHUNK}},
        ],
        "edges": [{"from": "make", "to": "each"}],
        "outputs": {"labels": {"source": "${each.results}"}},
    }))  # fmt: skip
    with project_up(tmp_path) as project:
        workers = project.containers("worker")
        assert len(workers) == 2, project.containers()
        state = redis.Redis(port=project.ports["redis"], password=OPERATOR_ENV["REDIS_PASSWORD"])
        wait_for("the containers' Redis", state.ping)
        for worker in workers:
            wait_for(f"{worker} ready", lambda w=worker: " ready." in project.podman("logs", w).stderr)
        dashboard = f"http://127.0.0.1:{project.ports['dashboard']}/api/runs"
        wait_for("the dashboard", lambda: get(dashboard, OPERATOR_ENV["CHORDFLOW_DASHBOARD_BASIC_AUTH"])[0] == 200)

        client_env = {
            **outside_env(),
            "CHORDFLOW_HOME": str(tmp_path / "home"),
            "CHORDFLOW_BROKER_URL": f"redis://:{OPERATOR_ENV['REDIS_PASSWORD']}@127.0.0.1:{project.ports['redis']}/0",
            "CHORDFLOW_SECRET_KEY": OPERATOR_ENV["CHORDFLOW_SECRET_KEY"],
            "CHORDFLOW_PLUGINS": "tests.support.counting_nodes",
        }

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, "-m", "scheduler.cli", *args]
            return subprocess.run(argv, cwd=ROOT, env=client_env, capture_output=True, text=True, timeout=300)

        submitted = cli("submit", str(workflow))
        assert submitted.returncode == 0, submitted.stderr
        run_id = submitted.stdout.split()[-1]

        # Mid-batch: a worker has finished a chunk of the batch, most of the batch is still to come.
        def done_a_chunk() -> str | None:
            return next((w for w in workers if f"chunk run={run_id}" in project.podman("logs", w).stderr), None)

        stopped = wait_for("a chunk done on a worker", done_a_chunk, timeout=180)
        assert state.hlen(f"{key}:effects") < ITEMS // 2
        seconds = grace_seconds(grace)
        assert project.podman("stop", "-t", str(seconds), stopped, timeout=seconds + 60).returncode == 0
        exit_code = project.podman("inspect", "--format", "{{.State.ExitCode}}", stopped).stdout.strip()
        assert exit_code == "0", f"{stopped} was killed (exit {exit_code}), not stopped within {grace}"

        waited = cli("wait", run_id, "--timeout", "240")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        results = cli("results", run_id)
        assert results.returncode == 0, results.stderr
        assert [r["label"] for r in json.loads(results.stdout)["labels"]] == [str(i) for i in range(ITEMS)]
        effects = {k.decode(): int(v) for k, v in state.hgetall(f"{key}:effects").items()}
        assert effects == {str(i): 1 for i in range(ITEMS)}  # every item's side effect exactly once

        status, body = get(dashboard, OPERATOR_ENV["CHORDFLOW_DASHBOARD_BASIC_AUTH"])
        assert status == 200
        assert {"run_id": run_id, "status": "succeeded", "done": ITEMS} in [
            {k: r[k] for k in ("run_id", "status", "done")} for r in json.loads(body)["runs"]
        ]
        assert get(dashboard)[0] == 401

        status, body = get(f"http://127.0.0.1:{project.ports['metrics']}/metrics")
        assert status == 200
        scraped = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
        }
        assert scraped[("chordflow_up", ())] == 1
        assert scraped[("chordflow_runs", (("status", "succeeded"), ("workflow", "containers-check")))] == 1
