"""Backend load signals: the text of a /metrics page → a `BackendSnapshot`.

Theory of operation: one `SignalReader` per backend turns each scrape into a snapshot. Gauges
are read as they are; counters and histograms are cumulative, so a windowed percentile needs
the previous scrape: the reader keeps the last cumulative buckets of each histogram and
computes the p90 of the *difference* (what happened between two consecutive scrapes), the way
Prometheus' `histogram_quantile(0.9, rate(...))` does. A counter that went down means the
backend restarted: the current buckets are then the whole window.

Rules:
- Several label sets (model names, data-parallel engines) are summed: counts, counters and
  histogram buckets add up; KV usage (a fraction) is the mean of the engines' (a data-parallel
  server's engines are alike: engines at 0.9 and 0.1 hold half of its KV), the fullest model's
  within one engine. The KV capacity is read once: vLLM writes the server's whole capacity,
  summed over its data-parallel engines, on each engine's `vllm:cache_config_info` line.
- A KV usage series with a `pid` label is one front-end process's copy (vLLM 0.9-0.11 run with
  `--api-server-count` > 1, before vLLM PR #28792): only the process that last got the
  engine's statistics is current, the others keep what they last heard. It is read only where
  the engine has no other KV series, as the fullest copy, and as 0 while the engine runs and
  queues nothing (`Reading.kv_per_process`; the scraper warns once).
- Metric names of vLLM v1 (and the older `vllm:gpu_cache_usage_perc` and
  `vllm:time_per_output_token_seconds`), TensorRT-LLM serve and SGLang are all recognised;
  which engine a backend runs does not need to be configured.
- Text that does not parse, or a page with none of the load gauges, gives `ok=False`; no
  exception escapes `read`. `failed(now)` is the snapshot of a scrape that did not happen.
- So does a page with values that cannot be true: an infinite, NaN or negative gauge, counter
  or windowed latency, or a KV capacity above `MAX_KV_CAPACITY_TOKENS`. A backend that
  reports garbage is treated as one that does not answer (stale: saturated, not picked),
  instead of letting one `+Inf` lift the limit to its maximum or one NaN blind it for good.

Pure: the text and the time are arguments.
"""

from __future__ import annotations

import contextlib
import math
import operator
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from llmvalve.core.policy.spec import MAX_KV_CAPACITY_TOKENS
from llmvalve.core.types import BackendSnapshot

RUNNING = ("vllm:num_requests_running", "trtllm_num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "trtllm_num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "trtllm_kv_cache_utilization",
    "sglang:token_usage",
)
PREEMPTIONS = ("vllm:num_preemptions_total",)
# Speculative decoding (EAGLE, MTP, n-gram): vLLM observes one inter-token latency per engine
# step of a request, and such a step emits 1 + its accepted draft tokens. Read as it is, the
# latency was that many times the latency per token, and the limit was cut that much early.
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC = (SPEC_DRAFTS, SPEC_ACCEPTED)
MAX_TOKENS_PER_STEP = 64.0  # 1 + accepted per draft above this cannot be true (EAGLE drafts ~4)
FINISHED = ("vllm:request_success_total",)
CACHE_INFO = "vllm:cache_config_info"
ITL = "vllm:inter_token_latency_seconds"
# The same per-step measure, the only name of it before vLLM 0.10.2 (beside ITL until 0.12 hid
# it): read when the page has no ITL, under ITL's name.
ITL_BEFORE_0_10_2 = "vllm:time_per_output_token_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"
HISTOGRAMS = (ITL, QUEUE_TIME, TTFT)
PARSED_HISTOGRAMS = (*HISTOGRAMS, ITL_BEFORE_0_10_2)
# Answer lengths of finished requests: only its sum and count are read (a windowed mean).
OUTPUT_TOKENS = "vllm:request_generation_tokens"
SUMMED = (*PARSED_HISTOGRAMS, OUTPUT_TOKENS)
# Every line the reading uses begins with one of these (a sample of a family read here, or of
# a family whose name extends one: those are skipped by name below).
READ_PREFIXES = (*RUNNING, *WAITING, *KV_USAGE, *PREEMPTIONS, *FINISHED, *SPEC, CACHE_INFO,
                 *SUMMED)
QUANTILE = 0.9


class Buckets(NamedTuple):
    """A cumulative histogram as two tuples: upper bounds sorted (+Inf last) and the
    observations at or below each. Two tuples rather than (bound, count) pairs: the window
    between two scrapes is then one subtraction of tuples (the simulated fleet takes ~270,000)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @classmethod
    def of(cls, pairs: Iterable[tuple[float, float]]) -> Buckets:
        """From (upper bound, cumulative count) pairs, as an exposition lists them."""
        pairs = tuple(pairs)
        return cls(tuple(b for b, _ in pairs), tuple(c for _, c in pairs))


class Reading(NamedTuple):
    """What one /metrics page says, cumulative, before any windowing: `parse(text)`, or built
    directly from an engine's numbers by the simulator (sim/gateway.py) — both then go
    through the same `SignalReader.reduce`. A named tuple, as `BackendSnapshot`."""

    gauges: Mapping[str, float]  # metric name → summed value
    kv_usage: float | None
    kv_capacity_tokens: float
    histograms: Mapping[str, Buckets]
    totals: Mapping[str, tuple[float, float]]  # histogram name → (sum, count)
    kv_per_process: bool = False  # KV usage read from per-process copies only (module doc)


def quantile(buckets: Buckets, q: float) -> float | None:
    """`histogram_quantile`: linear interpolation inside the bucket holding rank q·total.

    A rank in the +Inf bucket answers the highest finite bound. None when the histogram is empty.
    """
    bounds, counts = buckets
    if not counts:
        return None
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    # Cumulative counts are sorted: the first bucket holding the rank is a bisection.
    i = min(bisect_left(counts, rank), len(counts) - 1)
    bound, count = bounds[i], counts[i]
    lower_bound, lower_count = (bounds[i - 1], counts[i - 1]) if i else (0.0, 0.0)
    if math.isinf(bound):
        return lower_bound
    if count == lower_count:
        return bound
    fraction = (rank - lower_count) / (count - lower_count)
    return lower_bound + (bound - lower_bound) * fraction


def p90(window: Buckets, mean: float | None) -> float | None:
    """The window's p90: `quantile`, except where every observation lies in the first bucket.
    There interpolation can only say 0.9 of its bound, whatever the observations (vLLM's
    queue time: 0.27 s for any wait under its first bound, 0.3 s, so a queue that drains in
    50 ms read as one that drains in 270). The window's mean is exact: with waits distributed
    exponentially, the p90 is ln 10 times it (no more than the interpolation)."""
    q = quantile(window, QUANTILE)
    if q is not None and mean is not None and window.counts[0] >= window.counts[-1]:
        return min(q, math.log(10) * mean)
    return q


def delta(current: Buckets, previous: Buckets | None) -> Buckets:
    """current − previous, bucket by bucket; a decrease (restart) or a new layout → current."""
    if previous is None or not current.counts:
        return current
    if current.bounds is not previous.bounds and current.bounds != previous.bounds:
        return current
    diff = tuple(map(operator.sub, current.counts, previous.counts))
    return current if min(diff) < 0 else Buckets(current.bounds, diff)


def _sum_buckets(series: Iterable[tuple[float, float]]) -> Buckets:
    by_bound: dict[float, float] = {}
    for bound, count in series:
        by_bound[bound] = by_bound.get(bound, 0.0) + count
    return Buckets.of(sorted(by_bound.items()))


def _read_here(name: str) -> bool:
    """A histogram bucket, or a sum or count, of a family the reading uses."""
    if name.endswith("_bucket"):
        return name[: -len("_bucket")] in PARSED_HISTOGRAMS
    return name.endswith(("_sum", "_count")) and name.rsplit("_", 1)[0] in SUMMED


def _lines_read_here(text: str) -> str:
    """Only the samples the reading may use. A real vLLM page is mostly other series (per-engine
    histograms, LoRA label sets that pile up for a server's lifetime, HTTP and process
    metrics): parsed whole, one page of a data-parallel server took ~46 ms of the event loop
    that answers Envoy, one with 20,000 LoRA series ~400 ms; the lines kept here parse in a
    fraction of that, to the same reading. A malformed line of a family not read here no
    longer fails the page."""
    return "\n".join(line for line in text.split("\n") if line.startswith(READ_PREFIXES))


def _kv_usage(by_engine: Mapping[str, float]) -> float | None:
    """One engine's KV usage; a data-parallel server's (one `engine` label per engine, alike):
    the mean of its engines'. Engines at 0.9 and 0.1 hold half of its KV, not 0.9 of it."""
    return sum(by_engine.values()) / len(by_engine) if by_engine else None


def _under_current_name(named: dict) -> None:
    """vLLM before 0.10.2 names the inter-token latency `ITL_BEFORE_0_10_2`."""
    old = named.pop(ITL_BEFORE_0_10_2, None)
    if old is not None and ITL not in named:
        named[ITL] = old


def parse(text: str) -> Reading:
    """A /metrics page → its `Reading`. Raises on text that does not parse."""
    gauges: dict[str, float] = {}
    kv_by_engine: dict[str, float] = {}
    kv_by_process: dict[str, float] = {}  # the copies with a `pid` label, by engine
    capacities: list[float] = []  # the server's total on every line
    bucket_series: dict[str, list[tuple[float, float]]] = {}
    totals: dict[str, list[float]] = {}
    wanted = set(RUNNING + WAITING + PREEMPTIONS + FINISHED + SPEC)
    for family in text_string_to_metric_families(_lines_read_here(text)):
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if math.isnan(value):
                # NaN in a family read here makes the page fail (a full engine read as an
                # empty one otherwise); elsewhere (an empty summary's quantiles) it is ignored
                if name in wanted or name in KV_USAGE or _read_here(name):
                    raise ValueError(f"{name} is NaN")
                continue
            if name in wanted:
                gauges[name] = gauges.get(name, 0.0) + value
            elif name in KV_USAGE:
                engine = sample.labels.get("engine", "")
                into = kv_by_process if "pid" in sample.labels else kv_by_engine
                into[engine] = max(into.get(engine, value), value)
            elif name == CACHE_INFO:
                blocks = sample.labels.get("num_gpu_blocks", "")
                size = sample.labels.get("block_size", "")
                with contextlib.suppress(ValueError):
                    capacities.append(float(blocks) * float(size))
            elif name.endswith("_bucket") and name[: -len("_bucket")] in PARSED_HISTOGRAMS:
                le = sample.labels.get("le")
                if le is not None:
                    bucket_series.setdefault(name[: -len("_bucket")], []).append((float(le), value))
            elif name.endswith(("_sum", "_count")) and name.rsplit("_", 1)[0] in SUMMED:
                base, kind = name.rsplit("_", 1)
                total = totals.setdefault(base, [0.0, 0.0])
                total[0 if kind == "sum" else 1] += value
    _under_current_name(bucket_series)
    _under_current_name(totals)
    histograms = {name: _sum_buckets(series) for name, series in bucket_series.items()}
    per_process = {e: v for e, v in kv_by_process.items() if e not in kv_by_engine}
    # a NaN or negative one makes the page implausible (max() would drop it)
    capacity = (math.nan if any(not c >= 0 for c in capacities)
                else max(capacities, default=0.0))
    return Reading(
        gauges, _kv_usage({**per_process, **kv_by_engine}), capacity,
        histograms, {k: (s, c) for k, (s, c) in totals.items()}, bool(per_process)
    )


def _plausible(snap: BackendSnapshot, kv_usage: float | None) -> bool:
    numbers = (snap.running, snap.waiting, snap.preemptions_total, snap.kv_capacity_tokens,
               snap.requests_finished_total, kv_usage, snap.itl_p90_s, snap.itl_mean_s,
               snap.itl_count, snap.queue_time_p90_s, snap.ttft_p90_s, snap.output_tokens_mean)
    present = [x for x in numbers if x is not None]  # never empty: running is a number
    # A NaN or an infinity makes the sum NaN or infinite (so would finite values near 1e308).
    return (math.isfinite(sum(present)) and min(present) >= 0
            and snap.kv_capacity_tokens <= MAX_KV_CAPACITY_TOKENS)


def _first(gauges: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in gauges:
            return gauges[name]
    return None


class SignalReader:
    """Scrapes of one backend → snapshots; remembers the last cumulative histograms."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._previous: dict[str, Buckets] = {}
        self._previous_totals: dict[str, tuple[float, float]] = {}
        self.why = ""  # why the last page read failed, for an operator ("" after a good one)
        self.kv_per_process = False  # the last page's KV came from per-process copies

    def failed(self, now: float, why: str = "") -> BackendSnapshot:
        self.why = why
        return BackendSnapshot(backend=self.backend, at=now, ok=False)

    def read(self, text: str, now: float) -> BackendSnapshot:
        try:
            parsed = parse(text)
        except Exception as exc:  # the parser raises ValueError, IndexError, … on garbage
            return self.failed(now, f"the page is not Prometheus text ({str(exc)[:80]})")
        return self.reduce(parsed, now)

    def reduce(self, parsed: Reading, now: float) -> BackendSnapshot:
        """A reading → the snapshot the core gets: gauges as they are, histograms and sums
        over the window since the previous reading."""
        running = _first(parsed.gauges, RUNNING)
        waiting = _first(parsed.gauges, WAITING)
        if running is None and waiting is None and parsed.kv_usage is None:
            return self.failed(now, "no load gauge of vLLM, TensorRT-LLM or SGLang on the page "
                               "(vLLM run with --disable-log-stats exports none)")
        windowed: dict[str, float | None] = {}
        means = {name: self._windowed_mean(name, parsed.totals.get(name)) for name in HISTOGRAMS}
        for name in HISTOGRAMS:
            current = parsed.histograms.get(name)
            previous = self._previous.get(name)
            windowed[name] = None
            if current is None:
                continue
            self._previous[name] = current
            # The first scrape has no window: its cumulative counts span the backend's lifetime.
            # No new observation (the +Inf bucket holds the count): an empty window.
            if previous is not None and current.counts[-1] != previous.counts[-1]:
                windowed[name] = p90(delta(current, previous), means[name][0])
        itl_mean, itl_count = means[ITL]
        tokens = self._tokens_per_step(parsed.gauges)  # the latencies are per step: per token
        itl_p90 = None if windowed[ITL] is None else windowed[ITL] / tokens
        if itl_mean is not None:
            itl_mean, itl_count = itl_mean / tokens, itl_count * tokens
        output_mean, finished = self._windowed_mean(OUTPUT_TOKENS,
                                                    parsed.totals.get(OUTPUT_TOKENS))
        kv = parsed.kv_usage if parsed.kv_usage is not None else 0.0
        if parsed.kv_per_process and not running and not waiting:
            kv = 0.0  # an idle engine's copies may hold a burst's last figure (module doc)
        snap = BackendSnapshot(
            backend=self.backend,
            at=now,
            ok=True,
            running=running or 0.0,
            waiting=waiting or 0.0,
            kv_usage=min(max(kv, 0.0), 1.0),
            preemptions_total=_first(parsed.gauges, PREEMPTIONS) or 0.0,
            kv_capacity_tokens=parsed.kv_capacity_tokens,
            itl_p90_s=itl_p90,
            itl_mean_s=itl_mean,
            itl_count=itl_count,
            queue_time_p90_s=windowed[QUEUE_TIME],
            ttft_p90_s=windowed[TTFT],
            requests_finished_total=_first(parsed.gauges, FINISHED) or 0.0,
            output_tokens_mean=output_mean,
            finished_in_window=finished,
        )
        if not _plausible(snap, parsed.kv_usage):
            return self.failed(now, "values that cannot be true (negative or infinite, or a KV "
                               f"capacity over {MAX_KV_CAPACITY_TOKENS:.0e} tokens)")
        self.why, self.kv_per_process = "", parsed.kv_per_process
        return snap

    def _tokens_per_step(self, gauges: Mapping[str, float]) -> float:
        """Tokens an engine step emits for a request in the window since the previous page:
        1 + the draft tokens accepted per draft with speculative decoding, else 1.
        Counters that cannot be true (infinite, or past MAX_TOKENS_PER_STEP): NaN, which
        makes the page implausible. Steps that drafted nothing (n-gram without a match) emit
        one token: counted at the window's rate, they make the latency read low."""
        if SPEC_DRAFTS not in gauges or SPEC_ACCEPTED not in gauges:
            return 1.0
        # accepted per draft, windowed as a histogram's mean (a restart: the current totals)
        accepted, _ = self._windowed_mean(SPEC_ACCEPTED,
                                          (gauges[SPEC_ACCEPTED], gauges[SPEC_DRAFTS]))
        if accepted is None:  # no window yet, or nothing drafted in it
            return 1.0
        tokens = 1.0 + accepted
        return tokens if tokens <= MAX_TOKENS_PER_STEP else math.nan

    def _windowed_mean(self, name: str, current: tuple[float, float] | None
                       ) -> tuple[float | None, float]:
        """(delta(sum) / delta(count), delta(count)) since the previous scrape (a restart: the
        current totals); (None, 0) without a window or without observations in it."""
        if current is None:
            return None, 0.0
        previous = self._previous_totals.get(name)
        self._previous_totals[name] = current
        if previous is None:
            return None, 0.0
        return windowed_mean(previous, current)


def windowed_mean(previous: tuple[float, float], current: tuple[float, float]
                  ) -> tuple[float | None, float]:
    """The mean of the observations between two cumulative (sum, count) readings, and their
    number; a decrease (the backend restarted) counts the current totals as the window."""
    d_sum, d_count = current[0] - previous[0], current[1] - previous[1]
    if d_count < 0 or d_sum < 0:
        d_sum, d_count = current
    return (d_sum / d_count if d_count > 0 else None), max(0.0, d_count)
