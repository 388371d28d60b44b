"""Endpoint picking (core/picker.py): least in-flight cost, ties in turn, failing/stale and
saturated backends skipped while others exist."""

from __future__ import annotations

from llmvalve.core.picker import EJECT_AFTER, Picker


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


def test_balance_counts_requests_as_well_as_cost():
    """An engine whose sequence cap binds fills up in requests, whatever they cost: cheap
    requests on one backend count against it too."""
    p = Picker(("a", "b"))
    for _ in range(6):
        p.add("a", 100.0)  # six cheap ones
    p.add("b", 900.0)  # one dear one: b has more cost, a far more requests
    assert p.pick(0.0) == "b"  # 900/1500 + 1/7 < 600/1500 + 6/7


def test_saturation_is_corrected_by_what_ended_since_the_scrape():
    p = Picker(("a", "b"), kv_target=0.8)
    p.observe("a", ok=True, at=0.0, waiting=2.0)
    p.add("b", 500.0)
    assert p.pick(0.0) == "b"  # a queues two requests
    p.add("a", 100.0)
    for _ in range(3):  # three of a's requests end: its engine took the two waiting ones
        p.remove("a", 100.0)
    assert not p.saturated("a")
    assert p.pick(0.1) == "a"


def test_top_class_goes_where_it_starts_soonest():
    p = Picker(("a", "b", "c"), kv_target=0.8, late_after_s=2.0)  # room_s = 1 s
    p.prefill_s_per_token = 0.001  # 1 ms per prompt token
    p.observe("a", ok=True, at=0.0, kv_usage=0.2, capacity_tokens=10_000.0)
    p.observe("b", ok=True, at=0.0, kv_usage=0.1, waiting=1.0, capacity_tokens=10_000.0)
    p.observe("c", ok=True, at=0.0, kv_usage=0.5, capacity_tokens=10_000.0)
    p.add("a", 2_500.0, prompt_tokens=2_000, now=0.0)  # a prefills for 2 s from now
    assert p.pick(0.5, first=True) == "c"  # b queues; a has 1.5 s of prompts ahead
    assert p.pick(2.5, first=True) == "a"  # backlog done; KV 0.2 + 2,500 sent since < 0.5
    assert p.prefill_room(0.5)  # c (and b) have no prompts ahead
    p.add("c", 2_000.0, prompt_tokens=1_500, now=0.5)
    p.add("b", 2_000.0, prompt_tokens=1_500, now=0.5)
    assert not p.prefill_room(0.5)  # every engine has more than 1 s of prompts ahead
    assert p.prefill_room(1.5)


def test_an_engine_running_its_sequence_cap_counts_as_queueing():
    """Found on holdout-b44-seqcap-longanswer-medium3-uneq: engines capped at 12 sequences
    whose scrapes show none waiting. The one running 12 of 12 (or whose waiting request took
    the sequence that ended since) would make a P0 request wait for its next; it went there
    over one with a sequence free, TTFT 2-6 s."""
    p = Picker(("a", "b"), kv_target=0.8)
    p.observe("a", ok=True, at=0.0, kv_usage=0.1, running=12.0, seq_cap=12.0,
              capacity_tokens=10_000.0)
    p.observe("b", ok=True, at=0.0, kv_usage=0.3, running=11.0, seq_cap=12.0,
              capacity_tokens=10_000.0)
    assert p.pick(0.1, first=True) == "b"  # a has the more free KV, but no sequence free
    assert p.saturated("a") and not p.saturated("b")
    p.add("b", 100.0)  # b's last sequence taken
    p.remove("a", 100.0)  # one of a's ended: a sequence free there
    assert p.pick(0.2, first=True) == "a"
    p.observe("a", ok=True, at=0.5, kv_usage=0.1, running=12.0, waiting=1.0, seq_cap=12.0,
              capacity_tokens=10_000.0)
    p.remove("a", 100.0)  # an end: its waiting request takes that sequence, none is free
    assert p.saturated("a")
    # Where no cap was seen binding, running as many says nothing (KV decides)
    p.observe("a", ok=True, at=1.0, kv_usage=0.1, running=12.0, capacity_tokens=10_000.0)
    assert not p.saturated("a")


def test_one_of_several_replicas_counts_its_prompts_for_the_whole_fleet():
    """A replica sees only the prompts it sends; the other replicas, balanced alike, send as
    many. One of three counts each of its prompts three times on the backlog clock: 2,000
    and 1,000 tokens sent put 6 s and 3 s of prompts ahead, not 2 s and 1 s, past the lower
    classes' room (2.5 s) on both engines (three replicas on four small engines: P0 prompts
    landed behind the other replicas' 2,000-token prompts)."""
    for share, room in ((1.0, True), (1 / 3, False)):
        p = Picker(("a", "b"), kv_target=0.8, late_after_s=5.0, replica_share=share)
        p.prefill_s_per_token = 0.001
        p.add("a", 2_100.0, prompt_tokens=2_000, now=0.0)
        p.add("b", 1_100.0, prompt_tokens=1_000, now=0.0)
        assert p.prefill_done_at["a"] == 2.0 / share
        assert p.prefill_room(0.0) == room


def test_lower_classes_go_where_prompts_are_not_already_piled_up():
    """One request waiting on b (its last scrape) must not send every lower-class request of
    the next scrape interval to a: once a has more than `room_s` of prompts ahead by the
    backlog clock it is as full as b, and the load share decides again (rag-h100: 18 prompts
    of 5,000 tokens went to one H100 engine in half a second)."""
    p = Picker(("a", "b"), kv_target=0.8, late_after_s=1.0)  # room_s = 0.5 s
    p.prefill_s_per_token = 0.0001  # 5,000 tokens: 0.5 s
    p.observe("a", ok=True, at=0.0, kv_usage=0.3, capacity_tokens=400_000.0)
    p.observe("b", ok=True, at=0.0, kv_usage=0.3, waiting=1.0, capacity_tokens=400_000.0)
    sent = []
    for _ in range(6):
        b = p.pick(0.1)
        sent.append(b)
        p.add(b, 5_250.0, prompt_tokens=5_000, now=0.1)
    assert sent[:2] == ["a", "a"]  # b queues a request; a has room until 0.5 s of prompts
    assert sent.count("b") == 3  # then both are full: balanced (not six to a, 3 s of prefill)


def test_top_class_goes_where_its_kv_fits_before_where_it_starts_soonest():
    """An engine whose KV the request would overflow is not where it starts soonest: it waits
    there for blocks to free, or is the first preempted (vLLM preempts the newest request).
    Long-context work on four medium engines: 10,000-token P0 prompts sent to an engine at
    KV 0.92 by its scrape, a tenth of a second of prompts sooner than one at 0.45, waited up to
    10 s for their first token (holdout-longctx16k)."""
    p = Picker(("a", "b"), kv_target=0.8, late_after_s=2.0)
    p.prefill_s_per_token = 0.001
    p.observe("a", ok=True, at=0.0, kv_usage=0.85, capacity_tokens=10_000.0)
    p.observe("b", ok=True, at=0.0, kv_usage=0.3, capacity_tokens=10_000.0)
    p.add("b", 600.0, prompt_tokens=500, now=0.0)  # half a second of prompts ahead on b
    assert p.pick(0.1, first=True, cost_tokens=1_000.0) == "a"  # 0.95: it fits, starts first
    assert p.pick(0.1, first=True, cost_tokens=2_000.0) == "b"  # 1.05: it would not fit on a
    p.add("a", 1_000.0, prompt_tokens=900, now=0.1)  # sent since a's scrape: 0.95 now
    assert p.pick(0.1, first=True, cost_tokens=1_000.0) == "b"


def test_top_class_avoids_an_engine_decoding_slower_than_its_tpot_allows():
    p = Picker(("a", "b"), kv_target=0.8, itl_target_s=0.12, late_after_s=1.0)
    p.prefill_s_per_token = 0.001
    p.observe("a", ok=True, at=0.0, kv_usage=0.1, itl_s=0.2, capacity_tokens=10_000.0)  # slowed
    p.observe("b", ok=True, at=0.0, kv_usage=0.5, itl_s=0.05, capacity_tokens=10_000.0)
    p.add("b", 500.0, prompt_tokens=500, now=0.0)  # half a second of prompts ahead on b
    assert p.pick(0.0, first=True) == "b"  # a would start sooner but decode every token late
    p.add("b", 2_000.0, prompt_tokens=1_000, now=0.0)  # 1.5 s ahead: later than allowed
    assert p.pick(0.0, first=True) == "a"  # starting in time beats decoding fast
    p.observe("a", ok=True, at=1.0, kv_usage=0.1, itl_s=0.06, capacity_tokens=10_000.0)
    assert p.pick(1.0, first=True) == "a"  # recovered


def test_an_engine_decoding_the_top_class_too_slowly_gets_no_new_prompts():
    p = Picker(("a", "b"), kv_target=0.8, itl_target_s=0.12)
    p.add("a", 100.0, top=True)  # a P0 request decodes on a
    p.add("b", 300.0)
    p.observe("a", ok=True, at=0.0, itl_s=0.2)  # slower than the P0 TPOT allows
    p.observe("b", ok=True, at=0.0, itl_s=0.2)
    assert p.pick(0.0) == "b"  # b is as slow but has no P0 on it
    p.remove("a", 100.0, top=True)
    assert p.pick(0.0) == "a"


def test_failures_in_a_row_take_a_backend_out_until_a_good_scrape():
    p = Picker(("a", "b"))
    for t in (0.0,):
        p.observe("a", True, t)
        p.observe("b", True, t)
    p.add("a", 1000.0)  # a carries more: b is picked while both are healthy
    assert p.pick(0.1) == "b"
    for _ in range(EJECT_AFTER - 1):
        p.remove("b", 0.0, failed=True)
    p.remove("b", 0.0)  # a success in between: the count starts again
    for _ in range(EJECT_AFTER - 1):
        p.remove("b", 0.0, failed=True)
    assert p.pick(0.2) == "b"
    p.remove("b", 0.0, failed=True)
    assert p.pick(0.3) == "a"
    p.observe("b", True, 0.5)
    assert p.pick(0.6) == "b"


def test_a_top_class_request_can_start_where_a_fresh_scrape_shows_room():
    """KV below the target with the request in it, nothing queued, a good recent scrape."""
    p = Picker(("a", "b"), stale_after_s=2.0, kv_target=0.8)
    p.observe("a", ok=True, at=0.0, kv_usage=0.75, capacity_tokens=10_000.0)
    p.observe("b", ok=True, at=0.0, kv_usage=0.5, waiting=2.0, capacity_tokens=10_000.0)
    assert not p.can_start(0.1, 1_000.0)  # a: 0.85 > 0.8; b: requests waiting
    assert p.can_start(0.1, 400.0)  # a: 0.79
    p.add("a", 400.0, now=0.1)
    assert not p.can_start(0.1, 400.0)  # what was sent since the scrape counts: 0.83
    assert not p.can_start(3.0, 100.0)  # stale: its numbers are old


def test_lower_classes_wait_rather_than_fill_the_engines_at_their_kv_target():
    """One large engine busy prefilling and small ones with prefill room but at their KV
    target: a lower-class request waits at the gateway rather than queue or preempt on a
    small one (holdout-p0-near-share-hetero: the small engines sat at KV 0.9-1.0 while the
    large one held 0.3-0.6, and P0 requests placed on them waited 2-9 s). When every engine
    is at its KV target the limit decides, not the picker."""
    p = Picker(("big", "small"), kv_target=0.8, late_after_s=1.0)  # room_s = 0.5 s
    p.prefill_s_per_token = 0.001
    p.observe("big", ok=True, at=0.0, kv_usage=0.4, capacity_tokens=200_000.0)
    p.observe("small", ok=True, at=0.0, kv_usage=0.9, capacity_tokens=30_000.0)
    p.add("big", 1_100.0, prompt_tokens=1_000, now=0.0)  # 1 s of prompts ahead of it
    assert not p.prefill_room(0.1)
    assert p.prefill_room(0.6)  # big has room again
    p.observe("small", ok=True, at=0.2, kv_usage=0.5, capacity_tokens=30_000.0)
    assert p.prefill_room(0.2)  # small has KV room again
    for b in ("big", "small"):
        p.observe(b, ok=True, at=0.3, kv_usage=0.85, capacity_tokens=30_000.0)
    p.add("big", 1_100.0, prompt_tokens=1_000, now=0.3)
    assert p.prefill_room(0.3)  # both at the target: small has prefill room, the limit decides


def test_top_class_stays_off_a_backend_that_keeps_dropping_out():
    """A backend back from failing twice within five minutes is flapping: a P0 request decoding
    there when it drops again is lost (one of four engines leaving five times, holdout-flap).
    Once back is a restart (a rolling upgrade restarts every engine once): not marked."""
    p = Picker(("a", "b"), kv_target=0.8, late_after_s=2.0)
    p.prefill_s_per_token = 0.001

    def scrape(at: float, a_ok: bool = True) -> None:
        p.observe("a", ok=a_ok, at=at, kv_usage=0.1, capacity_tokens=10_000.0)
        p.observe("b", ok=True, at=at, kv_usage=0.5, capacity_tokens=10_000.0)

    scrape(0.0, a_ok=False)
    scrape(10.0)  # back once
    assert p.pick(10.0, first=True, cost_tokens=100.0) == "a"  # the most free KV
    scrape(20.0, a_ok=False)
    scrape(30.0)  # back twice: flapping
    assert p.pick(30.0, first=True, cost_tokens=100.0) == "b"
    assert {p.pick(30.0) for _ in range(4)} == {"a", "b"}  # the lower classes still use it
    p.add("b", 100.0, prompt_tokens=3_000, now=30.0)  # b would start P0 3 s late: a it is
    assert p.pick(30.0, first=True, cost_tokens=100.0) == "a"
    scrape(311.0)  # the first return is over five minutes old
    assert p.pick(311.0, first=True, cost_tokens=100.0) == "a"


def test_lower_classes_are_balanced_by_each_engines_share_of_the_kv():
    """An engine with a quarter of its neighbour's KV takes a quarter of its load: equal
    shares filled a KV-cut engine to preemption while the full one idled."""
    p = Picker(("big", "small"), kv_target=0.8)
    p.observe("big", ok=True, at=0.0, capacity_tokens=64_000.0)
    p.observe("small", ok=True, at=0.0, capacity_tokens=16_000.0)
    picks = []
    for _ in range(10):
        b = p.pick(0.0, cost_tokens=1_000.0)
        p.add(b, 1_000.0)
        picks.append(b)
    assert picks.count("big") == 8 and picks.count("small") == 2
