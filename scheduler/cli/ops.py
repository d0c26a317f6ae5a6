"""Running and watching the cluster: `worker` starts a Celery worker for chordflow's chunks, `flower` the Celery
monitor on the same broker; `metrics`, `top` and `dashboard` watch it (scheduler/ops/metrics.py,
scheduler/ops/top.py, scheduler/ops/dashboard/).

Standalone click commands, added to the `cli` group by scheduler/cli/group.py. prometheus_client is imported only
when a command runs: a worker started with `--metrics-port` must set PROMETHEUS_MULTIPROC_DIR before it is.
"""

from __future__ import annotations

import os
import threading
from typing import IO, Any

import click

from ir.errors import CliUsageError


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
@click.option(
    "--worker-slots", type=click.IntRange(min=1), default=1, show_default=True,
    help="Pool processes of one worker (its --concurrency), for chordflow_desired_workers while none is registered.",
)  # fmt: skip
def metrics(port: int, address: str, queues: tuple[str, ...], worker_slots: int) -> None:
    """Serve the cluster's Prometheus metrics on http://ADDRESS:PORT/metrics (runs, items, queues, workers, the
    workers the work can keep busy), read from Redis at each scrape."""
    from scheduler.ops import metrics as cluster_metrics
    from worker import redact, settings

    try:
        server = cluster_metrics.serve_cluster_metrics(port, address, queues, worker_slots)
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
    from ir.errors import UsersError
    from scheduler.ops.dashboard import serve, users_from
    from worker import settings

    try:
        users = users_from(settings.get("dashboard_basic_auth"), unauthenticated)
    except UsersError as exc:
        raise CliUsageError(str(exc)) from None
    serve(users, address, port)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--concurrency", "-c", type=int, default=None, help="Pool processes (default: CPU count).")
@click.option("--queues", "-Q", default=None, help="Comma-separated queues (default: CHORDFLOW_QUEUE or chordflow).")
@click.option("--loglevel", "-l", default="info", show_default=True)
@click.option("--pool", "-P", default="prefork", show_default=True, help="Celery pool: prefork, solo or threads.")
@click.option("--insecure", is_flag=True, help="Run without a signing key: unsigned tasks (private broker only).")
@click.option(
    "--metrics-port", default=None, metavar="[ADDRESS:]PORT",
    help="Serve this worker's Prometheus metrics (chunks, items, advances) on PORT (address default 127.0.0.1).",
)  # fmt: skip
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(
    concurrency: int | None,
    queues: str | None,
    loglevel: str,
    pool: str,
    insecure: bool,
    metrics_port: str | None,
    celery_args: tuple[str, ...],
) -> None:
    """Run a Celery worker for chordflow chunks (extra arguments go to `celery worker`)."""
    from worker import settings
    from worker.cluster import signing
    from worker.cluster.app import current_app
    from worker.nodes import registry

    if insecure:
        os.environ["CHORDFLOW_INSECURE"] = "1"  # what `celery -A worker.app worker` reads too
    signing.worker_may_start(current_app())  # no key and not --insecure: one line, before Celery starts
    registry.load_plugins()  # fail here, with one line, if a plugin cannot be imported
    if metrics_port is not None:
        _serve_worker_metrics(metrics_port)
    argv = ["worker", "-l", loglevel, "-P", pool, "-Q", queues or settings.load().queue]
    if concurrency:
        argv += ["-c", str(concurrency)]
    current_app().worker_main(argv=[*argv, *celery_args])


def _serve_worker_metrics(where: str) -> None:
    from scheduler.ops import metrics

    address, _, port = where.rpartition(":")
    if not port.isdigit():
        raise CliUsageError(f"--metrics-port: expected PORT or ADDRESS:PORT, got '{where}'")
    address = address.strip("[]") or "127.0.0.1"
    try:
        metrics.serve_worker_metrics(int(port), address)
    except OSError as exc:
        raise CliUsageError(f"--metrics-port: cannot serve on {address}:{port}: {exc.strerror or exc}") from None


@click.command()
@click.option("--port", type=int, default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--unauthenticated", is_flag=True, help="Start without basic auth (only on a trusted network).")
def flower(port: int, address: str, unauthenticated: bool) -> None:
    """Start Flower on the configured broker, with basic auth from FLOWER_BASIC_AUTH (user:password)."""
    from worker.cluster.app import current_app

    try:
        import flower  # noqa: F401  an extra: without it Celery would print its usage text
    except ImportError:
        raise CliUsageError("flower is not installed: make install (or pip install flower)") from None
    auth = os.environ.get("FLOWER_BASIC_AUTH", "")
    if not auth and not unauthenticated:  # no `NAME=value` in the hint: the secret filter would mask the placeholder
        raise CliUsageError(
            "FLOWER_BASIC_AUTH is not set: set it to user:password (or pass --unauthenticated) to start Flower"
        )
    if auth and not all(":" in pair for pair in auth.split(",")):
        raise CliUsageError("FLOWER_BASIC_AUTH must be user:password[,user2:password2]")
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if auth:
        argv.append(f"--basic-auth={auth}")
    current_app().start(argv=argv)
