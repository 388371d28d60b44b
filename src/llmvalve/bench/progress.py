"""The progress line of `llmvalve bench` and `llmvalve load` (on stderr).

On a terminal one line is redrawn in place twice a second; otherwise (CI logs, pipes) a line is
printed every 10 s. It shows the phase (starting, traffic, drain, stopping), the mode, the wall
time elapsed, the scenario time reached and the requests in flight.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, enabled: bool = True,
                 every_s: float | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = every_s if every_s is not None else (0.5 if self.tty else 10.0)
        self.started = time.monotonic()
        self.label = ""
        self.suffix = ""  # appended to every label (the sweep's load)
        self._last = 0.0
        self._dirty = False

    def start(self, label: str) -> None:
        self.label = label + self.suffix

    def phase(self, phase: str) -> None:
        self.show({"phase": phase}, force=True)

    def show(self, snap: dict, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        parts = [self.label, snap.get("phase", ""), f"{now - self.started:5.0f} s"]
        if "t" in snap and "duration" in snap:
            parts.append(f"scenario t={snap['t']:5.1f}/{snap['duration']:.0f} s")
        if "in_flight" in snap:
            parts.append(f"in flight {snap['in_flight']:4d}")
            parts.append(f"sent {snap['sent']}/{snap['jobs']}")
            parts.append(f"ok {snap['completed']}  429 {snap['rejections']}")
        line = "  ".join(p for p in parts if p)
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self._dirty = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self, message: str = "") -> None:
        if not self.enabled:
            return
        if self.tty and self._dirty:
            self.stream.write("\r\x1b[K")
            self._dirty = False
        if message:
            self.stream.write(message + "\n")
        self.stream.flush()
