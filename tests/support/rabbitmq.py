"""RabbitMQ for the tests: the machine's server (127.0.0.1:5672, guest/guest), one fresh vhost per user of it.

`vhost()` makes a vhost with a random name, lets guest use it, yields its amqp:// URL, and deletes it (every
queue and message in it) after: runs on one vhost never see another's, whatever else uses the server.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator

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
