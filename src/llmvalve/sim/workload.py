"""Turns a scenario's traffic classes into a deterministic list of requests (same seed → same
requests), used by both the simulator and the real load generator."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import random
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path

from llmvalve.sim.scenario import Dist, Scenario, TraceSpec, TrafficClass

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


def draw(d: Dist, rng: random.Random) -> int:
    if d.cv <= 0:
        x = d.mean
    else:
        s2 = math.log(1 + d.cv * d.cv)
        x = rng.lognormvariate(math.log(d.mean) - s2 / 2, math.sqrt(s2))
    return int(min(d.max, max(d.min, round(x))))


def _poisson(cls: TrafficClass, duration_s: float, scale: float,
             rng: random.Random) -> list[float]:
    out: list[float] = []
    steps = [*cls.rate, (duration_s, 0.0)]
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


@lru_cache(maxsize=4)
def read_trace(file: str) -> tuple[tuple[float, int, int], ...]:
    """(seconds from the trace's first arrival, prompt tokens, output tokens)."""
    if file == "azure-conv":
        data = resources.files("llmvalve.sim").joinpath("traces", "azure_conv.csv.gz").read_bytes()
        text = gzip.decompress(data).decode()
    else:
        raw = Path(file).read_bytes()
        text = (gzip.decompress(raw) if file.endswith(".gz") else raw).decode()
    rows = []
    for rec in csv.reader(io.StringIO(text)):
        if not rec or not rec[1].strip().isdigit():
            continue  # header
        ts = rec[0].strip()
        try:
            t = float(ts)
        except ValueError:
            t = datetime.fromisoformat(ts[:26]).timestamp()
        rows.append((t, int(rec[1]), int(rec[2])))
    rows.sort()
    t0 = rows[0][0]
    return tuple((t - t0, p, o) for t, p, o in rows)


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
                jobs.append(Job(0, at, cls, prio, tenants.get(prio, f"{cls.tenant}-p{prio}"),
                                p, min(o, cap), cap, cancel))
            continue
        for at in _poisson(cls, sc.duration_s, load_scale, rng):
            p = draw(cls.prompt, rng)
            o = min(draw(cls.output, rng), max_tok)
            jobs.append(Job(0, at, cls, cls.priority, cls.tenant, p, o, max_tok,
                            _cancel(cls, at, rng)))
    jobs.sort(key=lambda j: (j.arrival_s, j.priority))
    return [Job(i, j.arrival_s, j.cls, j.priority, j.tenant, j.prompt_tokens, j.output_tokens,
                j.max_tokens, j.cancel_at_s) for i, j in enumerate(jobs)]


def _cancel(cls: TrafficClass, at: float, rng: random.Random) -> float | None:
    if cls.cancel_prob <= 0 or rng.random() >= cls.cancel_prob:
        return None
    lo, hi = cls.cancel_after_s
    return at + rng.uniform(lo, hi)
