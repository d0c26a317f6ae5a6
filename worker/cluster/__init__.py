"""The cluster: the ONLY package that imports celery, kombu or redis. The Celery app and its tasks
(chunks, the chord body, advances, dataset chunks), signing, the broker pool, dispatch, leases,
the snapshot cache, worker-side middleware and logs; `state/` holds everything kept in Redis.

May import everything in `worker` and `ir`; nothing in `worker` outside this package imports it,
except `worker/app.py`, the address `celery -A worker.app` names."""
