"""The deploy/ files, exercised: parsed, checked against the code, and run.

This machine has no container engine, so each service of deploy/docker-compose.yml and each container of
deploy/k8s/ is started from the repository as a plain process, wired by exactly the environment the file
sets (nothing of this test's own environment but PATH and a HOME). What a container runtime would do is
done here and nothing more: `${VAR}` interpolation from the operator's environment (compose), `$(VAR)`
expansion, ConfigMaps and Secrets as env and as mounted files (Kubernetes; the Secrets are those the
manifests tell the operator to create), service names resolved to the process serving them. Listening
ports and directories are moved to free ports and temporary directories, and addresses to 127.0.0.1 —
only where the file says what they are, so a URL naming a port nothing listens on still fails.

Then a batch runs through them (`chordflow submit` + `wait` with a client's environment from the file),
Flower and the dashboard are asked with and without their credentials, and the metrics are scraped.
Static checks (commands and options that `chordflow` accepts, CHORDFLOW_* names the code reads, ports,
secrets, the KEDA trigger on the metrics' desired workers, the grace period against the visibility timeout) run
first, and `test_*_checks_catch` shows that each kind of mistake in a file is caught.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
import redis
import yaml  # PyYAML, a dev dependency: parses the deploy files

from scheduler.localcluster import ManagedProcess, free_port, redis_binary

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
#: Ports the commands listen on when the file gives none (redis-server's own default; chordflow's are read
#: from its options).
REDIS_PORT = 6379
#: What the operator exports before `docker compose up` (the top of docker-compose.yml says so).
OPERATOR_ENV = {
    "REDIS_PASSWORD": "redis-pw-" + "7" * 16,
    "CHORDFLOW_SECRET_KEY": "k" * 64,
    "FLOWER_BASIC_AUTH": "flower:flower-pw",
    "CHORDFLOW_DASHBOARD_BASIC_AUTH": "ops:dash-pw",
}
#: The Secrets the manifests tell the operator to create (`kubectl create secret generic ...`).
K8S_SECRETS = {
    "chordflow-redis": {"password": "redis-pw-" + "8" * 16},
    "chordflow-signing-key": {"key": "s" * 64},
    "chordflow-flower": {"FLOWER_BASIC_AUTH": "flower:flower-pw"},
    "chordflow-dashboard": {"CHORDFLOW_DASHBOARD_BASIC_AUTH": "ops:dash-pw"},
}
#: A workflow with no inputs (the k8s client Job passes none): a batch of 40 items in chunks of 5.
WORKFLOW = {
    "name": "deploy-check",
    "nodes": [
        {"id": "make", "type": "echo", "params": {"numbers": list(range(40))}},
        {"id": "each", "type": "echo", "params": {"value": "${n}"},
         "batch": {"items": "${make.numbers}", "as": "n", "chunk_size": 5}},
    ],
    "edges": [{"from": "make", "to": "each"}],
    "outputs": {"count": {"source": "${each.count}"}},
}  # fmt: skip
#: How each kind of process says it is ready.
READY = {"redis-server": "Ready to accept connections", "worker": "ready.", "flower": "Visit me at",
         "dashboard": "Uvicorn running on", "metrics": "serving metrics on"}  # fmt: skip


# -- what the code offers: commands, options, settings -------------------------------------------------------


def commands() -> dict[str, click.Command]:
    """The `chordflow` commands (`chordflow --help`)."""
    from scheduler.cli import cli

    ctx = click.Context(cli)
    return {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}


def names_read_by_code() -> set[str]:
    """The environment names chordflow's code spells as a string (`"CHORDFLOW_QUEUE"`, `"FLOWER_BASIC_AUTH"`):
    worker/settings.py's and those read elsewhere (plugins, the embedded store, auth of flower/dashboard)."""
    found: set[str] = set()
    for package in ("ir", "scheduler", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            found |= set(re.findall(r"[\"']([A-Z][A-Z0-9]*_[A-Z0-9_]+)[\"']", path.read_text()))
    return found


def _ports_of(argv: list[str]) -> tuple[dict[str, int], list[str]]:
    """({option: the port it listens on}, problems) of a command line; `chordflow` ones parsed by click."""
    if not argv:
        return {}, ["no command"]
    if Path(argv[0]).name == "redis-server":
        values = dict(zip(argv[1::2], argv[2::2], strict=False))
        return {"--port": int(values.get("--port", REDIS_PORT))}, []
    if argv[0] != "chordflow":
        return {}, [f"{argv[0]}: not a command of this repository (chordflow, redis-server)"]
    if len(argv) < 2 or argv[1] not in commands():
        return {}, [f"`{' '.join(argv[:2])}`: not a chordflow command (chordflow --help)"]
    try:
        params = commands()[argv[1]].make_context(argv[1], list(argv[2:])).params
    except click.ClickException as exc:
        return {}, [f"`{' '.join(argv)}`: {exc.format_message()}"]
    ports = {}
    if isinstance(params.get("port"), int):
        ports["--port"] = params["port"]
    if params.get("metrics_port"):
        ports["--metrics-port"] = int(str(params["metrics_port"]).rsplit(":", 1)[-1])
    return ports, []


def role(argv: list[str]) -> str:
    return "redis-server" if Path(argv[0]).name == "redis-server" else argv[1]


# -- a deployment as plain processes ------------------------------------------------------------------------


@dataclass
class Container:
    """One container (or compose service) as the file describes it, after the runtime's substitutions."""

    name: str
    argv: list[str]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # path inside the container -> content
    replicas: int = 1
    declared_ports: set[int] = field(default_factory=set)  # compose: published; k8s: containerPort
    port_names: dict[str, int] = field(default_factory=dict)  # k8s: named containerPorts
    spec_text: str = ""  # the service or container as written: what its env may be referred to by

    @property
    def ports(self) -> dict[str, int]:
        return _ports_of(self.argv)[0]


@dataclass
class Deployment:
    """Containers plus the names they reach each other by."""

    containers: dict[str, Container]
    hosts: dict[str, dict[int, tuple[str, int]]]  # host -> {port: (container name, the port it listens on)}
    problems: list[str] = field(default_factory=list)

    def container(self, command: str) -> Container:
        found = [c for c in self.containers.values() if c.argv and c.argv[0] == "chordflow" and c.argv[1] == command]
        assert found, f"no container runs `chordflow {command}`"
        return found[0]


def url_problems(deployment: Deployment) -> list[str]:
    """Every `host:port` in an env value that names a service must be a port that service's process listens on."""
    problems = []
    for c in deployment.containers.values():
        for name, value in c.env.items():
            for host, port in re.findall(r"(?<=[@/])([a-z][a-z0-9-]*):(\d+)", value):
                target = deployment.hosts.get(host)
                if target is None:
                    problems.append(f"{c.name}: {name} points at {host}:{port}, and no service is called {host}")
                elif int(port) not in target:
                    problems.append(f"{c.name}: {name} points at {host}:{port}, which nothing listens on there")
    return problems


def env_problems(c: Container, known: set[str]) -> list[str]:
    """Names the code reads (or that the container's own command or another value refers to)."""
    text = c.spec_text
    return [
        f"{c.name}: {name} is read by nothing (not a chordflow setting)"
        for name in c.env
        if name not in known and f"$({name})" not in text and f"${name}" not in text and f"${{{name}}}" not in text
    ]


class Runner:
    """Starts a Deployment's containers as processes, each port and directory moved, and stops them all."""

    def __init__(self, deployment: Deployment, workdir: Path):
        self.d, self.workdir = deployment, workdir
        self.local: dict[tuple[str, int, int], int] = {}  # (container, replica, its port) -> local port
        self.stack = contextlib.ExitStack()

    def path(self, c: Container, replica: int, what: str) -> Path:
        """A container replica's own file or directory here (its data dir, mounted files, HOME, log)."""
        return self.workdir / f"{c.name.replace('/', '-')}-{replica}-{what}"

    def local_port(self, container: str, port: int, replica: int = 0) -> int:
        return self.local.setdefault((container, replica, port), free_port())

    def argv(self, c: Container, replica: int) -> list[str]:
        argv, out = list(c.argv), []
        ports = c.ports
        i = 0
        while i < len(argv):
            arg = argv[i]
            if arg in ("--port", "--metrics-port", "--address", "--dir", "--bind") and i + 1 < len(argv):
                value = argv[i + 1]
                if arg in ports:
                    local = self.local_port(c.name, ports[arg], replica)
                    value = str(local) if arg == "--port" else f"127.0.0.1:{local}"
                elif arg in ("--address", "--bind"):
                    value = "127.0.0.1"
                elif arg == "--dir":
                    value = str(self.path(c, replica, "data"))
                    Path(value).mkdir(exist_ok=True)
                out += [arg, value]
                i += 2
                continue
            out.append(arg)
            i += 1
        if "--port" in ports and "--port" not in argv:  # listening on the default port: move it too
            out += ["--port", str(self.local_port(c.name, ports["--port"], replica))]
        if out[0] == "chordflow":
            return [sys.executable, "-m", "scheduler.cli", *out[1:]]
        if Path(out[0]).name == "redis-server":
            return [redis_binary(), *out[1:], "--bind", "127.0.0.1"]
        return out

    def env(self, c: Container, replica: int = 0) -> dict[str, str]:
        """Exactly the container's env, its service names resolved and its mounted files in a directory here."""
        root = self.path(c, replica, "files")
        mounts = {}
        for path, content in c.files.items():
            local = root / path.lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(content)
            mounts[path] = str(local)

        env = {}
        for name, value in c.env.items():
            value = re.sub(r"(?<=[@/])([a-z][a-z0-9-]*):(\d+)", self._resolve, value)
            env[name] = mounts.get(value, value)
        home = self.path(c, replica, "home")
        home.mkdir(exist_ok=True)
        return {**env, "PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}

    def _resolve(self, match: re.Match[str]) -> str:
        host, port = match[1], int(match[2])
        if host not in self.d.hosts:
            return match[0]
        container, listening = self.d.hosts[host][port]
        return f"127.0.0.1:{self.local_port(container, listening)}"

    def start(self, c: Container) -> list[ManagedProcess]:
        processes = []
        for replica in range(c.replicas):
            log = self.path(c, replica, "log")
            process = ManagedProcess(self.argv(c, replica), log, READY[role(c.argv)], env=self.env(c, replica))
            self.stack.callback(process.kill)
            processes.append(process)
        return processes

    def run(self, c: Container, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A client command (`chordflow submit ...`) with the env of container `c`."""
        argv = [sys.executable, "-m", "scheduler.cli", *args]
        return subprocess.run(argv, env=self.env(c), capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    def url(self, c: Container, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.local_port(c.name, c.ports['--port'])}{path}"


# -- docker-compose.yml -----------------------------------------------------------------------------------

_COMPOSE_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_]\w*))"
)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR:?error}`, `$$` in every string of a parsed file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name, op = m["name"] or m["bare"], m["op"] or ""
        found = env.get(name)
        missing = not found if op.startswith(":") else found is None
        if op.endswith("-") and missing:
            return m["arg"]
        if op.endswith("?") and missing:
            raise ValueError(f"compose: {name} is required: {m['arg']}")
        return found or ""

    return _COMPOSE_VAR.sub(sub, value)


def _seconds(duration: Any) -> float:
    """A compose duration (`660s`, `11m`, `1m30s`) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", str(duration))
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[unit] for n, unit in parts)


def compose_deployment(text: str, operator_env: dict[str, str]) -> Deployment:
    doc = interpolate(yaml.safe_load(text), operator_env)
    known, problems = names_read_by_code(), []
    containers, hosts = {}, {}
    secrets = doc.get("secrets") or {}
    for name, service in doc["services"].items():
        command = service.get("command")
        if not isinstance(command, list):
            problems.append(f"{name}: `command` must be a list (exec form)")
            continue
        env = service.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        env = {k: "" if v is None else str(v) for k, v in env.items()}
        files = {}
        for entry in service.get("secrets") or []:
            source = entry if isinstance(entry, str) else entry["source"]
            target = entry if isinstance(entry, str) else entry.get("target", source)
            if source not in secrets:
                problems.append(f"{name}: secret {source} is not defined under `secrets:`")
                continue
            spec = secrets[source]
            content = operator_env.get(spec["environment"], "") if "environment" in spec else None
            if content is None:
                content = (COMPOSE.parent / spec["file"]).read_text()
            files[target if target.startswith("/") else f"/run/secrets/{target}"] = content
        published = set()
        for port in service.get("ports") or []:
            published.add(int(str(port).split("/")[0].rsplit(":", 1)[-1]))
        c = Container(name, [str(a) for a in command], env, files, 2 if name == "worker" else 1, published)
        c.spec_text = json.dumps(service)
        ports, command_problems = _ports_of(c.argv)
        problems += [f"{name}: {p}" for p in command_problems]
        problems += [
            f"{name}: publishes container port {p}, but `{' '.join(c.argv[:2])}` listens on {sorted(ports.values())}"
            for p in published - set(ports.values())
        ]
        problems += env_problems(c, known)
        for var, value in env.items():
            if var.endswith("_FILE") and value not in files:
                problems.append(f"{name}: {var}={value} is no file mounted in the container (its `secrets:`)")
        containers[name] = c
        hosts[name] = {port: (name, port) for port in ports.values()}
    deployment = Deployment(containers, hosts, problems)
    deployment.problems += url_problems(deployment)
    worker = next((c for c in containers.values() if c.argv[:2] == ["chordflow", "worker"]), None)
    if worker is None:
        deployment.problems.append("no service runs `chordflow worker`")
    else:
        grace = _seconds(doc["services"][worker.name].get("stop_grace_period", "10s"))
        if problem := grace_problem(grace, worker.env):
            deployment.problems.append(f"{worker.name}: stop_grace_period {problem}")
    return deployment


def grace_problem(grace: float, env: dict[str, str]) -> str | None:
    """What is wrong with a worker's grace period: a drain needs CHORDFLOW_DRAIN_GRACE and 10 s to exit."""
    drain = float(env.get("CHORDFLOW_DRAIN_GRACE", 25))
    if grace >= drain + 10:
        return None
    return (
        f"{grace:g}s leaves a draining worker less than 10 s past CHORDFLOW_DRAIN_GRACE ({drain:g}s, deploy/README.md)"
    )


# -- deploy/k8s ---------------------------------------------------------------------------------------------

WORKLOADS = ("Deployment", "StatefulSet", "Job")


def k8s_docs(texts: dict[str, str]) -> list[dict[str, Any]]:
    return [doc for text in texts.values() for doc in yaml.safe_load_all(text) if doc]


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)`: replaced when VAR is defined before, left as it is otherwise; `$$(` escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_]\w*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), value)


def _k8s_container(
    where: str, item: dict[str, Any], volumes: dict[str, Any], lookup: Any, problems: list[str]
) -> Container:
    """A container spec as the kubelet runs it: env (envFrom first, then env with `$(VAR)` expanded),
    argv (command + args, expanded), mounted Secret/ConfigMap files; its ports and probes checked."""
    env: dict[str, str] = {}
    for source in item.get("envFrom") or []:
        if "configMapRef" in source:
            env.update(lookup("configmap", source["configMapRef"]["name"], None, where))
        if "secretRef" in source:
            env.update(lookup("secret", source["secretRef"]["name"], None, where))
    for var in item.get("env") or []:
        if "value" in var:
            value = _expand(str(var["value"]), env)
            problems += [f"{where}: {var['name']} refers to $({ref}), defined nowhere before it"
                         for ref in re.findall(r"\$\((\w+)\)", value)]  # fmt: skip
            env[var["name"]] = value
        for kind, ref in (var.get("valueFrom") or {}).items():
            if kind in ("secretKeyRef", "configMapKeyRef"):
                source_kind = "secret" if kind == "secretKeyRef" else "configmap"
                env[var["name"]] = lookup(source_kind, ref["name"], ref["key"], where) or ""
    argv = [_expand(str(a), env) for a in [*(item.get("command") or []), *(item.get("args") or [])]]
    files = {}
    for mount in item.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            problems.append(f"{where}: mounts volume {mount['name']}, which the pod does not have")
            continue
        for kind, field_, name_key in (("secret", "secret", "secretName"), ("configmap", "configMap", "name")):
            if field_ in volume:
                data = lookup(kind, volume[field_][name_key], None, where) or {}
                for entry in volume[field_].get("items") or [{"key": k, "path": k} for k in data]:
                    files[f"{mount['mountPath'].rstrip('/')}/{entry['path']}"] = data.get(entry["key"], "")
    names = {p["name"]: p["containerPort"] for p in item.get("ports") or [] if "name" in p}
    declared = {p["containerPort"] for p in item.get("ports") or []}
    c = Container(where, argv, env, files, 1, declared, names, spec_text=json.dumps(item))
    ports, command_problems = _ports_of(argv)
    problems += [f"{where}: {p}" for p in command_problems]
    problems += [
        f"{where}: listens on {port} ({option}) but declares containerPorts {sorted(declared)}"
        for option, port in ports.items()
        if port not in declared
    ]
    for probe in ("readinessProbe", "livenessProbe"):
        check = item.get(probe) or {}
        port = (check.get("tcpSocket") or check.get("httpGet") or {}).get("port")
        if port is not None and names.get(port, port) not in ports.values():
            problems.append(f"{where}: {probe} on port {port}, which the command does not listen on")
    for var, value in env.items():
        if var.endswith("_FILE") and value not in files:
            problems.append(f"{where}: {var}={value} is no file mounted in the container")
    return c


def k8s_deployment(texts: dict[str, str], secrets: dict[str, dict[str, str]], configmaps: dict[str, Any]) -> Deployment:
    docs = k8s_docs(texts)
    known, problems = names_read_by_code(), []
    maps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"} | configmaps
    containers: dict[str, Container] = {}
    pods: dict[str, tuple[dict[str, str], list[Container], dict[str, Any]]] = {}  # workload -> labels, containers

    def lookup(kind: str, name: str, key: str | None, where: str) -> Any:
        source = secrets if kind == "secret" else maps
        if name not in source:
            problems.append(f"{where}: {kind} {name} is neither in deploy/k8s nor among the documented secrets")
            return None if key else {}
        if key is not None and key not in source[name]:
            problems.append(f"{where}: {kind} {name} has no key {key}")
            return None
        return source[name][key] if key is not None else source[name]

    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        workload = doc["metadata"]["name"]
        template = doc["spec"]["template"]
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        volumes |= {claim["metadata"]["name"]: {} for claim in doc["spec"].get("volumeClaimTemplates") or []}
        pods[workload] = (template["metadata"].get("labels") or {}, [], spec)
        for item in spec["containers"]:
            c = _k8s_container(f"{workload}/{item['name']}", item, volumes, lookup, problems)
            c.replicas = int(doc["spec"].get("replicas", 1))
            problems += env_problems(c, known)
            containers[c.name] = c
            pods[workload][1].append(c)

    hosts: dict[str, dict[int, tuple[str, int]]] = {}
    for doc in docs:
        if doc["kind"] != "Service":
            continue
        name, selector = doc["metadata"]["name"], doc["spec"].get("selector") or {}
        selected = [w for w, (labels, _, _) in pods.items() if selector.items() <= labels.items()]
        if not selected:
            problems.append(f"service {name}: its selector {selector} matches no pod template")
            continue
        hosts[name] = {}
        for port in doc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            serving = [
                (c.name, c.port_names.get(target, target))
                for w in selected
                for c in pods[w][1]
                if c.port_names.get(target, target) in c.ports.values()
            ]
            if not serving:
                problems.append(f"service {name}: targetPort {target} is no port its pods' commands listen on")
            else:
                hosts[name][port["port"]] = serving[0]
    deployment = Deployment(containers, hosts, problems)
    deployment.problems += url_problems(deployment)
    deployment.problems += _k8s_scaling_problems(docs, pods, hosts)
    deployment.problems += _k8s_network_problems(docs, pods)
    return deployment


def _k8s_scaling_problems(docs: list[dict[str, Any]], pods: dict[str, Any], hosts: dict[str, Any]) -> list[str]:
    """The worker Deployment's grace period, and KEDA scaling it from zero on the metrics' desired workers."""
    problems = []
    workers = [w for w, (_, cs, _) in pods.items() if any(c.argv[:2] == ["chordflow", "worker"] for c in cs)]
    if len(workers) != 1:
        return [f"expected one workload running `chordflow worker`, found {workers}"]
    worker = workers[0]
    _, (container, *_), spec = pods[worker]
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    if problem := grace_problem(grace, container.env):
        problems.append(f"{worker}: terminationGracePeriodSeconds {problem}")
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    if not scaled:
        problems.append("no KEDA ScaledObject for the workers")
    for obj in scaled:
        spec = obj["spec"]
        if spec["scaleTargetRef"]["name"] != worker:
            problems.append(f"ScaledObject {obj['metadata']['name']} scales {spec['scaleTargetRef']['name']}")
        if spec.get("minReplicaCount", 1) != 0:
            problems.append(f"ScaledObject {obj['metadata']['name']}: minReplicaCount must be 0 (idle: no worker)")
        for trigger in spec["triggers"]:
            problems += _trigger_problems(trigger, pods, hosts)
    problems += _worker_slots_problems(pods, container)
    return problems


def _trigger_problems(trigger: dict[str, Any], pods: dict[str, Any], hosts: dict[str, Any]) -> list[str]:
    """KEDA reads the desired workers from `chordflow metrics` (a metrics-api trigger, Prometheus text), scaled from
    zero as soon as the gauge is above 0."""
    meta = trigger.get("metadata") or {}
    if trigger["type"] != "metrics-api" or meta.get("format") != "prometheus":
        return [f"KEDA trigger {trigger['type']} (format {meta.get('format')}): not the metrics endpoint's text"]
    problems = []
    if meta.get("valueLocation") != "chordflow_desired_workers" or meta.get("valueLocation") not in cluster_metrics():
        problems.append(f"KEDA trigger reads {meta.get('valueLocation')}, not chordflow_desired_workers")
    if trigger.get("metricType", "AverageValue") != "AverageValue" or meta.get("targetValue") != "1":
        problems.append("KEDA trigger: the gauge is in workers: AverageValue with targetValue 1")
    if float(meta.get("activationTargetValue", 0)) != 0:
        problems.append("KEDA trigger: activationTargetValue must be 0 (a first worker as soon as there is work)")
    match = re.fullmatch(r"http://([a-z0-9-]+):(\d+)/metrics", meta.get("url", ""))
    served = hosts.get(match[1], {}).get(int(match[2])) if match else None
    if served is None or pods_command(pods, served[0]) != ["chordflow", "metrics"]:
        problems.append(f"KEDA trigger's url {meta.get('url')} is no Service port of `chordflow metrics`")
    return problems


def _worker_slots_problems(pods: dict[str, Any], worker: Container) -> list[str]:
    """`chordflow metrics --worker-slots` is the workers' --concurrency: the workers asked for from zero."""
    concurrency = click_params(worker.argv).get("concurrency")
    metrics = [c for _, cs, _ in pods.values() for c in cs if c.argv[:2] == ["chordflow", "metrics"]]
    slots = [click_params(c.argv).get("worker_slots") for c in metrics]
    if slots != [concurrency]:
        return [f"chordflow metrics --worker-slots {slots} must be the workers' --concurrency ({concurrency})"]
    return []


def click_params(argv: list[str]) -> dict[str, Any]:
    """A `chordflow` command line's options as its click command parses them."""
    return commands()[argv[1]].make_context(argv[1], list(argv[2:])).params


def pods_command(pods: dict[str, Any], container: str) -> list[str]:
    """The command (`chordflow <name>`) of a container by its name."""
    return next((c.argv[:2] for _, cs, _ in pods.values() for c in cs if c.name == container), [])


def cluster_metrics() -> set[str]:
    """The names `chordflow metrics` serves (its collector, with nothing in the cluster)."""
    from scheduler.ops import metrics

    class Empty:
        def snapshot(self) -> metrics.ClusterSnapshot:
            return metrics.ClusterSnapshot(taken=0.0, runs=Counter(), active=[], queues=[], unacked=0, workers={})

    return {family.name for family in metrics.ClusterCollector(Empty()).collect()}  # type: ignore[arg-type]


def _k8s_network_problems(docs: list[dict[str, Any]], pods: dict[str, Any]) -> list[str]:
    """Every pod that talks to Redis is let in by Redis's NetworkPolicy."""
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    allowed: set[str] = set()
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                selector = peer.get("podSelector", {})
                allowed |= set(selector.get("matchLabels", {}).values())
                for expression in selector.get("matchExpressions", []):
                    allowed |= set(expression.get("values", []))
    problems = []
    for workload, (labels, containers, _) in pods.items():
        if policies and any("CHORDFLOW_BROKER_URL" in c.env for c in containers) and labels.get("app") not in allowed:
            problems.append(f"{workload}: its pods (app={labels.get('app')}) are not let in by Redis's NetworkPolicy")
    return problems


# -- running a deployment -------------------------------------------------------------------------------------


def get(url: str, auth: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A /metrics page parsed by prometheus_client's parser: {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = get(url)
    assert status == 200, url
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


@contextlib.contextmanager
def running(deployment: Deployment, workdir: Path) -> Iterator[Runner]:
    """Start every container: Redis first, then workers, then the rest (as depends_on / readiness order them)."""
    runner = Runner(deployment, workdir)
    order = {"redis-server": 0, "worker": 1}
    with runner.stack:
        for c in sorted(deployment.containers.values(), key=lambda c: order.get(role(c.argv), 2)):
            if role(c.argv) in READY:
                runner.start(c)
        yield runner


def exercise(runner: Runner, client: Container, submit: list[str], auth: dict[str, str]) -> None:
    """A batch through the running deployment, then Redis's settings, Flower, the dashboard and the metrics."""
    d = runner.d
    redis_c = next(c for c in d.containers.values() if role(c.argv) == "redis-server")
    password = redis_c.argv[redis_c.argv.index("--requirepass") + 1]
    server = redis.Redis(port=runner.local_port(redis_c.name, redis_c.ports["--port"]), password=password)
    assert server.config_get("appendonly") == {"appendonly": "yes"}
    assert server.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=runner.local_port(redis_c.name, redis_c.ports["--port"])).ping()

    submitted = runner.run(client, *submit)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.split()[-1]
    waited = runner.run(client, "wait", run_id, "--timeout", "120")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    outputs = runner.run(client, "results", run_id)
    assert json.loads(outputs.stdout) == {"count": 40}, outputs.stderr

    flower = d.container("flower")
    assert get(runner.url(flower))[0] == 401
    assert get(runner.url(flower), auth["flower"])[0] == 200
    dashboard = d.container("dashboard")
    assert get(runner.url(dashboard, "/api/runs"))[0] == 401
    status, body = get(runner.url(dashboard, "/api/runs"), auth["dashboard"])
    assert status == 200
    assert {"run_id": run_id, "status": "succeeded", "done": 40} in [
        {k: r[k] for k in ("run_id", "status", "done")} for r in json.loads(body)["runs"]
    ]

    cluster = samples(runner.url(d.container("metrics"), "/metrics"))
    assert cluster[("chordflow_up", ())] == 1
    assert cluster[("chordflow_runs", (("status", "succeeded"), ("workflow", "deploy-check")))] == 1
    assert cluster[("chordflow_desired_workers", ())] == 0  # the batch ran: nothing left to scale for
    worker = d.container("worker")
    processed = 0.0
    for replica in range(worker.replicas):
        port = runner.local_port(worker.name, worker.ports["--metrics-port"], replica)
        per_worker = samples(f"http://127.0.0.1:{port}/metrics")
        processed += sum(v for (name, labels), v in per_worker.items() if name == "chordflow_items_processed_total")
    assert processed >= 40  # every item ran on one of the replicas (a redelivered chunk may count twice)


# -- the tests --------------------------------------------------------------------------------------------------


def k8s_texts() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(K8S.glob("*.yaml"))}


def k8s_of(texts: dict[str, str]) -> Deployment:
    return k8s_deployment(texts, K8S_SECRETS, {"chordflow-workflow": {"wf.json": json.dumps(WORKFLOW)}})


def test_compose_file_is_consistent_with_the_code() -> None:
    deployment = compose_deployment(COMPOSE.read_text(), OPERATOR_ENV)
    assert deployment.problems == []
    assert {role(c.argv) for c in deployment.containers.values()} == {
        "redis-server", "worker", "flower", "dashboard", "metrics"
    }  # fmt: skip


def test_k8s_manifests_are_consistent_with_the_code() -> None:
    deployment = k8s_of(k8s_texts())
    assert deployment.problems == []
    kinds = {doc["kind"] for doc in k8s_docs(k8s_texts())}
    assert {"ScaledObject", "NetworkPolicy", "StatefulSet", "Job"} <= kinds
    assert {role(c.argv) for c in deployment.containers.values()} == {
        "redis-server", "worker", "flower", "dashboard", "metrics", "submit"
    }  # fmt: skip


def test_dockerfile_installs_what_the_services_run() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"Dockerfile copies {path}, which the repository does not have"
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M)[1])
    assert _ports_of(cmd)[1] == []
    assert "flower" in re.search(r"^RUN pip install .*$", dockerfile, re.M)[0]  # `chordflow flower` needs it


COMPOSE_MISTAKES = {
    "an unknown command": ('"chordflow", "dashboard"', '"chordflow", "dashbord"', "not a chordflow command"),
    "an unknown option": ('"dashboard", "--address"', '"dashboard", "--adress"', "No such option '--adress'"),
    "a misspelt setting": ("CHORDFLOW_VISIBILITY_TIMEOUT:", "CHORDFLOW_VISIBILITY_TIMOUT:", "read by nothing"),
    "a broker on the wrong port": ("@redis:6379/0\n      CHORDFLOW_SECRET_KEY_FILE: /run/secrets/chordflow_secret_key"
                                   "\n      CHORDFLOW_VISIB", "@redis:6380/0\n      CHORDFLOW_SECRET_KEY_FILE: "
                                   "/run/secrets/chordflow_secret_key\n      CHORDFLOW_VISIB", "redis:6380"),
    "a published port nothing listens on": (':-5556}:5556"', ':-5556}:5557"', "publishes container port 5557"),
    "a key file that is not mounted": ("secrets: [chordflow_secret_key]\n    # Each", "# Each", "no file mounted"),
    "a grace period shorter than a drain": ("stop_grace_period: 30s", "stop_grace_period: 10s", "stop_grace_period"),
}  # fmt: skip


@pytest.mark.parametrize("mistake", sorted(COMPOSE_MISTAKES))
def test_compose_checks_catch(mistake: str) -> None:
    old, new, expected = COMPOSE_MISTAKES[mistake]
    text = COMPOSE.read_text()
    assert old in text, f"the file changed: update the {mistake!r} case"
    problems = compose_deployment(text.replace(old, new, 1), OPERATOR_ENV).problems
    assert any(expected in p for p in problems), problems


K8S_MISTAKES = {
    "KEDA reading another metric": ("keda.yaml", "valueLocation: chordflow_desired_workers",
                                    "valueLocation: chordflow_queue_messages", "not chordflow_desired_workers"),
    "KEDA never scaling to zero": ("keda.yaml", "minReplicaCount: 0", "minReplicaCount: 2", "minReplicaCount"),
    "KEDA reading no metrics service": ("keda.yaml", "chordflow-metrics:9808", "chordflow-metrics:9809", "no Service"),
    "worker slots unlike the workers'": ("metrics.yaml", '"--worker-slots", "2"', '"--worker-slots", "4"',
                                         "--worker-slots"),
    "a grace period shorter than a drain": ("worker.yaml", 'CHORDFLOW_DRAIN_GRACE: "20"', 'CHORDFLOW_DRAIN_GRACE: "25"',
                                            "terminationGracePeriodSeconds"),
    "a containerPort the command does not use": ("dashboard.yaml", "containerPort: 5556", "containerPort: 5557",
                                                 "listens on 5556"),
    "a Service port with no process": ("metrics.yaml", "targetPort: 9808", "targetPort: 9809", "targetPort 9809"),
    "a broker on the wrong port": ("flower.yaml", "chordflow-redis:6379/0", "chordflow-redis:6380/0",
                                   "chordflow-redis:6380"),
    "an unknown command": ("metrics.yaml", '"chordflow", "metrics"', '"chordflow", "metric"', "not a chordflow"),
    "a misspelt setting": ("worker.yaml", "CHORDFLOW_QUEUE: chordflow", "CHORDFLOW_QUEUES: chordflow",
                           "read by nothing"),
    "a pod Redis does not let in": ("redis.yaml", "chordflow-metrics, ", "", "NetworkPolicy"),
    "an undefined $(VAR)": ("dashboard.yaml", "redis://:$(REDIS_PASSWORD)@", "redis://:$(REDIS_PASS)@",
                            "defined nowhere"),
}  # fmt: skip


@pytest.mark.parametrize("mistake", sorted(K8S_MISTAKES))
def test_k8s_checks_catch(mistake: str) -> None:
    name, old, new, expected = K8S_MISTAKES[mistake]
    texts = k8s_texts()
    assert old in texts[name], f"the file changed: update the {mistake!r} case"
    texts[name] = texts[name].replace(old, new, 1)
    problems = k8s_of(texts).problems
    assert any(expected in p for p in problems), problems


@pytest.mark.processes
def test_compose_services_run_a_batch_as_plain_processes(tmp_path: Path) -> None:
    deployment = compose_deployment(COMPOSE.read_text(), OPERATOR_ENV)
    assert deployment.problems == []
    workflow = tmp_path / "wf.json"
    workflow.write_text(json.dumps(WORKFLOW))
    with running(deployment, tmp_path) as runner:
        # The compose file's client: `docker compose run --rm worker chordflow submit /wf.json`.
        auth = {
            "flower": OPERATOR_ENV["FLOWER_BASIC_AUTH"],
            "dashboard": OPERATOR_ENV["CHORDFLOW_DASHBOARD_BASIC_AUTH"],
        }
        exercise(runner, deployment.containers["worker"], ["submit", str(workflow)], auth)


@pytest.mark.processes
def test_k8s_containers_run_a_batch_as_plain_processes(tmp_path: Path) -> None:
    deployment = k8s_of(k8s_texts())
    assert deployment.problems == []
    client = deployment.container("submit")
    with running(deployment, tmp_path) as runner:
        # The client Job as it is, its workflow from the chordflow-workflow ConfigMap (mounted at /workflow).
        auth = {"flower": K8S_SECRETS["chordflow-flower"]["FLOWER_BASIC_AUTH"],
                "dashboard": K8S_SECRETS["chordflow-dashboard"]["CHORDFLOW_DASHBOARD_BASIC_AUTH"]}  # fmt: skip
        exercise(runner, client, _mounted(runner, client, client.argv[1:]), auth)


def _mounted(runner: Runner, c: Container, args: list[str]) -> list[str]:
    """Arguments naming a file mounted in the container, pointed at the file's copy here."""
    runner.env(c)  # writes the mounted files
    root = runner.path(c, 0, "files")
    return [str(root / a.lstrip("/")) if a in c.files else a for a in args]
