"""docs/performance.md's generator: the targets judged from the JSON's figures, and the step
from idle reported apart from the steady state."""

from __future__ import annotations

from llmvalve.bench.performance_doc import from_idle_table, render, verdicts


def overhead(added_p99_ms: float) -> dict:
    alone = {"p50_ms": 0.9, "p99_ms": 3.0, "p99_ms_runs": [3.0, 3.1, 2.9], "statuses": {},
             "from_idle": {"seconds": 2.0, "p50_ms": 0.9, "p99_ms": 3.1}}
    http = {"p50_ms": 1.2, "p99_ms": 3.0 + added_p99_ms, "p99_ms_runs": [4.0, 4.2, 3.9],
            "statuses": {}, "added_p50_ms": 0.3, "added_p99_ms": added_p99_ms,
            "from_idle": {"seconds": 2.0, "p50_ms": 1.6, "p99_ms": 27.0}}
    return {"modes": ["alone", "http"], "backends": 4, "upstream": "direct", "client": "wrk",
            "closed_loop": {"alone": {"req_per_s": 12000.0, "admitted_per_s": 12000.0,
                                      "p50_ms": 2.0, "p99_ms": 4.0, "connections": 32},
                            "http": {"req_per_s": 6000.0, "admitted_per_s": 6000.0,
                                     "p50_ms": 5.0, "p99_ms": 10.0, "connections": 32}},
            "open_loop": [{"rate": 1000.0, "alone": alone, "http": http}],
            "burst": {"2000": {"http": {"statuses": {"200": 1500, "429": 500},
                                        "reasons": {"gateway_overloaded": 500},
                                        "seconds": 1.5}}},
            "loadavg_1m": 1.2}


def test_targets_are_judged_on_the_steady_state():
    assert "+1.10 ms p99 (target ≤ 1.0 / ≤ 3.0 ms): met" in "\n".join(verdicts(overhead(1.1)))
    assert "+4.00 ms p99 (target ≤ 1.0 / ≤ 3.0 ms): missed" in "\n".join(
        verdicts(overhead(4.0)))
    assert "6,000 admitted requests/s, 0.50× Envoy alone" in "\n".join(verdicts(overhead(1.1)))


def test_a_closed_loop_measured_by_the_python_client_says_so():
    """The Python client saturates before Envoy alone on 2 cores (5,992 req/s against wrk's
    14,222): its ratio compares the client with itself."""
    oh = overhead(1.1)
    assert "Python client" not in "\n".join(verdicts(oh))
    oh["client"] = "python"
    assert "Measured with the Python client" in "\n".join(verdicts(oh))


def test_the_step_from_idle_is_shown_apart_with_each_runs_steady_p99():
    table = from_idle_table(overhead(1.1))
    assert "| 1000 | http | 1.60 / 27.00 | 4.00 / 4.20 / 3.90 |" in table
    page = render(overhead(1.1))
    assert "The step from idle." in page and table in page


def test_a_json_without_the_step_from_idle_renders_without_its_table():
    oh = overhead(1.1)
    for mode in ("alone", "http"):
        del oh["open_loop"][0][mode]["from_idle"]
    assert from_idle_table(oh) == ""
    assert "The step from idle." not in render(oh)


def test_the_page_names_the_machine_the_json_records():
    """The machine line is read from the run, not written into the generator."""
    oh = overhead(1.1)
    assert "not recorded in this run's JSON" in render(oh)
    oh["machine"] = {"cpus": 8, "cpu_model": "Some CPU", "python": "3.11.9",
                     "platform": "Linux", "event_loop": "asyncio",
                     "envoy": "9e5580933739/1.40.0/Clean/RELEASE/BoringSSL"}
    page = render(oh)
    assert "8 CPUs (Some CPU), Python 3.11.9, Envoy 1.40.0, the control plane on asyncio." in page
    assert "runs on the same 8 CPUs" in page and "event loop (asyncio)" in page
