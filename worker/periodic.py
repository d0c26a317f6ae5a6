"""A daemon thread that does one thing every `interval` seconds until stopped: the shape of a worker's heartbeat,
its delivery renewals, its aging sweeps and a solo worker's broker heartbeats (each subclasses `Periodic`)."""

from __future__ import annotations

import threading

#: Seconds `stop()` waits for a tick in flight.
STOP_TIMEOUT = 5.0


class Periodic:
    """Calls `tick()` every `interval` seconds (first after one interval, or at once with `tick_at_start`) in a
    daemon thread named `name`, until `stop()`. A tick's errors are its own to handle: one that raises ends the
    thread."""

    name = "chordflow-periodic"
    tick_at_start = False

    def __init__(self, interval: float):
        self.interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=STOP_TIMEOUT)

    def tick(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        if self.tick_at_start:
            self.tick()
        while not self._stopped.wait(self.interval):
            self.tick()
