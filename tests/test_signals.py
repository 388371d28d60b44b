import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmvalve.core.signals import Buckets, SignalReader, delta, quantile

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 5.0
vllm:num_requests_running{engine="0",model_name="qwen"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.61
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama"} 11.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="llama"} 40.0
vllm:request_success_total{finished_reason="length",model_name="llama"} 2.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{le="0.01",model_name="llama"} {a}
vllm:inter_token_latency_seconds_bucket{le="0.025",model_name="llama"} {b}
vllm:inter_token_latency_seconds_bucket{le="0.05",model_name="llama"} {c}
vllm:inter_token_latency_seconds_bucket{le="0.1",model_name="llama"} {d}
vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="llama"} {d}
vllm:inter_token_latency_seconds_count{model_name="llama"} {d}
vllm:inter_token_latency_seconds_sum{model_name="llama"} {s}
"""


def vllm_text(a: int, b: int, c: int, d: int, s: float = 1.0) -> str:
    text = VLLM
    for key, value in {"a": a, "b": b, "c": c, "d": d, "s": s}.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def test_vllm_gauges_are_summed_over_label_sets():
    snap = SignalReader("b0").read(vllm_text(0, 0, 0, 0), now=3.0)
    assert snap.ok and snap.backend == "b0" and snap.at == 3.0
    assert snap.running == 7.0
    assert snap.waiting == 3.0
    assert snap.kv_usage == 0.61  # a fraction: the maximum, not the sum
    assert snap.preemptions_total == 11.0
    assert snap.kv_capacity_tokens == 2048 * 16
    assert snap.requests_finished_total == 42.0


def test_windowed_p90_comes_from_the_difference_of_two_scrapes():
    reader = SignalReader("b0")
    first = reader.read(vllm_text(100, 100, 100, 100), now=0.0)
    assert first.itl_p90_s is None  # no window yet
    # Since the first scrape: 10 new samples, all between 25 ms and 50 ms.
    second = reader.read(vllm_text(100, 100, 110, 110, s=1.3), now=0.5)
    assert abs(second.itl_p90_s - (0.025 + 0.025 * 0.9)) < 1e-9
    assert abs(second.itl_mean_s - 0.03) < 1e-9  # (1.3 - 1.0) / 10
    assert second.itl_count == 10  # the tokens it averages: it weighs its scrape by them
    # Nothing new: no sample in the window.
    third = reader.read(vllm_text(100, 100, 110, 110, s=1.3), now=1.0)
    assert third.itl_p90_s is None
    assert third.itl_mean_s is None


def test_counter_reset_uses_the_current_buckets():
    reader = SignalReader("b0")
    reader.read(vllm_text(500, 500, 500, 500), now=0.0)
    snap = reader.read(vllm_text(0, 0, 0, 10), now=0.5)  # restarted backend
    assert 0.05 < snap.itl_p90_s <= 0.1


def test_quantile_and_delta():
    math_inf = float("inf")
    of = Buckets.of
    buckets = of(((0.1, 0.0), (0.2, 10.0), (math_inf, 10.0)))
    assert abs(quantile(buckets, 0.5) - 0.15) < 1e-12
    assert quantile(of(((1.0, 0.0), (math_inf, 4.0))), 0.9) == 1.0  # in +Inf: highest bound
    assert quantile(of(((1.0, 0.0), (math_inf, 0.0))), 0.9) is None
    assert quantile(of(()), 0.9) is None
    assert delta(of(((1.0, 5.0),)), of(((1.0, 2.0),))) == of(((1.0, 3.0),))
    assert delta(of(((1.0, 5.0),)), of(((2.0, 2.0),))) == of(((1.0, 5.0),))  # layout changed
    assert delta(of(((1.0, 5.0), (2.0, 6.0))), of(((1.0, 2.0),))) == of(((1.0, 5.0), (2.0, 6.0)))


def test_old_vllm_kv_name():
    text = "vllm:gpu_cache_usage_perc 0.3\nvllm:num_requests_running 1\n"
    assert SignalReader("b").read(text, 0.0).kv_usage == 0.3


def test_trtllm_names():
    text = (
        "# TYPE trtllm_num_requests_waiting gauge\ntrtllm_num_requests_waiting 4\n"
        "trtllm_num_requests_running 9\ntrtllm_kv_cache_utilization 0.8\n"
    )
    snap = SignalReader("t").read(text, 0.0)
    assert (snap.ok, snap.waiting, snap.running, snap.kv_usage) == (True, 4.0, 9.0, 0.8)


def test_sglang_names():
    text = (
        'sglang:num_queue_reqs{model_name="m"} 6\nsglang:num_running_reqs{model_name="m"} 12\n'
        'sglang:token_usage{model_name="m"} 0.55\n'
    )
    snap = SignalReader("s").read(text, 0.0)
    assert (snap.ok, snap.waiting, snap.running, snap.kv_usage) == (True, 6.0, 12.0, 0.55)


def test_garbage_and_unrelated_pages_are_not_ok():
    reader = SignalReader("b")
    assert not reader.read("<html><body>502 Bad Gateway</body></html>", 1.0).ok
    assert not reader.read("", 1.0).ok
    assert not reader.read("process_cpu_seconds_total 3.0\n", 1.0).ok
    assert not reader.failed(2.0).ok


def test_nan_in_a_family_read_fails_the_page_and_elsewhere_is_ignored():
    """Found by a review: NaN samples were skipped wherever they were, so a NaN KV usage read
    as an empty engine (ok, 0.0) and a NaN preemption counter as 0, the next page then
    counting preemptions that never happened. An empty summary's NaN quantiles (a family not
    read here) still do not fail a page."""
    base = "vllm:num_requests_running 3\nvllm:num_requests_waiting 0\n"
    for bad in ("vllm:kv_cache_usage_perc NaN\n", "vllm:num_preemptions_total NaN\n",
                'vllm:inter_token_latency_seconds_bucket{le="0.1"} NaN\n',
                "vllm:request_generation_tokens_sum NaN\n"):
        assert not SignalReader("b").read(base + bad, 1.0).ok, bad
    summary = 'python_gc_pause_seconds{quantile="0.5"} NaN\n'
    assert SignalReader("b").read(base + summary, 1.0).ok


@given(st.text(max_size=300))
def test_no_text_raises(text):
    """Any text at all gives a snapshot (a failed one for garbage), never an exception."""
    snap = SignalReader("b").read(text, 0.0)  # would raise out of the test if it could
    assert snap.backend == "b" and 0.0 <= snap.kv_usage <= 1.0


@given(st.lists(st.sampled_from([*VLLM.splitlines(), "x{", "}", "vllm:num_requests_running NaN"])))
def test_shuffled_lines_never_raise(lines):
    SignalReader("b").read("\n".join(lines) + "\n", 0.0)


def test_vllm_before_0_11_names_the_inter_token_latency_otherwise():
    """Found by a review against vLLM's own metrics code: the name `inter_token_latency` came
    in 0.10.2; before, the same per-step measure was `time_per_output_token`, so on vLLM 0.6
    to 0.10 the latency signal was never read, and the limit grew to the KV ceiling whatever
    the engine's latency. Where both names are on a page (0.10.2 to 0.11), one is read."""
    def old_names(text: str) -> str:
        return text.replace("inter_token_latency", "time_per_output_token")

    def itl_only(text: str) -> str:
        return text[text.index("# TYPE vllm:inter_token_latency"):]

    for first, second in (
        (old_names(vllm_text(100, 100, 100, 100)), old_names(vllm_text(100, 100, 110, 110, 1.3))),
        (vllm_text(100, 100, 100, 100) + old_names(itl_only(vllm_text(100, 100, 100, 100))),
         vllm_text(100, 100, 110, 110, 1.3) + old_names(itl_only(vllm_text(100, 100, 110, 110,
                                                                            1.3)))),
    ):
        reader = SignalReader("b")
        reader.read(first, 0.0)
        snap = reader.read(second, 0.5)
        assert abs(snap.itl_p90_s - (0.025 + 0.025 * 0.9)) < 1e-9
        assert abs(snap.itl_mean_s - 0.03) < 1e-9 and snap.itl_count == 10  # not 20


def test_a_data_parallel_servers_kv_is_its_engines_mean_and_its_capacity_read_once():
    """Found by reviews. KV usage was the fullest engine's, so engines at 0.9 and 0.1 read as
    0.9 and the lowest class was shed with half the server's KV free. And the capacity was the
    sum of the engines' lines, but vLLM's front-end sums `num_gpu_blocks` over its engines at
    start (`vllm/v1/engine/utils.py`) and writes that total on each engine's line: a server of
    N engines read as N times its KV (the first limit and the KV ceiling N times too high)."""
    page = "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_running{engine=\"1\"} 1\n"
    for engine, usage in (("0", 0.9), ("1", 0.1)):
        page += (f'vllm:kv_cache_usage_perc{{engine="{engine}",model_name="m"}} {usage}\n'
                 f'vllm:cache_config_info{{block_size="16",engine="{engine}",'
                 f'num_gpu_blocks="2000"}} 1.0\n')  # 1,000 blocks each: the server's 2,000
    snap = SignalReader("b").read(page, 0.0)
    assert abs(snap.kv_usage - 0.5) < 1e-9 and snap.kv_capacity_tokens == 32_000
    # a line without a number (vLLM 0.8.0-0.8.4 wrote "None"): the others still give it
    partial = page.replace('engine="1",num_gpu_blocks="2000"', 'engine="1",num_gpu_blocks="None"')
    snap = SignalReader("b").read(partial, 0.0)
    assert abs(snap.kv_usage - 0.5) < 1e-9 and snap.kv_capacity_tokens == 32_000


def test_kv_copies_of_front_end_processes_are_read_only_where_nothing_else_is():
    """Found by a review: vLLM 0.9-0.11 with `--api-server-count` > 1 exports KV usage once per
    front-end process (a `pid` label); only the one that got the engine's last statistics is
    current. The fullest was read: an engine back at 0.04 after a burst read 0.92, shedding
    the lower classes at idle. The copy without `pid` (the older name, kept current) wins."""
    page = ('vllm:num_requests_running{engine="0",model_name="m"} 1\n'
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.04\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="6089"} 0.04\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="6088"} 0.92\n')
    reader = SignalReader("b")
    assert reader.read(page, 0.0).kv_usage == 0.04 and not reader.kv_per_process
    # only per-process copies (0.11 hides the older name): the fullest, and the reader says so
    only = page.replace('vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.04\n', "")
    assert reader.read(only, 0.5).kv_usage == 0.92 and reader.kv_per_process
    # ... but an engine that runs and queues nothing holds no KV, whatever a copy says
    idle = only.replace('vllm:num_requests_running{engine="0",model_name="m"} 1',
                        'vllm:num_requests_running{engine="0",model_name="m"} 0')
    assert reader.read(idle, 1.0).kv_usage == 0.0


def test_only_the_lines_read_are_parsed_to_the_same_reading():
    """A real page is mostly series not read here (about 46 ms to parse a data-parallel
    server's on the event loop that answers Envoy): they are dropped before parsing, and a
    malformed one no longer fails the page."""
    from llmvalve.core.signals import parse

    page = vllm_text(100, 100, 110, 110, s=1.3)
    noise = "".join(f'vllm:lora_requests_info{{running_lora_adapters="a{i}"}} 1.7e9\n'
                    f'http_requests_total{{handler="/v1/x{i}"}} {i}\n' for i in range(500))
    assert parse(noise + page) == parse(page)
    assert SignalReader("b").read(page + "http_requests_total{broken 1\n", 0.0).ok


def test_with_speculative_decoding_the_latency_is_read_per_token():
    """Found by a review against vLLM's source: vLLM observes one inter-token latency per
    engine step of a request, and with speculative decoding a step emits 1 + the draft tokens
    it accepted; read as it was, the latency was that many times the latency per token, and
    the limit was cut as early (and the engine read as a slow card)."""
    def page(itl_sum: float, itl_count: float, drafts: float, accepted: float | str) -> str:
        return ("vllm:num_requests_running 4\n"
                f"vllm:inter_token_latency_seconds_sum {itl_sum}\n"
                f"vllm:inter_token_latency_seconds_count {itl_count}\n"
                f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}\n'
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {accepted}\n')

    reader = SignalReader("b")
    reader.read(page(1.0, 10, 100, 50), 0.0)
    snap = reader.read(page(4.0, 40, 130, 80), 0.5)  # 30 steps of 0.1 s, 2 tokens each
    assert snap.itl_mean_s == pytest.approx(0.05) and snap.itl_count == pytest.approx(60)
    # counters that cannot be true make the page implausible, not the latency NaN for good
    bad = SignalReader("b")
    bad.read(page(1.0, 10, 100, 50), 0.0)
    assert not bad.read(page(4.0, 40, 130, "+Inf"), 0.5).ok
    bad.read(page(1.0, 10, 100, 50), 1.0)
    assert not bad.read(page(4.0, 40, 130, 5000), 1.5).ok  # 167 tokens a step
    plain = SignalReader("b")  # without the counters: as the engine says
    plain.read(page(1.0, 10, 0, 0).split("vllm:spec")[0], 0.0)
    assert plain.read(page(4.0, 40, 0, 0).split("vllm:spec")[0], 0.5).itl_mean_s == \
        pytest.approx(0.1)


QUEUE_TIME_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 4.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{le="0.3"} {first}
vllm:request_queue_time_seconds_bucket{le="0.5"} {total}
vllm:request_queue_time_seconds_bucket{le="+Inf"} {total}
vllm:request_queue_time_seconds_count {total}
vllm:request_queue_time_seconds_sum {s}
"""


def queue_time_page(first: int, total: int, s: float) -> str:
    return (QUEUE_TIME_PAGE.replace("{first}", str(first)).replace("{total}", str(total))
            .replace("{s}", str(s)))


def test_a_queue_draining_within_vllms_first_bucket_reads_its_own_wait_not_the_bucket():
    """vLLM's queue-time histogram begins at 0.3 s: interpolation reads 0.27 s for any wait
    under it, so a policy with a TTFT objective under about a second read every engine's
    queue as draining too slowly. Where the whole window lies in that bucket, its mean (exact)
    gives the p90 as for exponential waits; otherwise the interpolation stands."""
    reader = SignalReader("b0")
    reader.read(queue_time_page(10, 10, 0.5), now=0.0)
    # 20 more waits, all under 0.3 s, averaging 40 ms
    snap = reader.read(queue_time_page(30, 30, 0.5 + 20 * 0.04), now=0.5)
    assert snap.queue_time_p90_s == pytest.approx(2.302585 * 0.04, rel=1e-4)
    # a wait past the first bound in the window: the interpolation, as before
    # (7 of 10 under 0.3 s, 3 under 0.5 s: rank 9 is two thirds into the second bucket)
    snap = reader.read(queue_time_page(37, 40, 1.3 + 7 * 0.04 + 3 * 0.4), now=1.0)
    assert snap.queue_time_p90_s == pytest.approx(0.3 + 0.2 * 2 / 3)
    # long waits in the first bucket: never above what the interpolation says
    snap = reader.read(queue_time_page(47, 50, 2.78 + 10 * 0.29), now=1.5)
    assert snap.queue_time_p90_s == pytest.approx(0.27)
