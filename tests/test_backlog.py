"""The backlog clock closes its loop on first tokens (core/backlog.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmvalve.core.backlog import HORIZON_S, BacklogClock
from llmvalve.core.picker import Picker


def replay(sends: list[tuple[float, float]], sent_at: float, first_at: float) -> float:
    """When the prompts sent at or after `sent_at` are prefilled, started at `first_at`."""
    done = first_at
    for s, work in sends:
        if s >= sent_at:
            done = max(done, s) + work
    return done


def test_a_clock_running_slow_is_pulled_back_by_a_first_token():
    """Ten prompts a second apart, each charged 2 s by a speed twice too slow: open loop the
    clock says 20 s of prompts are ahead at t = 9 and grows by a second every second. The first
    token of the prompt sent at 8, at 8.1, says everything before it was prefilled then: what is
    left is at most the prompts sent at 8 and 9, replayed from 8.1."""
    clock = BacklogClock()
    for t in range(10):
        clock.add(float(t), 2.0)
    assert clock.done_at == 20.0
    clock.prefilled(8.0, 8.1)
    assert clock.done_at == 12.1
    clock.prefilled(3.0, 3.5)  # an older, looser bound changes nothing
    assert clock.done_at == 12.1
    assert clock.add(9.5, 2.0) == 14.1  # and the clock runs on from there


def test_a_first_token_never_moves_the_clock_later():
    """A clock that runs fast (the speed too quick) already says less than the replay."""
    clock = BacklogClock()
    for t in range(5):
        clock.add(float(t), 0.1)
    clock.prefilled(2.0, 3.9)  # a slow first token: the replay says 4.2
    assert clock.done_at == 4.1


def test_prompts_sent_at_the_same_instant_stay_ahead():
    """A batch dispatched together is prefilled in any order: the first of them answered does
    not say the others are done."""
    clock = BacklogClock()
    for _ in range(5):
        clock.add(1.0, 1.0)
    clock.prefilled(1.0, 1.5)
    assert clock.done_at == 6.0  # 1.5 + five prompts of 1 s, not 1.5 + 0


def test_what_was_forgotten_says_nothing():
    clock = BacklogClock()
    clock.add(0.0, 1.0)
    clock.add(3 * HORIZON_S, 1.0)  # the first send is forgotten
    clock.prefilled(1.0, 2.0)  # sent after the first, before the second: not remembered
    assert clock.done_at == 3 * HORIZON_S + 1.0


@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 3.0)), min_size=1,
                max_size=40),
       st.data())
def test_the_correction_is_the_replay(steps, data):
    """For any sends, a first token leaves the clock at the lesser of the open-loop clock and
    the replay of the prompts sent since the answered one (the bisection over the stack of
    suffix maxima is the replay)."""
    clock, sends, now = BacklogClock(), [], 0.0
    for gap, work in steps:
        now += gap
        clock.add(now, work)
        sends.append((now, work))
    sent_at = data.draw(st.sampled_from([s for s, _ in sends]))
    first_at = sent_at + data.draw(st.floats(0.0, 10.0))
    before = clock.done_at
    clock.prefilled(sent_at, first_at)
    assert abs(clock.done_at - min(before, replay(sends, sent_at, first_at))) < 1e-9


def test_the_picker_frees_prefill_room_when_first_tokens_say_so():
    """One H100 at 0.7x load, short prompts: a prefill speed charged with the decode that
    shares each step put the clock past the lower classes' room and held them at the gateway
    while the engine queued nothing. First tokens give the room back."""
    p = Picker(("a",), kv_target=0.8, late_after_s=1.0)
    p.prefill_s_per_token = 0.001
    for i in range(20):
        p.add("a", 200.0, prompt_tokens=100, now=i * 0.05)  # 0.1 s of prompts every 0.05 s
    assert abs(p.prefill_done_at["a"] - 2.0) < 1e-9
    assert not p.prefill_room(1.0)  # 1 s ahead, past the room of 0.5 s
    p.prefilled("a", 0.9, 0.92)  # the prompts sent before 0.9 were prefilled by 0.92
    assert abs(p.prefill_done_at["a"] - 1.12) < 1e-9  # the two sent since: 0.2 s
    assert p.prefill_room(1.0)
