"""Which TCP connections a process holds: to tell its Redis connection from everyone else's in `CLIENT LIST`.

A test that must act once a process is blocked in a command (a `wait` in its XREAD) matches Redis's view of its
clients (`addr`, the client's own address) with the process's sockets, read from /proc: a new client of another
process (a worker's periodic read) is never mistaken for it.
"""

from __future__ import annotations

import os
from pathlib import Path


def local_ports(pid: int) -> set[int]:
    """The local ports of `pid`'s TCP sockets (IPv4 and IPv6); empty once it has exited."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    except (FileNotFoundError, ProcessLookupError):
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def redis_clients_of(pid: int, clients: list[dict[str, str]]) -> list[dict[str, str]]:
    """The entries of `CLIENT LIST` (`clients`) that are connections of `pid`."""
    ports = local_ports(pid)
    return [c for c in clients if int(c["addr"].rsplit(":", 1)[1]) in ports]
