"""Prometheus text (format 0.0.4) for one simulated engine, under vLLM v1, TensorRT-LLM serve or
SGLang metric names. Pure: the numbers come in as arguments.

Rendered by hand from `EngineMetrics` (no registry: a scrape costs one string join). Counters
are written as prometheus_client writes them in this format, and so as vLLM's own page shows
them: `# TYPE name_total counter` over samples `name_total` (no `_created` series).
Histogram times are engine seconds: with `--time-scale X` they are X times the wall-clock times
a client measures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return repr(float(value))


class _Page:
    __slots__ = ("labels", "lines")

    def __init__(self, labels: str) -> None:
        self.labels = labels  # 'k="v",…' without braces
        self.lines: list[str] = []

    def head(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def gauge(self, name: str, value: float, help_text: str) -> None:
        self.head(name, "gauge", help_text)
        self.lines.append(f"{name}{{{self.labels}}} {_num(value)}")

    def counter(self, name: str, value: float, help_text: str) -> None:
        self.head(name + "_total", "counter", help_text)
        self.lines.append(f"{name}_total{{{self.labels}}} {_num(value)}")

    def labelled_counter(self, name: str, label: str, values: dict[str, int],
                         help_text: str) -> None:
        self.head(name + "_total", "counter", help_text)
        for key, value in values.items():
            self.lines.append(f'{name}_total{{{label}="{key}",{self.labels}}} {_num(value)}')

    def histogram(self, name: str, hist: Histogram, help_text: str) -> None:
        self.head(name, "histogram", help_text)
        cumulative = hist.cumulative()
        for bound, count in zip(hist.bounds, cumulative, strict=False):
            self.lines.append(f'{name}_bucket{{le="{_num(bound)}",{self.labels}}} {_num(count)}')
        self.lines.append(f'{name}_bucket{{le="+Inf",{self.labels}}} {_num(cumulative[-1])}')
        self.lines.append(f"{name}_sum{{{self.labels}}} {_num(hist.total)}")
        self.lines.append(f"{name}_count{{{self.labels}}} {_num(hist.count)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(flavor: Flavor, model: str, m: EngineMetrics, g: Gauges) -> str:
    if flavor is Flavor.VLLM:
        page = _page_vllm(model, m, g)
    elif flavor is Flavor.TRTLLM:
        page = _page_trtllm(model, m, g)
    else:
        page = _page_sglang(model, m, g)
    page.counter(RECEIVED[: -len("_total")], g.requests_received,
                 "Requests received by the simulated backend (any answer, faults included).")
    return page.text()


def _page_vllm(model: str, m: EngineMetrics, g: Gauges) -> _Page:
    p = _Page(f'engine="0",model_name="{_escape(model)}"')
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
    p.head("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    p.lines.append(f'vllm:cache_config_info{{block_size="{g.block_size}",cache_dtype="auto",'
                   f'num_gpu_blocks="{g.num_gpu_blocks}",{p.labels}}} 1.0')
    return p


def _page_trtllm(model: str, m: EngineMetrics, g: Gauges) -> _Page:
    p = _Page(f'engine_type="trtllm",model_name="{_escape(model)}"')
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
    p = _Page(f'model_name="{_escape(model)}"')
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
