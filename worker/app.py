"""The Celery app module operators name: `celery -A worker.app worker`. The app itself lives in
worker/cluster/app.py; this module only gives it its public address."""

from worker.cluster.app import app, create_app, current_app, task

__all__ = ["app", "create_app", "current_app", "task"]
