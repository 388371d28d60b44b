"""The wall clock the lag check compares with Envoy's start time, and its steps.

A check's age is this process's wall clock less Envoy's `%START_TIME%` (a wall clock: Envoy
gives no other) less how long Envoy took to receive the body (a duration). A step of the wall
clock between the two (NTP stepping it, a VM paused and resumed) adds itself to the age of every
check in transit: a forward step past 0.25 s shed every P2 request in transit as the control
plane's own lag, one of 1 s every class, and a backward step hid real lag (ops review). A step
shows as a change of the wall clock against the monotonic one; a slew changes that by at most
0.5 ms a second. For `HOLD_S` after a step the age of a check is unknown: a request in transit
then may have started before it (an upload longer than that is still misjudged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from math import inf

log = logging.getLogger("llmvalve.clock")

STEP_S = 0.05  # a change of the wall clock against the monotonic one read as a step
# what a slew may add per second between two readings, allowed twice over: NTP slews at most
# 500 ppm (0.5 ms a second)
SLEW = 0.001
HOLD_S = 60.0


class WallClock:
    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.wall, self.monotonic = wall, monotonic
        self._last: tuple[float, float] | None = None  # (monotonic, wall - monotonic)
        self._stepped_at = -inf

    def comparable(self) -> float | None:
        """The wall time now, or None within `HOLD_S` of a step (ages are unknown then)."""
        wall, mono = self.wall(), self.monotonic()
        offset = wall - mono
        if self._last is not None:
            since, before = self._last
            if abs(offset - before) > STEP_S + SLEW * (mono - since):
                self._stepped_at = mono
                log.warning("the wall clock stepped by %+.3f s: checks' ages are not judged "
                            "for %.0f s", offset - before, HOLD_S)
        self._last = (mono, offset)
        return wall if mono - self._stepped_at >= HOLD_S else None
