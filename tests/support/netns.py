"""Other hosts for cut-network tests: network namespaces joined to this one by veth pairs (`far_host`: one, on a
link of its own; `lan`: several, on a bridge, as worker hosts on a switch with the Redis host).

Processes started with `argv()` run "on" the far host and reach this one at `gateway`; `cut()` takes the link
down (packets are dropped, nothing is refused: what a pulled cable or a partitioned host looks like) and
`restore()` brings it back. Everything made is removed on exit, also after a failure. `relay` makes a loopback-only
service of this host (a test's model provider, say) reachable from a far host without changing the service.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class FarHost:
    namespace: str
    link: str  # this side of the veth pair
    gateway: str  # this host's address, as seen from the far host

    def argv(self, command: list[str]) -> list[str]:
        """`command` run inside the far host's namespace (ip execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.namespace, *command]

    def cut(self) -> None:
        ip("link", "set", self.link, "down")

    def restore(self) -> None:
        ip("link", "set", self.link, "up")


@contextlib.contextmanager
def far_host() -> Iterator[FarHost]:
    """A namespace with its own loopback and a /30 to this host (names and subnet from this process's pid)."""
    tag = os.getpid() % 60000
    namespace, near, far = f"cf{tag}", f"cfh{tag}", f"cfn{tag}"
    subnet = f"10.{200 + tag // 10000 % 50}.{tag // 40 % 250}.{tag % 40 * 4}"
    base = subnet.rsplit(".", 1)
    gateway, address = f"{base[0]}.{int(base[1]) + 1}", f"{base[0]}.{int(base[1]) + 2}"
    ip("netns", "add", namespace)
    try:
        ip("link", "add", near, "type", "veth", "peer", "name", far)
        ip("link", "set", far, "netns", namespace)
        ip("addr", "add", f"{gateway}/30", "dev", near)
        ip("link", "set", near, "up")
        inside = (("addr", "add", f"{address}/30", "dev", far), ("link", "set", far, "up"), ("link", "set", "lo", "up"))
        for args in inside:
            ip("netns", "exec", namespace, "ip", *args)
        yield FarHost(namespace, near, gateway)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", near)  # its peer goes with it
        ip("netns", "del", namespace)


@contextlib.contextmanager
def relay(host: FarHost, port: int, listen: int | None = None, seconds: float = 10) -> Iterator[str]:
    """`127.0.0.1:port` of this host reachable from `host` at `gateway:listen` (`port` unless given): a socat relay
    listening on the link's address, so a service bound to loopback (which a far host cannot reach) need not change.
    Yields `gateway:listen` once it listens (polled, up to `seconds`); stopped on exit. A cut of the link cuts what
    goes through it too."""
    listen = port if listen is None else listen
    argv = ["socat", f"TCP-LISTEN:{listen},bind={host.gateway},fork,reuseaddr", f"TCP:127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        deadline = time.monotonic() + seconds
        while True:
            with socket.socket() as probe:
                if probe.connect_ex((host.gateway, listen)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the relay to 127.0.0.1:{port} did not listen on {host.gateway}:{listen}")
            time.sleep(0.05)  # the poll's pace
        yield f"{host.gateway}:{listen}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@dataclass(frozen=True)
class Bridge:
    """This host's side of a LAN: `address` on a bridge that each far host's link is plugged into."""

    name: str
    address: str
    hosts: tuple[FarHost, ...]


@contextlib.contextmanager
def lan(count: int) -> Iterator[Bridge]:
    """`count` far hosts (at most 13) on one bridge of this host, as worker hosts on a switch with the Redis host:
    each in its own namespace, with its own cable (`hosts[i].cut()` takes that link down; the others stay up).
    Names and the /28 (in 100.64.0.0/10, apart from `far_host`'s 10.200.0.0/13) come from this process's pid;
    everything made is removed on exit, also after a failure."""
    tag = os.getpid() % 60000
    bridge = f"cfb{tag}"
    base = ipaddress.ip_network("100.64.0.0/10").network_address
    subnet = ipaddress.ip_network((int(base) + tag * 16, 28))
    gateway, *addresses = (f"{address}" for address in subnet.hosts())
    hosts: list[FarHost] = []
    namespaces: list[str] = []
    ip("link", "add", bridge, "type", "bridge")
    try:
        ip("addr", "add", f"{gateway}/28", "dev", bridge)
        ip("link", "set", bridge, "up")
        for i, address in zip(range(count), addresses, strict=False):
            namespace, near, far = f"cf{tag}h{i}", f"cfh{tag}h{i}", f"cfn{tag}h{i}"
            ip("netns", "add", namespace)
            namespaces.append(namespace)
            ip("link", "add", near, "type", "veth", "peer", "name", far)
            hosts.append(FarHost(namespace, near, gateway))
            ip("link", "set", far, "netns", namespace)
            ip("link", "set", near, "master", bridge)
            ip("link", "set", near, "up")
            for args in (
                ("addr", "add", f"{address}/28", "dev", far),
                ("link", "set", far, "up"),
                ("link", "set", "lo", "up"),
            ):
                ip("netns", "exec", namespace, "ip", *args)
        yield Bridge(bridge, gateway, tuple(hosts))
    finally:
        for host in hosts:
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("link", "del", host.link)  # its peer goes with it
        for namespace in namespaces:
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", namespace)
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", bridge)
