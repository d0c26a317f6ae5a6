"""`chordflow metrics`, `chordflow top` and `chordflow dashboard`: watching the cluster (scheduler/ops/metrics.py,
scheduler/ops/top.py, scheduler/ops/dashboard/).

Standalone click commands, added to the `cli` group by scheduler/cli/group.py. prometheus_client is imported only
when a command runs: a worker started with `--metrics-port` must set PROMETHEUS_MULTIPROC_DIR before it is.
"""

from __future__ import annotations

import threading
from typing import IO, Any

import click

from scheduler.cli.errors import CliUsageError


class CannotServe(click.ClickException):
    """The address or port cannot be listened on (taken, not ours): one line on stderr, exit 2."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


@click.command("metrics")
@click.option("--port", type=int, default=9808, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="The address to listen on (0.0.0.0: all).")
@click.option(
    "--queue", "-Q", "queues", multiple=True, metavar="QUEUE",
    help="A queue to measure (repeat for more; default: CHORDFLOW_QUEUE or chordflow).",
)  # fmt: skip
def metrics(port: int, address: str, queues: tuple[str, ...]) -> None:
    """Serve the cluster's Prometheus metrics on http://ADDRESS:PORT/metrics (runs, items, queues, workers),
    read from Redis at each scrape."""
    from scheduler.ops import metrics as cluster_metrics
    from worker import redact, settings

    try:
        server = cluster_metrics.serve_cluster_metrics(port, address, queues)
    except OSError as exc:
        raise CannotServe(f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}") from None
    s = settings.load()
    click.echo(
        f"serving metrics on http://{address}:{server.server_port}/metrics "
        f"(state {redact.mask_url(s.result_backend)}, broker {redact.mask_url(s.broker_url)})",
        err=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


@click.command("top")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True, help="Seconds between refreshes."
)
@click.option("--queue", "-Q", "queues", multiple=True, metavar="QUEUE", help="A queue to show (repeatable).")
def top(interval: float, queues: tuple[str, ...]) -> None:
    """A live view of the cluster's active runs (progress, items/s, ETA, failures) and workers; q quits."""
    from scheduler.ops import top as live

    live.run(interval, queues)


# Like `chordflow flower`, the dashboard refuses to start without basic auth: users from
# CHORDFLOW_DASHBOARD_BASIC_AUTH (`user:password[,...]`), or `--unauthenticated` on a trusted network; otherwise one
# error line and exit 2.
@click.command("dashboard")
@click.option("--port", type=int, default=5556, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--unauthenticated", is_flag=True, help="Start without basic auth (only on a trusted network).")
def dashboard(port: int, address: str, unauthenticated: bool) -> None:
    """Serve a web page of runs (progress, rate, ETA, failed items; cancel, resume, redrive), with basic
    auth from CHORDFLOW_DASHBOARD_BASIC_AUTH (user:password)."""
    from scheduler.ops.dashboard import UsersError, serve, users_from
    from worker import settings

    try:
        users = users_from(settings.get("dashboard_basic_auth"), unauthenticated)
    except UsersError as exc:
        raise CliUsageError(str(exc)) from None
    serve(users, address, port)
