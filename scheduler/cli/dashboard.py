"""`chordflow dashboard`: the runs view (scheduler/ops/dashboard/) on a port of its own.

A standalone click command, added to the `cli` group by scheduler/cli/group.py. Like `chordflow flower` it
refuses to start without basic auth: users from CHORDFLOW_DASHBOARD_BASIC_AUTH (`user:password[,...]`), or
`--unauthenticated` on a trusted network; otherwise one error line and exit 2.
"""

from __future__ import annotations

import click


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
    except UsersError as exc:  # a usage error: one line, exit 2 (as the group reports CliUsageError)
        click.echo(f"error: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    serve(users, address, port)
