"""The cluster: the ONLY package of `worker` that imports celery, kombu or redis (of `scheduler`, only the few
client modules tests/test_structure.py names, each saying why). The Celery app (app.py), advances
(advance.py), dataset chunks (datasets.py), signing, rate limits, priorities and their aging, outages and
logs; `batches/` runs a batch as chunk tasks and a merge task, `broker/` holds what crosses the broker, `state/`
everything kept in Redis.

May import everything in `worker` and `ir`; nothing in `worker` outside this package imports it,
except `worker/app.py`, the address `celery -A worker.app` names."""
