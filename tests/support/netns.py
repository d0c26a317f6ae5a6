"""A second host for cut-network tests: a network namespace joined to this one by a veth pair.

Processes started with `argv()` run "on" the far host and reach this one at `gateway`; `cut()` takes the link
down (packets are dropped, nothing is refused: what a pulled cable or a partitioned host looks like) and
`restore()` brings it back. Everything made is removed on exit, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
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
