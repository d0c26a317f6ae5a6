"""RabbitMQ for the tests: the machine's server (127.0.0.1:5672, guest/guest), one fresh vhost per user of it.

`vhost()` makes a vhost with a random name, lets guest use it, yields its amqp:// URL, and deletes it (every
queue and message in it) after: runs on one vhost never see another's, whatever else uses the server.

`own_node()` is for a test that must restart the broker (the fault campaign's `restart_broker`, tests/chaos/): a
node of its own on free ports, which it may stop and start without touching the shared server.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scheduler.localcluster import ManagedProcess, free_port

#: The server the tests use.
SERVER = "amqp://guest:guest@127.0.0.1:5672"
USER = "guest"


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def vhost() -> Iterator[str]:
    """A fresh vhost on the server; yields the broker URL of it."""
    name = f"chordflow-test-{secrets.token_hex(6)}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, USER, ".*", ".*", ".*")
        yield f"{SERVER}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)


def scripts() -> Path:
    """The folder of RabbitMQ's own scripts: the `rabbitmqctl` on PATH may be a wrapper that reruns them as the
    rabbitmq user, with that user's Erlang cookie, which a node of one's own does not share."""
    found = shutil.which("rabbitmqctl") or "/usr/lib/rabbitmq/bin/rabbitmqctl"
    return Path(os.path.realpath(found)).parent


@dataclass
class Node:
    """A RabbitMQ node of a test's own (`own_node`), apart from the machine's server so that it may be stopped: its
    Erlang node name, AMQP port, the env its scripts run with (its own HOME, cookie and epmd port) and its process."""

    name: str
    port: int
    env: dict[str, str]
    process: ManagedProcess
    running: bool = True  # the rabbit application: False from `stop_app` until `start_app`

    @property
    def url(self) -> str:
        """The broker URL of its default vhost (guest may log in from loopback)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def ctl(self, *args: str, timeout: float = 60) -> str:
        """`rabbitmqctl -n <node> args`; its output."""
        argv = [str(scripts() / "rabbitmqctl"), "-n", self.name, "-q", *args]
        done = subprocess.run(argv, env=self.env, check=True, capture_output=True, text=True, timeout=timeout)
        return done.stdout

    def stop_app(self) -> None:
        """Stop the rabbit application, the Erlang node left up: every connection closed, the listener gone, the
        durable queues' messages kept on disk (what a broker restart does, without the VM's boot of ~7 s)."""
        self.running = False
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the rabbit application again: durable queues recovered, the listener back."""
        self.ctl("start_app")
        self.running = True


@contextlib.contextmanager
def own_node(workdir: Path) -> Iterator[Node]:
    """A RabbitMQ node of this process's own on free ports, its files under `workdir`: the machine's server
    (127.0.0.1:5672) is shared by other test runs and must never be stopped. Its own epmd (on a free port, not the
    machine's 4369) and Erlang cookie; stopped on exit, with its epmd, also after a failure."""
    tag = secrets.token_hex(4)
    port, dist, epmd = free_port(), free_port(), free_port()
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    cookie = home / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(16).upper())
    cookie.chmod(0o400)
    (workdir / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{port}\n")
    (workdir / "rabbitmq-env.conf").write_text("")  # not the machine's (it names the machine's node)
    (workdir / "enabled_plugins").write_text("[].\n")
    env = {
        **os.environ,
        "HOME": str(home),
        "ERL_EPMD_PORT": str(epmd),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODENAME": f"chaos-{tag}@localhost",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"),
        "RABBITMQ_LOGS": "-",  # to its output, which ManagedProcess copies to a file
        "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq.conf"),
        "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(workdir / "rabbitmq.pid"),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    try:
        process = ManagedProcess(
            [str(scripts() / "rabbitmq-server")], workdir / "rabbitmq.log", "Server startup complete", env=env
        )
        node = Node(env["RABBITMQ_NODENAME"], port, env, process)
        try:
            yield node
        finally:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                node.ctl("stop")  # halts the node, the app stopped or not
            process.kill(signal.SIGKILL)  # whatever of its process group is left
    finally:
        stop_epmd(epmd, env)


def stop_epmd(port: int, env: dict[str, str], seconds: float = 30) -> None:
    """Stop the epmd on `port` (the node's own): `-kill` is refused while a name is still registered, which the
    halted node's may be for a moment, so it is asked again (polled) until none answers there."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        subprocess.run(["epmd", "-port", str(port), "-kill"], env=env, capture_output=True, timeout=30)
        names = subprocess.run(["epmd", "-port", str(port), "-names"], env=env, capture_output=True, timeout=30)
        if names.returncode != 0:  # nothing listens there any more
            return
        time.sleep(0.1)  # the poll's pace
