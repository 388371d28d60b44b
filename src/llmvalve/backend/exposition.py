"""Prometheus text (format 0.0.4) for one simulated engine, under vLLM v1, TensorRT-LLM serve or
SGLang metric names. Pure: the numbers come in as arguments.

Written by prometheus_client from metric families built per scrape out of `EngineMetrics` (a
custom collector, no registered metrics): counters as vLLM's own page shows them, `# TYPE
name_total counter` over samples `name_total`, with no `_created` series.
Histogram times are engine seconds: with `--time-scale X` they are X times the wall-clock times
a client measures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

from llmvalve.engine.metrics import EngineMetrics, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RECEIVED = "llmvalve_sim_requests_received_total"


class Flavor(enum.Enum):
    VLLM = "vllm"
    TRTLLM = "trtllm"
    SGLANG = "sglang"


@dataclass(frozen=True)
class Gauges:
    running: int
    waiting: int
    kv_usage: float
    num_gpu_blocks: int
    block_size: int
    requests_received: int


def _num(value: float) -> str:
    return repr(float(value))


class _Page:
    """One scrape's metric families, written by prometheus_client (`generate_latest`)."""

    __slots__ = ("families", "names", "values")

    def __init__(self, **labels: str) -> None:
        self.names = list(labels)
        self.values = list(labels.values())
        self.families: list[Metric] = []

    def collect(self) -> list[Metric]:  # what generate_latest asks of a registry
        return self.families

    def gauge(self, name: str, value: float, help_text: str) -> None:
        family = GaugeMetricFamily(name, help_text, labels=self.names)
        family.add_metric(self.values, value)
        self.families.append(family)

    def info(self, name: str, help_text: str, **labels: str) -> None:
        """A gauge of 1 whose labels carry the information (vLLM's `*_info`)."""
        family = GaugeMetricFamily(name, help_text, labels=[*labels, *self.names])
        family.add_metric([*labels.values(), *self.values], 1.0)
        self.families.append(family)

    def counter(self, name: str, value: float, help_text: str) -> None:
        family = CounterMetricFamily(name, help_text, labels=self.names)
        family.add_metric(self.values, value)
        self.families.append(family)

    def labelled_counter(self, name: str, label: str, values: dict[str, int],
                         help_text: str) -> None:
        family = CounterMetricFamily(name, help_text, labels=[label, *self.names])
        for key, value in values.items():
            family.add_metric([key, *self.values], value)
        self.families.append(family)

    def histogram(self, name: str, hist: Histogram, help_text: str) -> None:
        family = HistogramMetricFamily(name, help_text, labels=self.names)
        bounds, counts = hist.buckets()  # +Inf last
        buckets = [(_num(bound), count) for bound, count in zip(bounds[:-1], counts, strict=False)]
        family.add_metric(self.values, [*buckets, ("+Inf", counts[-1])], hist.total)
        self.families.append(family)

    def text(self) -> str:
        return generate_latest(self).decode()  # type: ignore[arg-type]


def render(flavor: Flavor, model: str, m: EngineMetrics, g: Gauges) -> str:
    if flavor is Flavor.VLLM:
        page = _page_vllm(model, m, g)
    elif flavor is Flavor.TRTLLM:
        page = _page_trtllm(model, m, g)
    else:
        page = _page_sglang(model, m, g)
    page.counter(RECEIVED, g.requests_received,
                 "Requests received by the simulated backend (any answer, faults included).")
    return page.text()


def _page_vllm(model: str, m: EngineMetrics, g: Gauges) -> _Page:
    p = _Page(engine="0", model_name=model)
    p.gauge("vllm:num_requests_running", g.running, "Number of requests in model execution "
            "batches.")
    p.gauge("vllm:num_requests_waiting", g.waiting, "Number of requests waiting to be processed.")
    p.gauge("vllm:kv_cache_usage_perc", g.kv_usage, "KV-cache usage. 1 means 100 percent usage.")
    p.counter("vllm:num_preemptions", m.preemptions_total, "Cumulative number of preemption "
              "from the engine.")
    p.counter("vllm:prompt_tokens", m.prompt_tokens_total, "Number of prefill tokens processed.")
    p.counter("vllm:generation_tokens", m.generation_tokens_total,
              "Number of generation tokens processed.")
    p.labelled_counter("vllm:request_success", "finished_reason", m.finished,
                       "Count of successfully processed requests.")
    p.histogram("vllm:time_to_first_token_seconds", m.ttft,
                "Histogram of time to first token in seconds.")
    p.histogram("vllm:inter_token_latency_seconds", m.itl,
                "Histogram of inter-token latency in seconds.")
    p.histogram("vllm:e2e_request_latency_seconds", m.e2e,
                "Histogram of e2e request latency in seconds.")
    p.histogram("vllm:request_queue_time_seconds", m.queue_time,
                "Histogram of time spent in WAITING phase for request.")
    p.histogram("vllm:request_generation_tokens", m.output_tokens,
                "Number of generation tokens processed.")
    p.info("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
           block_size=str(g.block_size), cache_dtype="auto", num_gpu_blocks=str(g.num_gpu_blocks))
    return p


def _page_trtllm(model: str, m: EngineMetrics, g: Gauges) -> _Page:
    p = _Page(engine_type="trtllm", model_name=model)
    p.gauge("trtllm_num_requests_running", g.running, "Number of requests running.")
    p.gauge("trtllm_num_requests_waiting", g.waiting, "Number of requests waiting.")
    p.gauge("trtllm_kv_cache_utilization", g.kv_usage, "KV cache utilization (0-1).")
    p.labelled_counter("trtllm_request_success", "finished_reason", m.finished,
                       "Count of successfully processed requests.")
    p.histogram("trtllm_time_to_first_token_seconds", m.ttft,
                "Histogram of time to first token in seconds.")
    p.histogram("trtllm_time_per_output_token_seconds", m.itl,
                "Histogram of time per output token in seconds.")
    p.histogram("trtllm_e2e_request_latency_seconds", m.e2e,
                "Histogram of end to end request latency in seconds.")
    p.histogram("trtllm_request_queue_time_seconds", m.queue_time,
                "Histogram of time spent in WAITING phase for request.")
    return p


def _page_sglang(model: str, m: EngineMetrics, g: Gauges) -> _Page:
    p = _Page(model_name=model)
    p.gauge("sglang:num_running_reqs", g.running, "The number of running requests.")
    p.gauge("sglang:num_queue_reqs", g.waiting, "The number of requests in the waiting queue.")
    p.gauge("sglang:token_usage", g.kv_usage, "The token usage.")
    p.counter("sglang:prompt_tokens", m.prompt_tokens_total, "Number of prefill tokens "
              "processed.")
    p.counter("sglang:generation_tokens", m.generation_tokens_total,
              "Number of generation tokens processed.")
    p.counter("sglang:num_requests", sum(m.finished.values()) - m.finished["abort"],
              "Number of requests processed.")
    p.counter("sglang:num_aborted_requests", m.finished["abort"],
              "Number of requests aborted.")
    p.histogram("sglang:time_to_first_token_seconds", m.ttft,
                "Histogram of time to first token in seconds.")
    p.histogram("sglang:inter_token_latency_seconds", m.itl,
                "Histogram of inter-token latency in seconds.")
    p.histogram("sglang:e2e_request_latency_seconds", m.e2e,
                "Histogram of End-to-end request latency in seconds")
    p.histogram("sglang:queue_time_seconds", m.queue_time,
                "Histogram of queueing time in seconds.")
    return p
