"""Turns a scenario's traffic classes into a deterministic list of requests (same seed → same
requests), used by both the simulator and the real load generator."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import random
import zlib
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path

from llmvalve.sim.scenario import Dist, OnOff, Scenario, TraceSpec, TrafficClass

# A trace says how long each answer was, not what the client allowed: replayed requests ask for
# this many tokens at most (a common client default) unless the class sets maxTokens.
TRACE_MAX_TOKENS = 1024


@dataclass(frozen=True)
class Job:
    """One logical request: what a user asks for, whatever retries it takes."""

    job_id: int
    arrival_s: float
    cls: TrafficClass
    priority: int
    tenant: str
    prompt_tokens: int
    output_tokens: int  # the true answer length
    max_tokens: int
    cancel_at_s: float | None  # absolute time the client gives up, if it does

    @property
    def deadline_at_s(self) -> float | None:
        """The deadline the client sends (absolute), if its class has one."""
        return _deadline_at(self.cls, self.arrival_s)

    @property
    def model(self) -> str | None:
        """The `model` its requests ask for (None: the class names none)."""
        return self.cls.model or None


def draw(d: Dist, rng: random.Random) -> int:
    if d.cv <= 0:
        x = d.mean
    else:
        s2 = math.log(1 + d.cv * d.cv)
        x = rng.lognormvariate(math.log(d.mean) - s2 / 2, math.sqrt(s2))
    return int(min(d.max, max(d.min, round(x))))


def _poisson(cls: TrafficClass, duration_s: float, scale: float,
             rng: random.Random, seed: int) -> list[float]:
    if cls.ramp:
        return _ramp(cls.rate, duration_s, scale, rng)
    rate = cls.rate if cls.on_off is None else on_off_schedule(cls, duration_s, seed)
    return _steps(rate, duration_s, scale, rng)


def _steps(rate: tuple[tuple[float, float], ...], duration_s: float, scale: float,
           rng: random.Random) -> list[float]:
    """A Poisson process whose rate holds from each point to the next."""
    out: list[float] = []
    steps = [*rate, (duration_s, 0.0)]
    for (t0, r), (t1, _) in itertools.pairwise(steps):
        r *= scale
        t = t0
        if r <= 0:
            continue
        while True:
            t += rng.expovariate(r)
            if t >= min(t1, duration_s):
                break
            out.append(t)
    return out


def _ramp(points: tuple[tuple[float, float], ...], duration_s: float, scale: float,
          rng: random.Random) -> list[float]:
    """A Poisson process whose rate runs in straight lines between the points (thinning:
    candidates at the segment's peak rate, each kept with probability rate(t) / peak); the
    last rate holds to the end."""
    out: list[float] = []
    segs = [*itertools.pairwise(points), (points[-1], (max(duration_s, points[-1][0]),
                                                       points[-1][1]))]
    for (t0, r0), (t1, r1) in segs:
        peak = max(r0, r1) * scale
        end = min(t1, duration_s)
        if peak <= 0 or end <= t0:
            continue
        t = t0
        while True:
            t += rng.expovariate(peak)
            if t >= end:
                break
            r = r0 + (r1 - r0) * (t - t0) / (t1 - t0)
            if rng.random() * peak < r * scale:
                out.append(t)
    return out


def _on_off_steps(spec: OnOff, duration_s: float,
                  rng: random.Random) -> tuple[tuple[float, float], ...]:
    """Alternating on and off periods, each as long as a uniform draw from its range."""
    steps, t, on = [], 0.0, True
    while t < duration_s:
        steps.append((t, spec.on if on else spec.off))
        lo, hi = spec.on_for_s if on else spec.off_for_s
        t += max(0.1, rng.uniform(lo, hi))
        on = not on
    return tuple(steps)


def on_off_schedule(cls: TrafficClass, duration_s: float,
                    seed: int) -> tuple[tuple[float, float], ...]:
    """The (time, req/s) steps an on/off class follows at this seed. The periods depend only
    on the seed and the period ranges: classes with the same onFor and offFor switch together
    (one application's traffic, split by class)."""
    spec = cls.on_off
    assert spec is not None
    rng = random.Random(f"{seed}:on-off:{spec.on_for_s}:{spec.off_for_s}")
    return _on_off_steps(spec, duration_s, rng)


# A trace's CSV, decompressed: 2,000,000 rows of ~30 bytes (a scenario's most requests). A
# gzip of 100 KB could otherwise unpack to gigabytes.
MAX_TRACE_BYTES = 64 << 20
# The most requests a scenario may send (rate classes are bounded by their peak rates; a
# trace by its rows: 3,000,000 rows of 15 bytes fit in the bytes, and filled 3 GB)
MAX_TRACE_ROWS = 2_000_000


class TraceError(ValueError):
    """A trace file that cannot be replayed: `file:line: problem`."""


@lru_cache(maxsize=4)
def read_trace(file: str) -> tuple[tuple[float, int, int], ...]:
    """(seconds from the trace's first arrival, prompt tokens, output tokens). The first row
    may be a header; any other row that is not `timestamp, prompt tokens, output tokens` is a
    `TraceError` naming its line (a row skipped in silence would change the replay)."""
    source = (resources.files("llmvalve.sim").joinpath("traces", "azure_conv.csv.gz")
              if file == "azure-conv" else Path(file))
    try:
        with source.open("rb") as f:
            raw = f.read(MAX_TRACE_BYTES + 1)
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.GzipFile(fileobj=io.BytesIO(raw)).read(MAX_TRACE_BYTES + 1)
        text = raw.decode("utf-8-sig")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise TraceError(f"{file}: cannot read it as a CSV (or gzip of one): {exc}") from None
    if len(raw) > MAX_TRACE_BYTES:
        raise TraceError(f"{file}: more than {MAX_TRACE_BYTES >> 20} MiB of CSV (about "
                         "2,000,000 rows, as many requests as a scenario may send)")
    rows, first = [], True
    reader = csv.reader(io.StringIO(text))
    while True:
        try:
            rec = next(reader, None)
        except csv.Error as exc:
            raise TraceError(f"{file}:{reader.line_num}: {exc}") from None
        if rec is None:
            break
        line = reader.line_num
        if not rec or not "".join(rec).strip():
            continue
        if len(rec) > 3:  # another trace's columns: read as these, they would mislead
            raise TraceError(f"{file}:{line}: expected three columns (timestamp, prompt "
                             f"tokens, output tokens), got {len(rec)}")
        row = _trace_row(rec)
        if row is None and first and not any(map(_is_number, rec[1:3])):
            first = False
            continue  # the header: names where the token counts go
        first = False
        if row is None:
            raise TraceError(f"{file}:{line}: expected timestamp (seconds or ISO 8601), "
                             f"prompt tokens, output tokens (whole numbers >= 0); got "
                             f"{','.join(rec)[:80]!r}")
        rows.append(row)
        if len(rows) > MAX_TRACE_ROWS:
            raise TraceError(f"{file}: more than {MAX_TRACE_ROWS:,} requests (as many as a "
                             "scenario may send)")
    if not rows:
        raise TraceError(f"{file}: no requests (rows of timestamp, prompt tokens, output "
                         "tokens)")
    rows.sort()
    t0 = rows[0][0]
    return tuple((t - t0, p, o) for t, p, o in rows)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _trace_row(rec: list[str]) -> tuple[float, int, int] | None:
    if len(rec) < 3:
        return None
    try:
        ts = rec[0].strip()
        try:
            t = float(ts)
        except ValueError:
            t = datetime.fromisoformat(ts[:26]).timestamp()
        prompt, output = (float(x) for x in rec[1:3])
    except ValueError:
        return None
    if not (math.isfinite(t) and prompt >= 0 and output >= 0 and prompt.is_integer()
            and output.is_integer()):
        return None
    return t, int(prompt), int(output)


def _trace_jobs(cls: TrafficClass, tr: TraceSpec, duration_s: float, scale: float,
                rng: random.Random) -> list[tuple[float, int, int, int]]:
    out = []
    speed = tr.speed * scale
    shares = list(tr.split)
    for t, p, o in read_trace(tr.file):
        if t < tr.start_s:
            continue
        at = (t - tr.start_s) / speed
        if at >= duration_s:
            break
        u, acc, prio = rng.random(), 0.0, shares[-1][0]
        for pr, share in shares:
            acc += share
            if u < acc:
                prio = pr
                break
        out.append((at, prio, p, max(1, o)))
    return out


def generate(sc: Scenario, load_scale: float = 1.0, seed: int | None = None) -> list[Job]:
    seed = sc.seed if seed is None else seed
    jobs: list[Job] = []
    for ci, cls in enumerate(sc.classes):
        rng = random.Random(f"{seed}:{ci}:{cls.name}")
        max_tok = cls.max_tokens or int(2 * cls.output.mean)
        if cls.trace is not None:
            tenants = dict(cls.trace.tenants)
            for at, prio, p, o in _trace_jobs(cls, cls.trace, sc.duration_s, load_scale, rng):
                cancel = _cancel(cls, at, rng)
                cap = cls.max_tokens or TRACE_MAX_TOKENS
                tenant = _pick_tenant(tenants.get(prio), rng) or f"{cls.tenant}-p{prio}"
                jobs.append(Job(0, at, cls, prio, tenant, p, min(o, cap), cap, cancel))
            continue
        for at in _poisson(cls, sc.duration_s, load_scale, rng, seed):
            p = draw(cls.prompt, rng)
            o = min(draw(cls.output, rng), max_tok)
            jobs.append(Job(0, at, cls, cls.priority, cls.tenant, p, o, max_tok,
                            _cancel(cls, at, rng)))
    jobs.sort(key=lambda j: (j.arrival_s, j.priority))
    return [Job(i, j.arrival_s, j.cls, j.priority, j.tenant, j.prompt_tokens, j.output_tokens,
                j.max_tokens, j.cancel_at_s) for i, j in enumerate(jobs)]


def _pick_tenant(shares: tuple[tuple[str, float], ...] | None,
                 rng: random.Random) -> str | None:
    """One of a priority's tenants, by share (no draw when there is only one: the same
    requests as before tenants could be split)."""
    if not shares:
        return None
    if len(shares) == 1:
        return shares[0][0]
    u, acc = rng.random(), 0.0
    for name, share in shares:
        acc += share
        if u < acc:
            return name
    return shares[-1][0]


def _deadline_at(cls: TrafficClass, arrival_s: float) -> float | None:
    return arrival_s + cls.deadline_s if cls.deadline_s > 0 else None


def _cancel(cls: TrafficClass, at: float, rng: random.Random) -> float | None:
    """When the client gives up: at a random cancel, or at its deadline, whichever is first."""
    deadline = _deadline_at(cls, at)
    if cls.cancel_prob <= 0 or rng.random() >= cls.cancel_prob:
        return deadline
    lo, hi = cls.cancel_after_s
    at = at + rng.uniform(lo, hi)
    return at if deadline is None else min(at, deadline)
