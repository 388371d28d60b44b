"""Endpoint picking (core/picker.py): least in-flight cost, ties in turn, failing/stale and
saturated backends skipped while others exist."""

from __future__ import annotations

from llmvalve.core.picker import Picker


def test_no_known_backend_lets_envoy_decide():
    assert Picker().pick(0.0) == ""


def test_least_inflight_cost_wins():
    p = Picker(("a", "b", "c"))
    p.add("a", 100.0)
    p.add("b", 50.0)
    assert p.pick(0.0) == "c"
    p.add("c", 200.0)
    assert p.pick(0.0) == "b"
    p.remove("a", 80.0)
    assert p.pick(0.0) == "a"  # 20 < 50


def test_ties_are_broken_in_turn():
    p = Picker(("a", "b", "c"))
    assert [p.pick(0.0) for _ in range(6)] == ["b", "c", "a", "b", "c", "a"]


def test_failing_backend_is_skipped_until_a_good_scrape():
    p = Picker(("a", "b"))
    p.add("b", 1_000.0)
    p.observe("a", ok=False, at=1.0)
    assert [p.pick(1.0) for _ in range(3)] == ["b", "b", "b"]
    assert not p.healthy("a", 1.0)
    p.observe("a", ok=True, at=2.0)
    assert p.pick(2.0) == "a"


def test_stale_backend_is_skipped():
    p = Picker(("a", "b"), stale_after_s=2.0)
    p.observe("a", ok=True, at=0.0)
    p.observe("b", ok=True, at=1.5)
    p.add("b", 1_000.0)
    assert p.pick(2.0) == "a"  # 2.0 s old: still fresh
    assert p.pick(2.5) == "b"  # 2.5 s old: stale


def test_never_scraped_backend_counts_as_healthy():
    p = Picker(("a",))
    assert p.healthy("a", 100.0)


def test_all_unhealthy_falls_back_to_least_cost():
    p = Picker(("a", "b"))
    p.observe("a", ok=False, at=0.0)
    p.observe("b", ok=False, at=0.0)
    p.add("a", 10.0)
    assert p.pick(0.0) == "b"


def test_saturated_backend_is_skipped_when_another_is_not():
    p = Picker(("a", "b", "c"), kv_target=0.8)
    p.observe("a", ok=True, at=0.0, kv_usage=0.8)  # at the KV target
    p.observe("b", ok=True, at=0.0, waiting=1.0)  # requests waiting in the engine
    p.observe("c", ok=True, at=0.0, kv_usage=0.79)
    p.add("c", 5_000.0)
    assert [p.pick(0.0) for _ in range(3)] == ["c", "c", "c"]
    p.observe("c", ok=True, at=0.1, kv_usage=0.9)  # all saturated: least cost again
    p.add("a", 10.0)
    assert p.pick(0.1) == "b"


def test_backends_are_learnt_from_scrapes_when_the_spec_lists_none():
    p = Picker()
    p.observe("x", ok=True, at=0.0)
    assert p.pick(0.0) == "x"


def test_add_and_remove_keep_cost_non_negative_and_ignore_unknowns():
    p = Picker(("a",))
    p.add("", 100.0)  # "" is Envoy's choice: not accounted
    p.remove("zzz", 10.0)
    p.add("a", 10.0)
    p.remove("a", 25.0)
    assert p.cost == {"a": 0.0}
