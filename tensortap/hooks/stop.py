"""Stop requests (docs/format.md §8): a rule's StopTraining action, seen at a step boundary.

A local out_dir is looked at (one stat) at most once per STOP_CHECK_INTERVAL, on the training thread, at the
start of a step that goes through the hook; an object store's is polled by a background thread every
STOP_POLL_INTERVAL. The quiet window of the step engine ends at the next look (`deadline()`), so a long run of
steps that save nothing still sees a request in time.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from tensortap.hooks.options import STOP_CHECK_INTERVAL, STOP_POLL_INTERVAL
from tensortap.storage import is_remote


class StopWatch:
    def __init__(self, out_dir: str, watching: bool) -> None:
        self.out_dir = out_dir
        self.watching = watching  # every rank watches, writing or not
        self.request: dict | None = None
        # (the first look one interval in: a rule asks only after it has read data the job wrote)
        self.next_check = time.monotonic() + STOP_CHECK_INTERVAL
        self.remote = is_remote(out_dir)
        self._thread: threading.Thread | None = None
        self._closed = False

    def deadline(self) -> float:
        """Until when (`time.monotonic()`) steps may pass without a look: the next look, or infinity."""
        return self.next_check if self.watching else math.inf

    def due(self) -> bool:
        return self.watching and (self.request is not None or time.monotonic() >= self.next_check)

    def check(self, hook: Any) -> None:
        """Look (one stat at most per interval; object stores: start the poller). A request found closes `hook`
        and raises TrainingStopped (a SystemExit) into the training loop."""
        now = time.monotonic()
        if self.request is None and now < self.next_check:
            return
        self.next_check = now + STOP_CHECK_INTERVAL
        from tensortap.format.control import StopSignal, stop_requested

        if self.request is None and not self.remote:
            try:
                self.request = stop_requested(self.out_dir, min_interval=0)
            except Exception as e:  # noqa: BLE001 - an unreadable control file must not break training
                hook._warn_once("stop-check", f"tensortap: cannot check for stop requests: {e}")
                self.watching = False
        elif self.remote and self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="tensortap-stop-watch", daemon=True)
            self._thread.start()
        req = self.request
        if req is not None and not hook._closed:
            self.watching = False
            StopSignal(self.out_dir).stop(hook, req)  # closes the hook, raises TrainingStopped

    def close(self) -> None:
        self._closed = True

    def _poll(self) -> None:
        from tensortap.format.control import stop_requested

        while not self._closed and self.request is None:
            try:
                self.request = stop_requested(self.out_dir, min_interval=0)
            except Exception:  # noqa: BLE001 - the store may be unreachable for a while
                pass
            time.sleep(STOP_POLL_INTERVAL)
