"""A fault campaign: generated workflows run on a real cluster while several faults hit it, then invariants checked.

Each fault test in tests/worker/cluster/faults/ tries one fault on one workflow; this package combines them, drawn
from a schedule number so any failure replays (`make chaos SEED=N`), and checks afterwards that the result is right
and nothing leaked. One concept per module: generator.py (schedules), faults.py (injecting them), invariants.py
(what must hold), runner.py (one schedule, in order, timed), shrink.py (a failing schedule made small), __main__.py
(`make chaos`); test_campaign.py is the suite's short campaign and keeps the shrunk regressions.
"""
