"""The worker side of a cluster: `worker` starts a Celery worker for chordflow's chunks, `flower` the
Celery monitor on the same broker."""

from __future__ import annotations

import os

import click

from scheduler.cli.errors import CliUsageError


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
