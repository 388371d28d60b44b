"""The llama3-8b-h100 profile against published vLLM measurements (engine/calibrate.py): every
row within its tolerance, each with its source; the CLI exits 0 and prints the table."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmvalve.engine.calibrate import rows, sharegpt_like

ROWS = rows()


@pytest.mark.parametrize("row", ROWS, ids=[r.key for r in ROWS])
def test_row_within_its_tolerance(row):
    assert row.source and row.published > 0
    assert abs(row.model / row.published - 1) <= row.tolerance, (row.key, row.model)


def test_every_kind_of_measurement_has_a_row():
    assert {r.key for r in ROWS} >= {"burst-ttft", "burst-tpot", "burst-duration",
                                     "sharegpt-cap-throughput", "sharegpt-cap-tpot",
                                     "kv-blocks"}


def test_sharegpt_like_lengths_have_the_published_means_and_the_benchmark_filter():
    reqs = sharegpt_like(5000)
    prompts, outs = [p for p, _ in reqs], [o for _, o in reqs]
    assert sum(prompts) / len(prompts) == pytest.approx(202, rel=0.02)
    assert sum(outs) / len(outs) == pytest.approx(179, rel=0.02)
    assert min(prompts) >= 4 and max(prompts) <= 1024
    assert all(4 <= o and p + o <= 2048 for p, o in reqs)


def test_cli_prints_the_table_and_exits_zero():
    out = subprocess.run([sys.executable, "-m", "llmvalve.engine.calibrate"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("| row | measurement | source | published | model | ratio |")
    lines = out.splitlines()[2:]  # after the header and the rule
    assert "FAIL" not in out
    assert sum(line.endswith("| pass |") for line in lines) == len(ROWS)
