"""Cluster dataset jobs: a job's chunks, outcomes and counts in Redis (store.py, read by clients too, no
Celery), and the task that runs one chunk (tasks.py).

The client adds each window of records as chunk n (`add`); every step (worker/cluster/state/lua/dataset_step.lua)
claims chunks to dispatch while fewer than `window` are in flight, so the broker never holds more than a
few chunks of a job however long its file. A finished chunk (`chordflow.dataset_chunk`) stores its
outcomes, claims the next chunks and sends them; the step that finds the job ended records its verdict.
Every key is under the run's hash tag (`cf:{<run>}:ds...`) and expires with the run.

Safe to run twice: a chunk is run only while it is pending, and finishing it is counted once. A worker
killed after finishing a chunk but before sending the chunks it claimed has its task delivered again;
that delivery finds the chunk counted and sends the claimed chunks again (a duplicate of a chunk that is
already running is run twice and counted once). Each task that begins a chunk takes its claim (`ds:claim`);
a finish whose claim was taken by a later delivery — a worker paused past the dead-delivery bound wakes up
after its chunk was delivered again (worker/cluster/broker/deliveries.py) — is refused with one WARNING line.

May import `ir`, `worker`'s top-level modules, `worker.batch`, `worker.datasets`, `worker.runs` and the rest of
`worker.cluster`; only tasks.py imports Celery.
"""
