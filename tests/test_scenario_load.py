"""Scenario files get the policy's care: file:line errors for unknown keys and bad values
(exit 2, one line each, never a traceback), paths relative to the scenario's folder, rate
ramps and on/off bursts, trace classes split among several tenants."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from llmvalve.sim import workload
from llmvalve.sim.gateway import check_of
from llmvalve.sim.runner import default_policy
from llmvalve.sim.scenario import RetrySpec, ScenarioError, load_scenario
from llmvalve.sim.scenario_load import MAX_REQUESTS, parse_scenario
from llmvalve.sim.workload import MAX_TRACE_BYTES, MAX_TRACE_ROWS, generate, on_off_schedule

BASE = """\
name: t
duration: 60s
backends: {count: 2, profile: small}
classes:
  - name: chat
    priority: 0
    rate: 1.0
"""


def error_of(text: str) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, "t.yaml")
    return str(exc.value)


def test_a_good_scenario_loads():
    sc = parse_scenario(BASE, "t.yaml")
    assert sc.backends == 2 and sc.classes[0].rate == ((0.0, 1.0),)


def test_misspelled_key_names_file_line_and_key():
    msg = error_of(BASE + "    maxToken: 300\n")
    assert msg == ("t.yaml:8: classes[0].maxToken: unknown key 'maxToken'; "
                   "did you mean 'maxTokens'?")


def test_unknown_top_level_key():
    assert error_of(BASE + "gateway: 3\n").startswith("t.yaml:8: gateway: unknown key")


@pytest.mark.parametrize("event, expect", [
    ("{at: 10s, backend: 2, slowdown: 2}", "t.yaml:9: events[0].backend: backend 2 is out of "
     "range: there are 2 backends (0..1)"),
    ("{at: 10s, backend: all, slowdown: 2}", "t.yaml:9: events[0].backend: expected a backend "
     "index (0..1) or a list of them; for every backend write backend: [0, 1]; got 'all'"),
    ("{at: 10s, slowdown: 2}", "t.yaml:9: events[0].backend: missing (required)"),
    ("{at: 10s, backend: 0}", "t.yaml:9: events[0]: an event does something"),
    ("{backend: 0, leave: true}", "t.yaml:9: events[0].at: missing (required)"),
    ("{at: soon, backend: 0, leave: true}", "t.yaml:9: events[0].at: bad duration 'soon'"),
])
def test_bad_events(event, expect):
    assert error_of(BASE + f"events:\n  - {event}\n").startswith(expect)


@pytest.mark.parametrize("event, expect", [
    ("{at: 1h, backend: 0, leave: true}", "t.yaml:9: events[0].at: after the run ends (60 s)"),
    ("{at: 5s, backend: [], leave: true}", "t.yaml:9: events[0].backend: an empty list"),
    ("{at: 5s, backend: [0, 0], leave: true}", "t.yaml:9: events[0].backend: a backend named "
     "twice"),
    ("{at: 5s, backend: 0, leave: true, rejoin: true}", "t.yaml:9: events[0]: leave and "
     "rejoin at once"),
    ("{at: 5s, backend: 1, rejoin: true}", "t.yaml:9: events[0]: backend 1 rejoins at 5 s "
     "without having left"),
    ("{at: 5s, backend: 0, leave: true}\n  - {at: 9s, backend: [1, 0], leave: true}",
     "t.yaml:10: events[1]: backend 0 leaves again at 9 s without having rejoined"),
    ("{at: 9s, backend: 0, leave: true}\n  - {at: 5s, backend: 0, rejoin: true}",
     "t.yaml:10: events[1]: backend 0 rejoins at 5 s without having left"),
    ("{at: 5s, backend: " + "9" * 300 + ", leave: true}", "t.yaml:9: events[0].backend: "
     "backend 99999"),
])
def test_events_that_would_do_nothing_or_contradict_themselves(event, expect):
    assert error_of(BASE + f"events:\n  - {event}\n").startswith(expect)


@pytest.mark.parametrize("change, expect", [
    (("rate: 1.0", "rate: 1e9"), "t.yaml:7: classes[0].rate: expected a number, got a string "
     "(YAML reads 1e9 as text: write the exponent with a dot and a sign, 1.0e+9"),
    (("rate: 1.0", "rate: 1.0e+6"), "t.yaml:5: classes: about 60,000,000 requests"),
    # found by a review: each of these hung, or filled the memory, or was taken and ignored
    (("duration: 60s", "duration: 60s\nsweepLoads: [1.0e+6]"),
     "t.yaml:6: classes: about 60,000,000 requests"),
    (("rate: 1.0", "rate: 40000.0\nsweepLoads: [0.5]"),  # the run at load 1 counts too
     "t.yaml:5: classes: about 2,400,000 requests"),
    (("rate: 1.0", "rate: {onOff: {onRate: 0, offRate: 1.0e+9, onFor: 1s, offFor: 1s}}"),
     "t.yaml:5: classes: about 60,000,000,000 requests"),
    (("rate: 1.0", "rate: 1.0e+300"), "t.yaml:5: classes: about 6e+301 requests"),
    (("rate: 1.0", "rate: 20000.0\n    retry: {mode: immediate, maxAttempts: 50}"),
     "t.yaml:5: classes: about 61,200,000 requests"),
    # maxAttempts counts retries: the first attempt comes on top (found by a review: read
    # as 1,440,000 requests, this was taken)
    (("rate: 1.0", "rate: 12000.0\n    retry: {mode: immediate, maxAttempts: 2}"),
     "t.yaml:5: classes: about 2,160,000 requests"),
    (("rate: 1.0", "rate: 1.0\n    retry: {mode: immediate, maxAttempts: 10000}"),
     "t.yaml:8: classes[0].retry.maxAttempts: must be >= 1 and <= 100"),
    (("duration: 60s", "duration: 60s\nmetrics: {scrapeInterval: 10us}"),
     "t.yaml:3: metrics.scrapeInterval: at least 0.01s"),
    (("rate: 1.0", "rate: 1.0\n    prompt: {mean: 500, cv: 1.0e+300}"),
     "t.yaml:8: classes[0].prompt.cv: must be >= 0 and <= 100"),
    (("rate: 1.0", "rate: null"), "t.yaml:7: classes[0].rate: missing: a class has a rate"),
    (("rate: 1.0", "rate: {ramp: null}"), "t.yaml:7: classes[0].rate.ramp: missing its value"),
    (("rate: 1.0", "rate: {onOff: null}"), "t.yaml:7: classes[0].rate.onOff: missing its value"),
    (("rate: 1.0", "rate: [[0, 1], [100s, 5]]"),
     "t.yaml:7: classes[0].rate[1]: a step after the run ends (60 s)"),
    (("duration: 60s", "duration: " + "9" * 5000),
     "t.yaml:2: duration: cannot be read as an integer"),
    (("    rate: 1.0\n", ""), "t.yaml:5: classes[0].rate: missing: a class has a rate"),
    (("rate: 1.0", "rate: 1.0\n    prompt: {mean: 500, max: 100}"),
     "t.yaml:8: classes[0].prompt: mean 500 is outside [min 1, max 100]"),
    (("rate: 1.0", "rate: 1.0\n    retry: {mode: jitter, base: 10s, cap: 1s}"),
     "t.yaml:8: classes[0].retry.cap: cap 1 s is below base 10 s"),
    (("rate: 1.0", "rate: {onOff: {onRate: 5, onFor: 1ms, offFor: 5s}}"),
     "t.yaml:7: classes[0].rate.onOff.onFor: periods of at least 100ms"),
    (("count: 2", "count: 100000"), "t.yaml:3: backends.count: must be >= 1 and <= 4096"),
    (("count: 2", "count: 2, kvBlocks: 100"), "t.yaml:3: backends.kvBlocks: 100 blocks of 16 "
     "tokens hold less than one sequence of max_model_len"),
    (("duration: 60s", "duration: 30d"), "t.yaml:2: duration: bad duration"),
    (("duration: 60s", "duration: 48h"), "t.yaml:2: duration: at most 86400 s"),
    (("rate: 1.0", "rate: 1.0\n    retry: {base: 2s}"),
     "t.yaml:8: classes[0].retry.base: retry mode none retries nothing: it would be ignored"),
    (("rate: 1.0", "rate: 1.0\n    cancel: {after: [1s, 2s]}"),
     "t.yaml:8: classes[0].cancel.after: without prob (or at prob 0) nobody cancels: it "
     "would be ignored"),
    # found by a trial of the format (stop 59): each of these ran, its value taken and ignored
    (("rate: 1.0", "rate: 1.0\n    cancel: {prob: 0, after: [1s, 2s]}"),
     "t.yaml:8: classes[0].cancel.after: without prob (or at prob 0) nobody cancels"),
    (("rate: 1.0", "rate: 1.0\n    retry: {mode: immediate, maxAttempts: 2, cap: 5s}"),
     "t.yaml:8: classes[0].retry.cap: retry mode immediate retries at once: it would be "
     "ignored"),
    (("duration: 60s", "duration: 1ms"), "t.yaml:2: duration: at least 1 s of traffic"),
    (("duration: 60s", "duration: 60s\noracleSweep: []"), "t.yaml:3: oracleSweep: empty: "
     "omit it for the default"),
    (("duration: 60s", "duration: 60s\ncontrollers: []"), "t.yaml:3: controllers: empty"),
    # found by a fuzzing review (stop 52): each of these ran, hung or was taken and ignored
    (("duration: 60s", "duration: 60s\nsweepLoads: [" + ", ".join(["1.0"] * 65) + "]"),
     "t.yaml:3: sweepLoads: 65 entries, each a run of its own: at most 64"),
    (("duration: 60s\nbackends: {count: 2,", "duration: 24h\nbackends: {count: 4096,"),
     "t.yaml:2: duration: about 7.08e+08 scrapes (4,096 backends x 1 gateways"),
    (("rate: 1.0", "rate: 1.0\n    prompt: 5000000"),
     "t.yaml:8: classes[0].prompt: must be >= 1 and <= 1000000"),
    (("rate: 1.0\n", "rate: 1.0\nevents:\n  - {at: 1s, backend: 0, leave: true, slowdown: 2}\n"),
     "t.yaml:9: events[0]: a backend that leaves runs nothing"),
    (("rate: 1.0\n", "rate: 1.0\nevents:\n  - {at: 1s, backend: 0, leave: true}\n"
      "  - {at: 2s, backend: 0, kvBlocks: 512}\n  - {at: 3s, backend: 0, rejoin: true}\n"),
     "t.yaml:10: events[1]: backend 0 has left by 2 s: this would be ignored"),
])
def test_values_that_would_hang_or_be_ignored(change, expect):
    assert error_of(BASE.replace(*change)).startswith(expect)


@pytest.mark.parametrize("key", ["priority: 1", "prompt: {mean: 100}", "output: {mean: 50}"])
def test_a_trace_class_refuses_what_its_trace_sets(key):
    """Found by a review: these were read and then ignored (the split sets the priorities,
    the trace the lengths)."""
    text = BASE + f"  - name: r\n    trace: {{file: azure-conv, split: {{0: 1}}}}\n    {key}\n"
    field = key.split(":")[0]
    assert error_of(text).startswith(f"t.yaml:10: classes[1].{field}: a trace")


def test_duplicate_class_names_and_own_keys():
    assert error_of(BASE + "  - {name: chat, priority: 1, rate: 1}\n").startswith(
        "t.yaml:8: classes[1].name: duplicate class name 'chat' (already classes[0])")
    sc = parse_scenario("x-chat: &c {priority: 0, rate: 1.0}\n" + BASE.replace(
        "    priority: 0\n    rate: 1.0\n", "    <<: *c\n"), "t.yaml")
    assert sc.classes[0].rate == ((0.0, 1.0),)


@pytest.mark.parametrize("rows, expect", [
    ("", "no requests"),
    ("t,p,o\n", "no requests"),
    ("t,p,o\n0,100,50\n1,abc,50\n", "x.csv:3: expected timestamp"),
    # a first row is a header when it has no numbers where the token counts go; a data row
    # that does not parse is an error there too (found by a review: it was skipped)
    ("0,100\n", "x.csv:1: expected timestamp"),
    ("0,-5,50\n1,100,50\n", "x.csv:1: expected timestamp"),
    ("0,1.5,50\n1,100,50\n", "x.csv:1: expected timestamp"),
    ("t,p,o\n0,100," + "5" * 200_000 + "\n", "x.csv:2: field larger than field limit"),
    ("0,100,50\n1,100\n", "x.csv:2: expected timestamp"),
    ("0,100,50\n1,-100,50\n", "x.csv:2: expected timestamp"),
    ("0;100;50\n1;100;50\n", "x.csv:2: expected timestamp"),
    ("0,100,50\nsoon,100,50\n", "x.csv:2: expected timestamp"),
    # another trace's columns (found by a trial: the fourth was dropped without a word)
    ("t,p,o\n0,300,50,7\n", "x.csv:2: expected three columns (timestamp, prompt tokens, "
     "output tokens), got 4"),
])
def test_a_trace_that_cannot_be_replayed_is_one_line_naming_its_row(tmp_path, rows, expect):
    (tmp_path / "x.csv").write_text(rows)
    f = tmp_path / "s.yaml"
    f.write_text("duration: 30s\nclasses:\n  - name: r\n    trace: {file: x.csv, split: "
                 "{1: 1.0}}\n")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(str(f))
    [line] = str(exc.value).splitlines()
    assert line.startswith(f"{f}:4: classes[0].trace.file: ") and expect in line


def test_a_trace_that_unpacks_past_its_bound_is_refused_without_unpacking_it(tmp_path):
    """Found by a review: a 97 KB gzip of newlines took 620 MB and 8 s before its error."""
    (tmp_path / "x.csv").write_bytes(gzip.compress(b"\n" * (MAX_TRACE_BYTES + 1)))
    f = tmp_path / "s.yaml"
    f.write_text("duration: 30s\nclasses:\n  - name: r\n    trace: {file: x.csv}\n")
    with pytest.raises(ScenarioError, match="more than 64 MiB of CSV"):
        load_scenario(str(f))


def test_a_trace_of_more_requests_than_a_scenario_may_send_is_refused(tmp_path, monkeypatch):
    """Found by a trial: 3,000,000 rows of 15 bytes fit in the bytes' bound, and the run
    filled 3 GB before it was stopped. The bound is a scenario's (2,000,000 requests), here
    lowered to 1,000 rows: reading two million takes seconds."""
    assert MAX_TRACE_ROWS == MAX_REQUESTS == 2_000_000
    monkeypatch.setattr(workload, "MAX_TRACE_ROWS", 1000)
    (tmp_path / "x.csv").write_text("".join(f"{i / 100},1,1\n" for i in range(1001)))
    f = tmp_path / "s.yaml"
    f.write_text("duration: 30s\nclasses:\n  - name: r\n    trace: {file: x.csv}\n")
    with pytest.raises(ScenarioError, match=r"x\.csv: more than 1,000 requests"):
        load_scenario(str(f))
    (tmp_path / "x.csv").write_text("".join(f"{i / 100},1,1\n" for i in range(1000)))
    load_scenario(str(f))


def test_trace_files_gzip_or_not_whatever_their_name(tmp_path):
    rows = "0,100,50\n1.5,120.0,60\n"
    (tmp_path / "plain.gz").write_text(rows)
    (tmp_path / "zipped.csv").write_bytes(gzip.compress(rows.encode()))
    (tmp_path / "broken.csv.gz").write_bytes(gzip.compress(rows.encode())[:12])
    for name in ("plain.gz", "zipped.csv"):
        f = tmp_path / f"{name}.scenario"  # any suffix: a file is a file
        f.write_text(f"duration: 30s\nclasses:\n  - name: r\n    trace: {{file: {name}, "
                     "split: {1: 1.0}}\n")
        assert len(generate(load_scenario(str(f)), 1.0, 1)) == 2
    f.write_text(f.read_text().replace("zipped.csv", "broken.csv.gz"))
    with pytest.raises(ScenarioError, match="cannot read it as a CSV"):
        load_scenario(str(f))


def test_trace_split_and_tenants_must_agree_with_the_policy():
    trace = "  - name: r\n    trace: {file: azure-conv, %s}\n"
    assert "classes[1].trace.split: no priorities" in error_of(BASE + trace % "split: {}")
    assert "classes[1].trace.tenants: priority 2 gets no requests from split (0)" in error_of(
        BASE + trace % "split: {0: 1.0}, tenants: {2: batch}")
    assert "classes[1].trace.tenants: priority 2 gets no requests" in error_of(
        BASE + trace % "split: {0: 1.0, 2: 0}, tenants: {2: batch}")
    assert "classes[1].trace.start: the trace ends" in error_of(BASE + trace % "start: 100h")
    # found by a fuzzing review: a key that is not a priority was a traceback; weights that
    # overflow, or a tenant named twice, skewed the split silently
    assert error_of(BASE + trace % "split: {[0]: 1}").endswith(
        "classes[1].trace.split: expected a priority as each key, got a list")
    assert "classes[1].trace.tenants.0.a: must be > 0 and <= 1000000" in error_of(
        BASE + trace % "split: {0: 1.0}, tenants: {0: {a: 1.0e+308, b: 1.0e+308}}")
    for twice in ("{a: 1, b: 1, a: 1}", "[a, a]"):
        assert error_of(BASE + trace % f"split: {{0: 1.0}}, tenants: {{0: {twice}}}").endswith(
            "classes[1].trace.tenants.0: tenant 'a' given twice")
    two = BASE.replace("classes:\n", "policy:\n  queues:\n" + "".join(
        f"    - {{priority: {p}, name: q{p}, maxQueueSize: 9, timeout: 8s, dropPolicy: tail}}\n"
        for p in (0, 3)) + "classes:\n")
    assert "classes[1].trace.split: missing: the default split" in error_of(
        two + trace % "speed: 1")


def test_an_event_for_several_backends():
    sc = parse_scenario(BASE + "events:\n  - {at: 5s, backend: [0, 1], slowdown: 3}\n", "t.yaml")
    assert [(e.backend, e.slowdown) for e in sc.events] == [(0, 3.0), (1, 3.0)]


def test_unknown_priority_and_profile():
    msg = error_of(BASE.replace("priority: 0", "priority: 5").replace("small", "huge"))
    lines = msg.splitlines()
    assert lines[0] == ("t.yaml:3: backends.profile: unknown engine profile 'huge'; known: "
                        "llama3-8b-h100, small, medium, tiny")
    assert lines[1] == ("t.yaml:6: classes[0].priority: unknown priority 5; the policy's classes "
                        "are 0, 1, 2")


def test_every_problem_is_reported_at_once():
    text = BASE.replace("rate: 1.0", "rate: fast") + "    retry: {mode: sometimes}\n"
    lines = error_of(text).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("t.yaml:7: classes[0].rate: expected a number")
    assert lines[1].startswith("t.yaml:8: classes[0].retry.mode: unknown retry mode")


def test_inline_policy_errors_name_the_scenario_line():
    text = BASE + "policy:\n  queues:\n    - {priority: 0, name: p0, timeout: 8q}\n"
    assert "t.yaml:10: policy.queues[0].timeout: bad duration '8q'" in error_of(text)


def test_an_inline_policy_reads_anchors_from_the_whole_file_and_refuses_a_secrets_file():
    """Found by a fuzzing review: the inline policy was read again from its own text, so an
    anchor defined under an `x-` key (the docs' place for them) was undefined; a secretsFile
    in it was ignored (the simulator sends no keys)."""
    queues = ("x-q: &q\n"
              "  - {priority: 0, name: p0, maxQueueSize: 9, timeout: 8s, dropPolicy: tail}\n")
    sc = parse_scenario(queues + BASE + "policy: {queues: *q}\n", "t.yaml")
    assert sc.policy is not None and [q.name for q in sc.policy.queues] == ["p0"]
    assert error_of(BASE + "policy:\n  secretsFile: keys.yaml\n  queues: []\n").startswith(
        "t.yaml:9: policy.secretsFile: the simulator sends no API keys")


def test_a_trace_split_must_add_up_and_name_known_priorities():
    text = BASE + "  - name: r\n    trace: {file: azure-conv, split: {0: 0.5, 7: 0.2}}\n"
    msg = error_of(text)
    assert msg.splitlines() == [
        "t.yaml:9: classes[1].trace.split.7: unknown priority 7; the policy's classes are 0, "
        "1, 2",
        "t.yaml:9: classes[1].trace.split: shares must add up to 1, got 0.5"]


def test_cli_prints_one_line_per_error_and_exits_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BASE + "    maxToken: 300\nevents:\n  - {at: 1s, backend: all, leave: true}\n")
    out = subprocess.run([sys.executable, "-m", "llmvalve.cli", "simulate", "--scenario",
                          str(f)], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith(f"llmvalve simulate: {f}:8: classes[0].maxToken: unknown key")
    assert lines[1].startswith(f"llmvalve simulate: {f}:10: events[0].backend:")
    assert "Traceback" not in out.stderr


def test_relative_trace_path_resolves_against_the_scenario_folder(tmp_path, monkeypatch):
    folder = tmp_path / "scenarios"
    (folder / "traces").mkdir(parents=True)
    rows = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{i * 0.5},{100 + i},{20 + i}\n" for i in range(40))
    (folder / "traces" / "mine.csv.gz").write_bytes(gzip.compress(rows.encode()))
    f = folder / "replay.yaml"
    f.write_text("duration: 30s\nclasses:\n  - name: r\n    trace:\n"
                 "      file: traces/mine.csv.gz\n      split: {1: 1.0}\n"
                 "      tenants: {1: [a, b, c]}\n")
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    sc = load_scenario(str(f))
    jobs = generate(sc, 1.0, 1)
    assert len(jobs) == 40 and {j.priority for j in jobs} == {1}
    # the class is split among its three tenants
    counts = {t: sum(j.tenant == t for j in jobs) for t in ("a", "b", "c")}
    assert all(c >= 5 for c in counts.values()), counts
    (folder / "traces" / "mine.csv.gz").unlink()
    with pytest.raises(ScenarioError, match=r"replay.yaml:5: classes\[0\].trace.file: no trace"):
        load_scenario(str(f))


def test_weighted_tenant_split():
    text = BASE + ("  - name: r\n    trace: {file: azure-conv, split: {2: 1.0}, "
                   "tenants: {2: {big: 3, small: 1}}}\n")
    sc = parse_scenario(text, "t.yaml")
    jobs = [j for j in generate(sc, 1.0, 1) if j.cls.name == "r"]
    big = sum(j.tenant == "big" for j in jobs) / len(jobs)
    assert 0.7 <= big <= 0.8, big


def test_ramp_rises_linearly():
    text = BASE.replace("rate: 1.0", "rate: {ramp: [[0s, 0], [60s, 20]]}")
    sc = parse_scenario(text, "t.yaml")
    assert sc.classes[0].ramp
    jobs = generate(sc, 1.0, 1)
    first = sum(j.arrival_s < 30 for j in jobs)
    second = len(jobs) - first
    # expected 150 and 450 arrivals: the second half carries three times the first
    assert 120 <= first <= 180 and 400 <= second <= 500, (first, second)


def test_a_class_deadline_is_sent_on_each_attempt_and_kept():
    """`deadline:` is the client's: it sends the time left in the policy's deadline header
    and leaves when it passes (or at an earlier random cancel)."""
    sc = parse_scenario(BASE + "    deadline: 2.5s\n"
                        "    cancel: {prob: 0.5, after: [0.5s, 5s]}\n", "t.yaml")
    policy = default_policy()
    jobs = generate(sc, 1.0, 1)
    assert all(j.deadline_at_s == j.arrival_s + 2.5 for j in jobs)
    assert all(j.cancel_at_s is not None and j.cancel_at_s <= j.arrival_s + 2.5 for j in jobs)
    assert any(j.cancel_at_s < j.arrival_s + 2.5 for j in jobs)  # some leave earlier
    job = jobs[0]
    first = check_of(job, "c1", policy, True, job.arrival_s)
    retry = check_of(job, "c2", policy, True, job.arrival_s + 1.2)
    assert first.headers["x-llmvalve-deadline-ms"] == "2500"
    assert retry.headers["x-llmvalve-deadline-ms"] == "1300"
    without = generate(parse_scenario(BASE, "t.yaml"), 1.0, 1)[0]
    assert without.deadline_at_s is None and without.cancel_at_s is None
    assert "x-llmvalve-deadline-ms" not in check_of(without, "c3", policy, True, 0.0).headers
    assert "deadline" in error_of(BASE + "    deadline: soon\n")


def test_a_retrying_client_says_how_many_attempts_came_before():
    """Clients that back off over the server's Retry-After (`jitter`, as the OpenAI and
    Anthropic SDKs do) send each retry's count in the policy's retry-count header, as those
    SDKs do; clients that send again at once (`immediate`, a loop of the caller's) do not,
    and `countHeader` says otherwise for either."""
    policy = default_policy()

    def sent(retry: str, attempt: int) -> str | None:
        job = generate(parse_scenario(BASE + f"    retry: {retry}\n", "t.yaml"), 1.0, 1)[0]
        return check_of(job, "c", policy, True, 0.0, attempt).headers.get(
            "x-stainless-retry-count")

    assert [sent("{mode: jitter}", n) for n in (0, 2)] == ["0", "2"]
    assert sent("{mode: immediate}", 1) is None
    assert sent("{mode: jitter, countHeader: false}", 1) is None
    assert sent("{mode: immediate, countHeader: true}", 1) == "1"
    assert sent("{mode: none}", 0) is None
    assert "retries nothing" in error_of(BASE + "    retry: {countHeader: true}\n")
    # a class built in code, as the load generator's tests build them, defaults alike
    assert RetrySpec("jitter").sends_count and not RetrySpec("immediate").sends_count


def test_ramp_times_must_not_go_back():
    text = BASE.replace("rate: 1.0", "rate: {ramp: [[10s, 1], [5s, 2]]}")
    assert "classes[0].rate.ramp[1]: times must increase" in error_of(text)


def test_on_off_bursts_switch_together_and_vary_by_seed():
    on_off = "rate: {onOff: {onRate: 10, onFor: [10s, 20s], offFor: [5s, 5s]}}"
    text = BASE.replace("rate: 1.0", on_off) + f"  - name: other\n    priority: 1\n    {on_off}\n"
    sc = parse_scenario(text, "t.yaml")
    a = on_off_schedule(sc.classes[0], 60, 1)
    assert a == on_off_schedule(sc.classes[1], 60, 1)
    assert a != on_off_schedule(sc.classes[0], 60, 2)
    assert a[0] == (0.0, 10.0) and a[1][1] == 0.0 and 10 <= a[1][0] <= 20
    jobs = generate(sc, 1.0, 1)
    off_start, off_end = a[1][0], a[2][0]
    assert not [j for j in jobs if off_start < j.arrival_s < off_end]


def test_on_off_yaml_booleans_are_caught():
    # `on:` would be YAML 1.1's true: the keys are onRate/offRate
    text = BASE.replace("rate: 1.0", "rate: {onOff: {on: 10, onFor: 5s, offFor: 5s}}")
    assert "keys must be strings, got true/false" in error_of(text)


def test_backend_overrides_bind_the_sequence_cap():
    text = BASE.replace("profile: small}", "profile: medium, maxNumSeqs: 16}")
    sc = parse_scenario(text, "t.yaml")
    assert sc.engine_profile().max_num_seqs == 16
    assert sc.engine_profile().num_gpu_blocks == 4096


def test_engines_run_by_priority_get_the_class_priority_from_the_default_policy():
    text = BASE.replace("profile: small}", "profile: small, schedulingPolicy: priority}")
    sc = parse_scenario(text, "t.yaml")
    assert sc.engine_profile().scheduling_policy == "priority"
    assert sc.policy is not None and sc.policy.pools[0].engine_priority
    assert parse_scenario(BASE, "t.yaml").policy is None  # first come first served: as before
    named = parse_scenario(text + "policy:\n  queues:\n    - {priority: 0, name: p0, "
                           "maxQueueSize: 10, timeout: 8s, dropPolicy: tail}\n", "t.yaml")
    assert named.policy is not None and not named.policy.pools[0].engine_priority  # as written
    bad = BASE.replace("profile: small}", "profile: small, schedulingPolicy: lifo}")
    assert error_of(bad) == ("t.yaml:3: backends.schedulingPolicy: unknown scheduling policy "
                             "'lifo'; allowed: fcfs, priority")


def test_every_builtin_parses_and_says_what_it_is_judged_on():
    from llmvalve.sim.scenario import builtin_names

    for name in builtin_names():
        sc = load_scenario(name)
        assert sc.description, name
        assert set(sc.extra) <= {"doNoHarm", "p0WithinShare"}, name


def test_a_missing_file_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "llmvalve.cli", "simulate", "--scenario",
                          str(Path("/nonexistent/x.yaml"))], capture_output=True, text=True)
    assert out.returncode == 2 and "no scenario" in out.stderr


def test_a_policy_file_that_is_not_text_is_one_line_naming_the_scenarios_line(tmp_path):
    """Found by a fuzzing review: it exited 2 with the decoder's message alone."""
    (tmp_path / "p.yaml").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "s.yaml").write_text(BASE + "policy: p.yaml\n")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(str(tmp_path / "s.yaml"))
    assert str(exc.value).startswith(f"{tmp_path / 's.yaml'}:8: policy: policy ")
    assert "can't decode byte 0xff" in str(exc.value)


def test_a_policy_of_several_pools_needs_each_pools_backends(tmp_path):
    """Found by a fuzzing review: `backends:` went to the first of a named policy's pools, and
    requests for another pool's model ran on them, reported as that pool's."""
    from importlib import resources

    packaged = resources.files("llmvalve").joinpath("data/default-policy.yaml").read_text()
    (tmp_path / "p.yaml").write_text(packaged)
    (tmp_path / "s.yaml").write_text(BASE + "policy: p.yaml\n")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(str(tmp_path / "s.yaml"))
    assert ": pools: the policy has 2 pools (main, small): give each its backends" in str(
        exc.value)


@pytest.mark.parametrize("key, line", [("name", 5), ("tenant", 8), ("model", 8)])
def test_names_sent_in_requests_are_printable(key, line):
    """Found by a fuzzing review: a newline or an escape in a tenant's name was taken; `bench`
    sends it in the API key's header."""
    text = error_of(BASE.replace("name: chat", 'name: "a\\nb"') if key == "name" else
                    BASE.replace("rate: 1.0", f'rate: 1.0\n    {key}: "a\\nb"'))
    assert text == (f"t.yaml:{line}: classes[0].{key}: 'a\\nb' has a character that is not "
                    "printable (it is sent in a request by `bench` and `load`)")
    trace = "  - name: r\n    trace: {file: azure-conv, split: {0: 1.0}, tenants: {0: \"a\\eb\"}}\n"
    assert "classes[1].trace.tenants.0: 'a\\x1bb' has a character" in error_of(BASE + trace)


def test_an_empty_model_is_one_error_and_a_folder_is_named_so(tmp_path):
    """Found by a fuzzing review: `model: ''` was reported twice, and a folder given as the
    scenario was "no such file"."""
    text = error_of(BASE.replace("rate: 1.0", "rate: 1.0\n    model: ''"))
    assert text == "t.yaml:8: classes[0].model: must not be empty"
    two_pools = ("name: t\nduration: 60s\npools:\n"
                 "  - {name: a, models: [m1], backends: {count: 1, profile: small}}\n"
                 "  - {name: b, models: [m2], backends: {count: 1, profile: small}}\n"
                 "classes:\n  - {name: chat, priority: 0, rate: 1.0, model: 123}\n")
    text = error_of(two_pools)
    assert text.startswith("t.yaml:7: classes[0].model: expected a string")
    assert "\n" not in text  # and not "no pool serves model '123'" too
    with pytest.raises(ScenarioError, match="a folder, not a scenario file"):
        load_scenario(str(tmp_path))


def test_a_scenarios_scrapes_are_its_policys_and_stale_after_follows_them():
    """A scenario scraped every 5 s ran a policy whose readings were stale after 2 s: every
    engine read saturated three seconds in five, and adaptive held the lower classes back at
    0.6x load (holdout-b48-calm-stale-signals-medium3-gw2: P1 0.91-0.94 against `none`'s 1.0).
    A policy that leaves staleAfter out has it follow the scrapes (twice the interval, as the
    loader settles it: core/policy/limiter.py); one that gives it too short is an error."""
    from llmvalve.sim.runner import scenario_policy

    sc = parse_scenario(BASE + "metrics: {scrapeInterval: 5s}\n", "t.yaml")
    policy = scenario_policy(sc)
    assert {p.scrape_interval_s for p in policy.pools} == {5.0}
    assert policy.limiter.adaptive.stale_after_s == 10.0
    assert scenario_policy(parse_scenario(BASE, "t.yaml")) == default_policy()
    inline = ("policy:\n  queues: [{priority: 0, name: p0, maxQueueSize: 9, timeout: 8s,"
              " dropPolicy: tail}]\n  limiter: {adaptive: {staleAfter: 3s}}\n")
    msg = error_of(BASE + "metrics: {scrapeInterval: 5s}\n" + inline)
    assert msg.startswith("t.yaml:8: metrics.scrapeInterval: the policy's "
                          "limiter.adaptive.staleAfter 3s must be above"), msg
