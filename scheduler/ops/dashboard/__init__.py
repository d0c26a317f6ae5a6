"""`chordflow dashboard`: a web page of runs — what Flower, which sees tasks one by one, cannot show.

The app and its routes (app.py), the page it serves (page.py), the JSON the page shows (views.py, with
live.py's batch progress of cluster runs), the buttons' actions (actions.py), and auth (auth.py).

May import `scheduler`'s api (durable, datasets), `worker` and `ir`; never `scheduler.cli`.
"""

from ir.errors import UsersError
from scheduler.ops.dashboard.actions import ACTIONS, cancel, redrive, resume
from scheduler.ops.dashboard.app import create_app, serve
from scheduler.ops.dashboard.auth import ACTION_HEADER, USERS_VARIABLE, BasicAuth, FrameGuard, users_from
from scheduler.ops.dashboard.live import LiveProgress
from scheduler.ops.dashboard.page import HTML
from scheduler.ops.dashboard.views import REFRESH_SECONDS, Views

__all__ = [
    "ACTIONS",
    "ACTION_HEADER",
    "HTML",
    "REFRESH_SECONDS",
    "USERS_VARIABLE",
    "BasicAuth",
    "FrameGuard",
    "LiveProgress",
    "UsersError",
    "Views",
    "cancel",
    "create_app",
    "redrive",
    "resume",
    "serve",
    "users_from",
]
