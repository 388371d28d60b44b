"""Issue 10's acceptance targets (src/llmvalve/sim/targets.py, what `llmvalve simulate
--judge` prints), one test per built-in scenario, each judged at seeds 1, 2 and 3 against the
fixed-limit oracles (the best `static:N` of the scenario's sweep, and `none`), run with the same
queues and policy; and one more, for the old built-ins: no goodput more than 1 % below its
baseline (`OLD_BASELINE`).

A target a scenario still misses is listed in `KNOWN_MISSES` (by seed and target, with its
cause): the scenario must miss exactly those (reported as xfail), nothing else.

`make test` runs every built-in of ordinary size: each seed costs an `adaptive` run, and the
best fixed limit's goodput and what `none` gave come from tests/data/oracle-cache.json when that
was computed from this source (tests/oracle_cache.py); otherwise `none` and the oracle sweep of
about ten fixed limits run here too (two to four minutes for all of them on a 2-core machine,
both cores busy). The fleet-scale built-in (64 backends, about two minutes per seed with its
sweep) and the held-out workloads of tests/data/holdout/ run when asked (312, docs/held-out.md:
four written before the controller's tuning, the rest after it, in batches by someone who had
not read it, and judged as they stood; of these, `holdout-rag-gw3`, `holdout-rolling-upgrade`,
`holdout-calm-tails-gw3` and others were traced and mended at a later stop (their entries below
say so), and `holdout-gw2-agents`, `holdout-gw3-small-code` and `holdout-gw6-medium`, written at
that stop, were judged again after its last change: these six are not unseen any more, nor are
`holdout-b44-seqcap-longanswer-medium3-uneq`, `holdout-b45-code-tiny6-gw3-3x`,
`holdout-b46-kvdrop-medium4` and `holdout-b46-calm-syncburst-small3`, mended at the stops that
added them, `holdout-b56-slow3x-rolling-tiny8-gw3-1.5x`, traced for stop 63's change,
`holdout-b62-p1-flood-agentloop-h100x2-gw3`, traced for stop 70's, and
`holdout-calm-h100-short`, met since stop 44):
    LLMVALVE_ISSUE10_FULL=1 pytest tests/test_generalisation.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import oracle_cache
from llmvalve.sim import targets
from llmvalve.sim.runner import ratios, simulate, simulate_seeds
from llmvalve.sim.scenario import Scenario, builtin_names, load_scenario

SEEDS = list(targets.SEEDS)
OLD_REGRESSION = 0.01  # no old built-in's adaptive goodput worse than below by more than 1 %
FLEET_SIZE = 32  # backends from which a built-in is fleet-scale: run on request only

# adaptive's goodput (tok/s) per seed before issue 10's controller work, measured on main at
# 7a82ceb (the engine of issue 13 and the input contract of issue 11 merged) with
# `llmvalve simulate --oracle --seeds 1,2,3`: the old built-ins must not lose more than
# OLD_REGRESSION of it.
OLD_BASELINE: dict[str, tuple[float, float, float]] = {
    "azure-conv": (667.3, 677.9, 652.3),
    "burst": (552.7, 529.5, 522.0),
    "cancel-heavy": (617.9, 584.8, 589.8),
    "capacity-drop": (639.4, 632.5, 636.4),
    "multi-gateway": (562.3, 520.6, 524.9),
    "noise": (212.9, 205.8, 195.6),
    "overload-sweep": (587.9, 595.7, 612.1),
    "prompt-shift": (682.8, 646.8, 717.0),
    "retry-storm": (520.2, 513.3, 498.5),
    "steady": (362.0, 364.5, 379.9),
}

# Targets still missed when issue 10's controller work ended (its report has the numbers and the
# causes): each scenario must miss exactly these, by seed and target; any other miss fails, and
# so does a listed miss that is met again (then remove it here). "Since stop 71" marks what
# changed when a retry (its client says so, requests.retryCountHeader) came to wait only its
# share of what its earlier attempts left of its TTFT objective (docs/design.md).
KNOWN_MISSES: dict[str, tuple[str, ...]] = {
    # P1 requests refused by the early-drop forecast at 0.75x load while the limit binds at
    # the KV target (`none` serves all): one at seed 2 (31.7 s; met at stop 26, back since
    # answers are charged per class at stop 27; seed 1's two, at t = 90 s, are met since).
    # The refused request is charged 0.73 of the mean in flight: forecast 4.8 s in requests,
    # 2.7 s in cost, and it waits 0.5 s when queued. Stop 48 forecast in cost (the cost
    # ahead and its own over the cost released): this met again with 9 other cells, missed
    # 26 (code-bursty-3x s2, code-bursty-medium s2/s3 and heavy-tail s2 P0 among them: more
    # small prompts admitted, their prefill chunks beside P0's short answers); reverted.
    "calm-steady": ("seed 2: P1 attainment",),
    # one P0 request of 41: a 4,096-token prompt (a quarter of a small engine's KV) arriving
    # while the engines hold most of their KV fits in none. Traced again at stop 37 (t = 32.0
    # s, 4,076 tokens): sent at once to an engine at KV 0.88, it was preempted 33 times in a
    # row (every preemption of the run: vLLM preempts the newest request, and its own next
    # chunk found no blocks), TTFT 9.8 s. Measured, not kept: the top class waits at the
    # gateway while no engine's KV (last scrape plus what was sent since) holds its prompt.
    # It mends this one (goodput +6 %) and holdout-longgen-kv's P0 (19 -> 4 misses at seed
    # 2), but P0 misses over every built-in but the fleet and every held-out workload fell
    # only 833 -> 822 at seeds 1-3 and 856 -> 839 at seeds 4-6, goodput -0.07 % and -0.02 %,
    # with code-bursty-3x -3.3 % and -2.0 % at seeds 1-2 (P0 1 -> 3 misses at seed 2: a
    # built-in target lost) and holdout-longctx16k -18 % at seed 2: a P0 head that waits
    # holds every class below it. Crediting what ended since the scrape as free: 833 -> 825,
    # and this one missed by two. Stop 69 measured it again, waiting at most half P0's TTFT
    # objective for an engine that holds the request's whole cost: this one met, P0 misses
    # -2 % at two timing draws, but the targets moved within chance (code-bursty s2-s3 lost
    # on the grid); not kept (docs/design.md).
    "azure-conv": ("seed 2: P0 attainment",),
    # P0 prompts prefilled behind the burst's 2,000-token prompts (TTFT 2.1-2.3 s against 2 s:
    # a 2,937- and a 4,058-token prompt at seed 2, a 4,870-token one that fits in no engine's
    # free KV at seed 3) and a 2-token answer decoded in a step shared with a 2,048-token
    # prefill chunk (TPOT 0.24 s against 0.15): 2 of ~125 at seed 3 (seed 2 met since stop 27).
    # Since stop 43 (the wait forecast drains a decayed limit's queue at its KV ceiling) seed
    # 3 is met (0.992) and seed 2, whose run diverged, misses by four of ~137: three answers of
    # 4-11 tokens decoded in steps shared with prefill chunks (TPOT 0.15-0.2 s) and a TTFT of
    # 2.4 s, none with a gateway wait.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 2 is met and seed 3 misses by two: answers of 2 and 5 tokens decoded in steps
    # shared with prefill chunks (TPOT 0.24 and 0.175 s).
    "code-bursty-3x": ("seed 3: P0 attainment",),
    # the first seconds, before the engines' sequence cap has been seen: the limit admits
    # more requests than the engines run and P0 requests queue inside them (TTFT 2.2-2.6 s
    # at t = 3-4 s): 2 of ~120 at seeds 2 and 3. Traced again at stop 40 (seed 2): when
    # every engine queues, P0 is placed by the backlog clock, which counts prompts, not
    # sequences: it went to an engine with 6 waiting over one with 3 (TTFT 2.2 s). Measured,
    # not kept: the fewest waiting first, before the clock. Seed 2 met (0.992), P0 misses over
    # every built-in but the fleet and every held-out workload 868 -> 858 at seeds 1-3 and
    # 896 -> 848 at seeds 4-6, goodput -0.1 %; but the held-out judge lost 11 targets and
    # met 6 again: it raised the fixed limits' goodput more than adaptive's (the picker is
    # theirs too: holdout-b38-maxtokens-overstated s1 adaptive 1,371 tok/s both times, 0.879
    # of the best fixed limit after) and cut holdout-longgen-kv s2 by 11 % (P0 19 -> 3 misses)
    # Since stop 57 the cap counts after two scrapes that show it binding, not three:
    # holdout-seqcap-small (the same cause on three small engines capped at 8 sequences) and
    # slowdown-one s3 are met since; here the misses stay, earlier than the second scrape.
    # Stop 64: counted after one scrape, the misses did not move: they arrive at 3.2-4.1 s, as
    # the engines first reach their cap (26 of 32 running at 3 s, 31 and 8 waiting at 4 s).
    # Stop 66: a policy that states the cap (`maxNumSeqs: 16`) meets P0 at seeds 1-3
    # (test_simulate_scenarios.py); the default policy, judged here, states none.
    "seq-cap": ("seed 2: P0 attainment", "seed 3: P0 attainment"),
    # held out: P0 requests in flight on the backend that leaves at 60 s, lost with it (no
    # admission decision saves a request its backend drops mid-stream), and at seeds 2 and 3
    # (since an increase needs one latency window after a cut, not a whole one) requests
    # prefilled behind the refill of the survivors at the departure and one TPOT of 0.153 s
    # against 0.15: 4 and 6 of ~130 at seeds 1 and 3 (seed 2 met since each replica counts
    # its prompts for the whole fleet on the backlog clock; 8, 4 and 3 before; 8, 2 and 0
    # before the increase rule's change; 16, 11 and 11 before P0 was placed away from the
    # 2.5x slower card). Since stop 27 (answers charged per class) 3 / 4 / 3 of ~130, every
    # one dropped with the leaving backend.
    "holdout-mixed-speed": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                            "seed 3: P0 attainment"),
    # held out (written after the replicas' share rule, judged as it stood): code completion
    # (2,000-token prompts, 30-token answers) in bursts on four small engines behind three
    # replicas: P0 0.963 / 0.947 / 0.962 (goodput 1.22 / 1.16 / 1.10 x best fixed). As it
    # stood, 0.938 / 0.947 / 0.962: each replica's backlog clock counted only the prompts
    # it sent, and P0 prompts landed behind the other replicas' 2,000-token prompts; now it
    # counts them for the fleet (0.956 / 0.947 / 0.962, goodput 1.16 / 1.16 / 1.10, since a
    # request waiting for the limit counts as use). Left (seed 2, 7 of 132): answers of 3-6
    # tokens decoded in steps shared with prefill chunks (TPOT 0.16-0.22 s against 0.15, as
    # code-bursty-medium) and prompts of 2,900-4,400 tokens prefilled on small engines beside
    # others (TTFT 2.3-5.8 s against 2), as code-bursty-3x.
    "holdout-gw3-small-code": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                               "seed 3: P0 attainment"),
    # held out (written at stop 24 after the controller's changes, judged as it stood):
    # P0 requests decoding on the engine that leaves at 70 s are dropped with it, where
    # no admission decision reaches. Met at every seed with the token-weighted latency
    # reading (stop 46); with the reservations by replica share of the same stop, three
    # P0 requests at seeds 1 and 3 each (0.981, 0.979) were on the leaving engine.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 2's P0 reads 0.949: seven requests dropped with the engine that
    # leaves, where one was before.
    "holdout-slow-gw3": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                         "seed 3: P0 attainment"),
    # held out (written at stop 25, judged as it stood: P0 0.870 / 0.867 / 0.926, goodput
    # 0.917 / 0.964 / 0.945 x best fixed): a rolling restart of four engines. The queue
    # refilled the places of the requests a leaving engine dropped on the three left before
    # the next window saw the loss, and P0 waited 2-6 s for them to drain; a dropped request
    # now takes its place in the limit with it (goodput 0.991 / 1.058 / 1.016). Left: the P0
    # requests decoding on each engine as it leaves, dropped with it and retried (TTFT counts
    # from the first attempt): 10 or 11 of ~120 at each seed, 0.924 / 0.917 / 0.901.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seeds 2 and 3 are met.
    # Since stop 71: seeds 2-3 miss too (0.950 / 0.975): six and three P0 requests lost on the
    # engines as they left (one before), their retries late.
    "holdout-rolling-upgrade": ("seed 1: P0 attainment",
                                "seed 2: P0 attainment",
                                "seed 3: P0 attainment"),
    # held out (written at stop 25, judged as it stood): code completion on two H100s,
    # 4,000-token prompts and 40-token answers in bursts at ~3.7x; prefill binds and a step
    # with an 8,192-token chunk takes 0.29 s against P0's 0.15 s TPOT. Inter-token latency
    # is over its target whenever the engines prefill, and the limit holds ~30 requests
    # where `static:64` holds 64: P0 0.993 / 0.983 / 0.996 (`static:64`: 0.887 at seed 1),
    # but 0.937 / 0.950 / 0.969 of `static:64`'s goodput (it serves more P2). Seed 2's P0
    # misses (5 of ~300) are TPOT misses of answers decoded in steps shared with prefill
    # chunks (TTFT 0.3-1.2 s), as in `code-bursty-medium`. The run is chaotic at this edge:
    # stop 26's prefill bound (which leaves the clock's speed here at 35 us a token, as
    # before) moved it to 0.961 / 0.947 / 0.936 of `static:64`, P0 0.969 / 0.986 / 1.000.
    # Stop 27's per-class answer lengths: ≥ 0.95 of `static:64` at each seed, P0 misses
    # 5 / 6 / 2 of ~300. Since stop 44 (one engine step's arrivals are not a queue) the limit
    # holds a little more between bursts and seed 3 misses too: 3 of 278 (0.989), TPOT
    # misses of 2-8-token answers as before.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 3 is met.
    # Since stop 51 (the engines' queue time observed when a request finishes, as vLLM does)
    # seed 3 misses again (0.971): eight answers of 3-15 tokens beside prefill chunks (TPOT
    # 0.158-0.289 s), no wait.
    "holdout-code-h100-onoff": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                "seed 3: P0 attainment"),
    # held out (written at stop 25, judged as it stood): one of four medium engines leaves
    # five times (7-15 s each) behind two replicas: every P0 miss (13 of ~270 at seeds 1 and
    # 3) is a request decoding on it when it leaves, retried: 0.951 / 0.954 / 0.941. Since
    # P0 stays off a backend back from failing twice (stop 34): 4 / 5 / 5 of ~240, every one
    # lost at the first two departures (20 and 50 s) and retried: 0.985 / 0.979 / 0.977.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 1 is met.
    # Since stop 71: seed 1 misses too (0.977): six P0 requests lost on the flapping engine, their
    # retries late.
    "holdout-flap": ("seed 1: P0 attainment", "seed 2: P0 attainment", "seed 3: P0 attainment"),
    # held out (written at stop 25, judged as it stood: 0.931 / 0.966 / 0.992 of the best
    # fixed limit, P0 0.915 / 0.967 / 0.915; seed 1 0.948, P0 1.000 since a request waiting
    # for the limit counts as use): 8,000-15,500-token prompts on four medium engines at
    # 1.5x. The P0 misses are TTFTs of 2.5-6.6 s against 2 s for 8,500-12,700-token
    # prompts prefilled behind others' in the engine (no gateway wait); the best fixed limit,
    # `static:16`, has P0 0.966 at seed 1.
    # Since stop 27's run: seed 1 ≥ 0.95 of the best fixed limit and one P0 miss (a
    # 10,134-token prompt, TTFT 2.7 s), seed 2 0.909 and 6 misses. Since P0 goes where its
    # KV fits (stop 33): seed 1 and seed 2's goodput met; P0 1.000 / 0.983 / 0.966: a
    # 9,211-token prompt at seed 2 (TTFT 2.96 s), an 8,260- and a 13,282-token one at seed 3
    # (2.63 s; 7.53 s, 0.48 s of it at the gateway).
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 1 misses as well (0.966): 10,325- and 11,939-token prompts prefilled behind
    # others (TTFT 4.4 and 3.9 s).
    "holdout-longctx16k": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                           "seed 3: P0 attainment"),
    # held out (written at stop 25, judged as it stood): two of three small engines leave for
    # 20 s and clients retry at once: the P0 misses are requests decoding on the two as they
    # leave, retried (3-7 per seed), and at seed 1 one that waited for the engine left:
    # 0.928 / 0.911 / 0.961 then; 0.916 / 0.937 / 0.909 at stop 35, where one more P0
    # request at seed 2 waits out the breaker's open spell in the queue (queued requests are
    # no longer sent to a pool whose breaker is open)
    "holdout-outage-retry-storm": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                   "seed 3: P0 attainment"),
    # held out: a diurnal curve; since stop 27's run, at seed 1 three P0 requests at the
    # day's peaks (115 and 222 s) waited ~2 s at the gateway (0.984; P0 misses over seeds
    # 4-6: 5 / 3 / 2 before stop 27, 6 / 1 / 2 after)
    "holdout-diurnal": ("seed 1: P0 attainment",),
    # held out: a P2 flood on small engines; since stop 27's run seed 1 reads 0.946 of the
    # best fixed limit (P0 1.000); not traced
    "holdout-flood-p2": ("seed 1: adaptive",),
    # held out: CI jobs flooding code completion; since stop 30 (lower classes wait while
    # only engines at their KV target have prefill room) seed 1 reads 0.948 of the best
    # fixed limit (1.3 % less goodput than before, P0 1.000 where it missed one request)
    "holdout-flood-ci-code": ("seed 1: adaptive",),
    # held out (written at stop 26 by someone who had not read the controller, judged as it
    # stood): do no harm at 0.6x on four medium engines behind two replicas, one engine away
    # from 60 to 100 s, clients retrying: every P0, P1 and P2 miss is a request decoding on
    # the engine as it left, retried (`none` has P0 0.967 at seed 1 for the same reason):
    # TTFT 8-15 s counted from the first attempt.
    # Stop 29: with `none` placed by Envoy's least-request balancing (as documented),
    # adaptive's P0 at seed 2 and P1 at seed 3 are no longer below `none`'s: met there.
    "holdout-calm-failover-gw2": ("seed 1: P1 attainment", "seed 3: P0 attainment"),
    # held out (written at the end of stop 26, judged as it stood, mended at stop 27):
    # reasoning answers of ~1,800 tokens beside short P0 chat, three replicas, four small
    # engines (one slower, one with a quarter of the KV): P0 0.625 / 0.952 / 0.906, TTFT
    # 3-100 s with no gateway wait. The pool's mean answer length, learned from the answers
    # that had finished (66-78 tokens: only chat for the first 40 s), priced every request;
    # the replicas admitted ~60 reasoning requests charged ~400 that grew to ~2,100 into
    # 57,000 KV tokens, and the engines preempted for the rest of the run. Each class now
    # learns its own length, and a class none of whose requests has finished is charged what
    # its oldest request has written by now if that is more than `defaultMaxTokens`
    # (core/answer_lengths.py): P0 1.000 / 0.881 / 1.000. Left at seed 2: after a wave of
    # answers ends at ~140 s the replicas refill the freed KV together, each counting only
    # what it sent since the scrape; the reasoning answers grow back into it and P0 requests
    # decode in preempting engines (TPOT 0.3-0.4 s) or wait behind them.
    # Since stop 43 (the picker by KV share sends the half-size engine half the load) seed 2
    # is met and seeds 1 and 3 miss: at seed 1 five P0 requests in the last 26 s decode on
    # preempting engines (TPOT 0.18-0.39 s) or wait 26-27 s on the half-size one; seed 3
    # reads 0.924 of the best fixed limit with one P0 miss.
    # Since stop 46 (one of R replicas reserves at most twice its share of the pool's
    # capacity estimate) P0 is met at every seed and seed 3's goodput too; seed 1 reads
    # 0.943 of the best fixed limit.
    "holdout-reason-gw3-hetero": ("seed 1: adaptive",),
    # held out (written at stop 28 by someone who had not read the controller, judged as it
    # stood): its own four-class policy with a 50 ms TPOT for P0 (voice) on three medium
    # engines at ~2.3x: 0.824 / 0.819 / 0.773 of the best fixed limit, P0 1.000 / 1.000 /
    # 0.996. The best fixed limit by goodput (static:128) gives P0 up (0.08-0.20): only small
    # decode batches meet 50 ms, and P0 is a sliver of the tokens. Against the best fixed
    # limit that keeps P0 at 0.99 (`simulate --oracle`'s `top_kept`: static:80 / 48 / 48)
    # adaptive reads 0.908 / 1.193 / 1.184. Meeting both needs an engine kept fast for P0
    # while the others run at the lower classes' looser TPOT (a lane). Tried at stop 28, not
    # kept: one engine held for P0, judged at P0's ITL target and the others at P1's, lower
    # classes sent there only when every other engine is full and it decodes within 0.75 of
    # the target with nothing sent since its scrape: 0.90 / 0.91 / 0.84 of the best fixed
    # limit, P0 0.990 / 0.928 / 0.953; on default-policy built-ins it cost goodput
    # (heavy-tail seed 1 -52 %: a lane is half of two engines; code-bursty-3x -7 %).
    "holdout-voice-4class": ("seed 1: adaptive", "seed 2: adaptive", "seed 3: adaptive"),
    # held out (written at the end of stop 28 by someone who had not read the controller,
    # judged as it stood): reports of ~3,500-token answers (up to 7,000) beside P0 chat on two
    # H100 engines of 32,768 KV tokens: 0.905 / 1.034 / 0.998 of the best fixed limit, P0
    # 0.990 (0.9897) / 0.943 / 0.978, 26-65 preemptions. The gateway reads no bodies here, so
    # a report's `max_tokens` (7,000) is not stated to it and its learned length is capped at
    # `defaultMaxTokens` (256): each is charged ~850 tokens of the ~4,000 it grows to, the
    # cost-per-KV-token ratio stays at 1, and the limit lets in more than the KV holds once
    # the answers grow; the preemptions cut it and P0 decodes in preempting engines. With
    # body inspection on (max_tokens read): 13-22 preemptions, P0 0.974 / 0.966 / 1.000, but
    # goodput 2,047 / 1,926 / 2,017 tok/s (0.81 of the best fixed limit at seed 1); with it on
    # and the cost-per-KV-token ratio held at 1, P0 1.000 at every seed and 0.66-0.75 of the
    # best fixed limit. Stop 29: the targets conflict here — the best fixed limit's P0 is
    # 0.946 / 0.726 / 0.928, the best fixed limit that keeps P0 (static:16) serves 1,926 /
    # 1,955 / 1,826 tok/s (adaptive 1.19 / 1.26 / 1.42 of it); the answers in flight are at
    # every age, so a forecast of their KV growth reads ~0 (tried, not kept); kvTarget 0.7
    # keeps P0 (1.000 / 0.997 / 0.989) at 0.93 / 0.90 / 0.90 of the best fixed limit.
    # Since P0 goes where its KV fits (stop 33) seed 1 is met (P0 1.000); P0 0.946 / 0.978
    # at seeds 2 and 3.
    # Since stop 47 (early drop refuses only past the whole TTFT objective while the offered
    # load is calm) seed 2 reads 0.920 of the best fixed limit: adaptive's run is unchanged
    # (2,318 tok/s); the fixed limits, which run the same early drop, gained.
    "holdout-longgen-kv": ("seed 2: P0 attainment", "seed 2: adaptive", "seed 3: P0 attainment"),
    # held out (written at the end of stop 28, judged as it stood; its writer meant P0 to be
    # judged and left the `expect` line out, added as meant): a P1 peak of 40 req/s whose
    # users give up after 3-8 s, P0 chat whose users (30 %) give up after 8-20 s: P0 0.952 /
    # 0.980 / 0.974, every miss a P0 request its user cancelled while it decoded (answers of
    # 100-200 tokens at the ITL target, 0.8 of P0's 150 ms TPOT, take 12-24 s: within the
    # SLO, past the user's patience). static:32-48 run the engines faster (P0 0.997-1.000)
    # and serve less (adaptive 1.03-1.06 of the best fixed limit).
    "holdout-giveup-peak": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                            "seed 3: P0 attainment"),
    # held out (written at stop 29, judged as it stood): P0 at 61-83 % of its reserved share
    # on a fleet of one large fast engine (196,608 KV tokens, 0.6x step time) and three small
    # slow ones (32,768, 1.3x), P1/P2 floods: 0.962 / 1.069 / 0.946 of the best fixed limit,
    # P0 0.975 / 0.980 / 0.962. Traced: the small engines sit at KV 0.9-1.0 with requests
    # waiting and preempt (each preemption cuts the pool's limit) while the large one holds
    # 0.3-0.6; the picker balances shares of cost and requests, not of KV, and a P0 request
    # goes where its prompt starts soonest by the backlog clock even where it would not fit
    # (P0 TTFT 2-9 s on the small engines). Measured, not kept: a P0 pick that passes over an
    # engine the request would overflow (P0 0.986 / 0.980 / 0.974, goodput 0.924 / 0.990 /
    # 0.889; elsewhere holdout-kv-regrow-retry -14 % and holdout-kv-shrink -14 % at seed 2);
    # with the lower classes' cost share weighted by each engine's share of the KV as well
    # (0.971 / 0.964 / 0.976, P0 0.986 / 0.992 / 0.988; holdout-reason-gw3-hetero -14 % and
    # holdout-kv-regrow-retry -10 to -20 %: KV size is not speed). Since stop 30 lower
    # classes wait at the gateway while the only engines with prefill room are at their KV
    # target and another (busy prefilling) is not: P0 0.992 / 0.997 / 0.994, goodput 0.995
    # / 0.923 / 0.987. Seed 2, where P1 agents waited for the large engine and missed their
    # TTFT (P1 requests within SLO 620 before, 496 after; preemptions 24 and 68), is met
    # since stop 41 (an engine running its sequence cap counts as queueing: 1,291 -> 1,320
    # tok/s).
    # Batch 38 (nine files written at stop 34 by someone who had not read the controller,
    # judged as they stood, not tuned on; cron-herd, h100-summarise, p0-majority and
    # rack-heat-stack meet every target). Hard client timeouts the gateway is not told about
    # (no deadline header): P1 tool-calling steps abandoned at 15 s, a router at 3 s, P0 at
    # 20 s, queued or mid-stream: 0.848 / 0.957 / 0.720 of the best fixed limit. Traced at
    # seed 3: adaptive runs about 82 requests at once at its KV target, static:80 about 66
    # (P0's reserve of 24 slots binds), so adaptive's engines decode slower (P1 TPOT p99
    # 0.111 s against 0.095); and the tool steps wait 4.0-7.0 s (10th-90th percentile) in a
    # P1 queue served oldest first, which turns newest-first only once its oldest has waited
    # the 8 s TTFT objective, where under static:80 the queue stands and half are admitted
    # within 0.5 s. A 150-350-token step admitted at 5.7 s takes past 15 s: 923 steps were
    # cancelled after their prefill (1.85 M prompt tokens prefilled for nothing) against 431
    # (0.86 M) under static:80, where more die in the queue, at no cost. The clients' 15 s
    # is tighter than the policy's P1 objective allows (8 s + 150 x 0.3 s). P0's misses are
    # answers of up to 400 tokens cancelled at 20 s while decoding (5-8 of ~300), as
    # holdout-giveup-peak. Not mended: nothing the gateway reads says the client will leave.
    # With the timeouts sent as deadlines (a class's `deadline:`, added at stop 34 for
    # this): 0.79 at seed 3, 0.91 on average. Starting only what can finish (deadline less
    # the tenant's mean time in flight): 0.87 at seed 3, but adaptive's goodput fell 1,009
    # -> 893 tok/s on average and the best fixed limit's too (it refused requests that would
    # have finished): not kept.
    # Since stop 71: seed 1's goodput is met (1.037 of static:80); seed 3 reads 0.902 of static:64.
    "holdout-b38-deadline-agents": ("seed 1: P0 attainment",
                                    "seed 2: P0 attainment",
                                    "seed 3: adaptive",
                                    "seed 3: P0 attainment"),
    # batch 38: do no harm with real-time SLOs (P0 500 ms / 40 ms) on two H100s behind two
    # replicas: adaptive keeps P0 at 0.987 / 0.992 / 0.994 where `none` leaves 0.900 / 0.937
    # / 0.909 (a 5,000-token recap prefilled in the step a caption decodes in), by holding
    # batches small; the recaps (P2) wait up to 14 s of their 15 s objective and a few P1
    # arrivals are refused by the early-drop forecast (4 of 724 at seed 1): P1 0.995 against
    # 0.997, P2 0.990 against 1.000. The best fixed limit for P0 (static:24) does the same
    # trade harder (P0 0.989, P1 0.928); goodput 1.006-1.010 x none.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 1's P2 is met and P0 misses at seeds 2 and 3 as well (0.982, 0.971): TPOT of
    # 41-55 ms against 40 and TTFT of 0.53-0.59 s against 0.5, none with a gateway wait:
    # the engines' own steps with prefill chunks in them, which the reading by time
    # overweighted and so kept room for.
    # Since stop 47 (early drop refuses only past the whole TTFT objective while the offered
    # load is calm) P1 is met at every seed.
    # Since stop 51 (the engines' queue time observed when a request finishes, as vLLM does)
    # seed 3's P1 reads 0.996 against none's 0.997: one request.
    # Since stop 54 (a queue time under vLLM's first bucket read from the window's mean, not
    # as 0.27 s: this policy's queue target is 0.125 s) P0 reads 0.969 / 0.976 / 0.982.
    "holdout-b38-calm-tight-slo": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                   "seed 3: P0 attainment", "seed 3: P1 attainment"),
    # batch 38: do no harm where the editor cancels 60 % of P0 completions 0.3-1.5 s after
    # sending; every P0 request that completes meets its SLO under both controllers. Seed 3:
    # two more P0 answers are overtaken by their cancel than under `none` (155 completed
    # against 157; P0 TPOT p99 0.072 s against 0.063), P0 0.608 against 0.616; seed 1: a P1
    # request more cancelled by its user while it waited (P1 0.964 against 0.968).
    "holdout-b38-calm-typing-cancel": ("seed 1: P1 attainment", "seed 3: P0 attainment"),
    # batch 38: max_tokens overstated 2-50x with bodies read: 0.917 of the best fixed limit
    # at seeds 2 and 3; that limit (static:128) preempts (207 at seed 2) and gives P0 up
    # (0.981), static:96 serves 1,200 tok/s against adaptive's 1,295 with P0 1.000: the
    # KV target trades the last 8 % of goodput for P0, as on holdout-longgen-kv.
    # Since stop 71: 0.948 / 0.948 / 0.969 of static:112-128 (fixed limits gained as much as
    # adaptive).
    "holdout-b38-maxtokens-overstated": ("seed 1: adaptive", "seed 2: adaptive"),
    # Batch 41 (eight files written at stop 36 by someone who had not read the controller,
    # judged as they stood, not tuned on; calm-rag-chat-3t, ramp-surge-small,
    # seqcap-tiny-requests and chat-vs-summarise-medium meet every target). Do no harm with
    # 4,000-7,800-token prompts and ~60-token answers at 0.7x on two small engines: seed 1,
    # two P0 requests of 26 (a 6,509-token prompt sent to the engine its prompt filled to
    # 0.997 by the last scrape, where the other would have held it at 0.57: the first one
    # starts it sooner by the backlog clock; it started 4.5 s later, when a 7,735-token
    # prompt ended; and one that waited 1.95 s at the gateway for the KV ceiling), one P1
    # arrival refused by the early-drop forecast at seeds 1 and 2 while the queueing part of
    # TTFT (p90 0.64 s against 0.5 s: prompts of this size queue for prefill at this load)
    # cut the limit; goodput 0.979 / 1.014 / 1.010 x none. `none` misses P0 at seeds 2 and 3
    # (0.871 / 0.905; adaptive 1.000 / 0.952). Tried: the top class prefers an engine its
    # prompt fits below the KV target to one that starts it sooner: seed 1 met, but P0
    # misses over the 315 runs 809 -> 829 (code-bursty-3x seed 2 +4, prompt-shift seed 2
    # +4, holdout-diurnal seed 3 +6): not kept.
    # Seed 2's P1 met since stop 43 (the wait forecast drains a decayed limit's queue at the
    # KV ceiling). Since stop 47 (the forecast counts the regrowing limit for the first
    # arrival it keeps back) seed 1's goodput and P1 are met.
    "holdout-b41-calm-longprompt-small": ("seed 1: P0 attainment",),
    # batch 41: a P1 tenant looping at 8x its share behind two replicas on three small
    # engines: 0.906 of the best fixed limit at seed 2 (static:20 per replica, 546 tok/s;
    # 1.0 P0 under both). When the loop starts each replica's limit stands near the whole
    # pool's KV ceiling (39 and 36 of a 39 thousand-token ceiling: the fill read 0.8-0.9 and
    # each grew), so the first half-second of the loop put 59 thousand tokens in flight: fill
    # 1.2-1.4, nine requests dropped, and for ~8 s the engines released little; the steady
    # P1 tenants' requests waited 8-13 s at the gateway (0.897 against static:20's
    # 0.96 / 1.00). Tried, not kept: sends since a scrape counted for every replica (the
    # others send alike): P0 misses over the 315 runs 809 -> 825, seed 2 unchanged; growing
    # only while a window used at least L / maxGrowth: seed 2 met (0.976) but seed 3 -9 %,
    # holdout-longctx16k seed 3 -16 %, do-no-harm misses 18 -> 23; a replica's limit held
    # at most at its in-flight peak over r or its share of the ceiling: seed 2 met (546,
    # the best fixed limit's), but over the 57 multi-replica runs P0 misses 81 -> 94
    # (holdout-flap seed 3 5 -> 12) and goodput -0.3 % (holdout-budgets-gw2 -4 %).
    # holdout-b41-gw2-p1-flood-small meets every target at seeds 1-3 since stop 71; its entry is
    # gone.
    # batch 41: one of four medium engines slowed 2x for 30 s, then another leaving for
    # 20 s: every P0 miss (6 of 190 at seed 2, 2 of 176 at seed 3) is a request decoding on
    # the engine as it left at 75 s, retried (TTFT counted from the first attempt); without
    # the departure P0 is 1.000 at both seeds.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 3 is met.
    "holdout-b41-slow-then-leave": ("seed 2: P0 attainment",),
    # Batch 42 (six files written at stop 36 from the issue's own families by someone who
    # had not read the controller, judged as they stood; code-onoff-small-1x, heavytail-
    # medium, p1-flood-10x-medium, fleet-slow3x-small and calm-onoff-h100-4t meet every
    # target). Code completion (2,200-token prompts, 28-token answers) in 15-35 s bursts at
    # ~6.5x two medium engines, 3x on average: 0.869 / 0.875 / 0.914 of the best fixed limit,
    # P0 0.958 / 0.948 / 0.972. The targets conflict here: that limit (static:48) gives P0 up
    # (0.897 / 0.852 / 0.876), and the best one that keeps it (static:24) serves 207 / 213 /
    # 198 tok/s, where adaptive serves 206 / 220 / 208 (0.995 / 1.03 / 1.05 of it). Every P0
    # miss at seed 1 (7 of ~165) is an answer of 3-17 tokens decoded in steps shared with
    # 2,000-token prefill chunks (TPOT 0.15-0.25 s against 0.15; TTFT 0.1-0.5 s, no gateway
    # wait), as on code-bursty-medium: the limit is judged on the engines' mean inter-token
    # latency, a short answer on the one or two steps it decodes in. Tried, not kept: lower
    # classes kept off an engine from a P0 send until four inter-token times after its
    # prompts ahead are prefilled: P0 0.976 / 0.985 / 0.989 but goodput 183 / 208 / 182;
    # over the 315 runs of batch 41's time P0 misses 809 -> 863, goodput -1 %
    # (holdout-calm-h100-short -13 to -18 %).
    "holdout-b42-code-onoff-medium-3x": ("seed 1: adaptive", "seed 1: P0 attainment",
                                         "seed 2: adaptive", "seed 2: P0 attainment",
                                         "seed 3: adaptive", "seed 3: P0 attainment"),
    # Batch 43 (eight files written at stop 37 from the issue's families by someone who had
    # not read the controller, judged as they stood at c745c1a; seqcap-tiny2,
    # p1-flood-h100-gw3 and both do-no-harm files meet every target). Three goodput misses
    # are the KV target's trade again: the best fixed limit by goodput gives P0 up. Code
    # completion at 1x on one H100, seed 3: static:48 (P0 0.957); against the best that
    # keeps P0 (static:32, 273 tok/s) adaptive reads 0.956, P0 0.995. Since stop 44 seed 2
    # misses P0 by one request (193 of 195): TPOT of short answers beside prefill chunks.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 2's P0 and seed 3's goodput are met, and seed 3's P0 misses (0.976): five
    # answers of 7-15 tokens decoded on one engine beside prefill chunks (TPOT 0.16-0.27
    # s), no gateway wait.
    # holdout-b43-code-onoff-h100-1x meets every target at seeds 1-3 since stop 71; its entry is
    # gone.
    # The code family at 3x on four small engines: two of ~115 P0 prompts (3,792 and 2,558
    # tokens) prefilled behind others inside their engine, TTFT 2.98 and 2.45 s with no
    # gateway wait (the cause listed for code-bursty); its goodput is 1.05-1.08 of the best
    # fixed limit's at seeds 1-2.
    # Since stop 43 (wait forecast, picker by KV share) seed 2 is met and seed 1 misses P0 by
    # three of ~115 the same way; seed 3 reads 0.949 of the best fixed limit.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 1's P0 is met and seed 2's misses (0.975): a 3,792-token prompt prefilled
    # behind others (TTFT 2.17 s) and answers of 7 and 8 tokens beside prefill chunks
    # (TPOT 0.155 and 0.168 s).
    # Since stop 71: 0.953 / 0.906 / 0.988 of static:24 (fixed limits gained more than adaptive at
    # seed 2), P0 0.966 / 0.975 / 0.991.
    "holdout-b43-code-onoff-small4-3x": ("seed 1: P0 attainment",
                                         "seed 2: adaptive",
                                         "seed 2: P0 attainment"),
    # Both H100s slowed 3x for 40 s at 1.5x load. The best fixed limit, static:256, gives P0
    # up (0.838 at seed 2); against the best that keeps it (static:128, 2,656 tok/s) adaptive
    # reads 1.07. P0 0.932 / 0.941 / 0.911: prompts sent at once that wait 2.0-2.8 s inside
    # the slowed engines. Traced at seed 1: while slowed, the engines' inter-token latency
    # reads 4-7x its target whenever prompts are being prefilled (each 3,000-token chunk
    # takes three times as long) and 0.6x as soon as admission stops; the limit is cut by
    # half when the whole latency window is known, then grows 1.25x a window on the young
    # average of a window with nothing prefilled: a 5-6 s sawtooth. Each rise lets the
    # queued P1 prompts in at once, 9-18 wait inside the engines, and the P0 prompts that
    # arrive then wait behind them (the backlog clock still runs at the healthy prefill
    # speed). Measured, not kept: an increase that also counts the last queueing-TTFT
    # reading scaled by in-flight until a new one comes (this workload did not move; P0
    # misses over all 357 runs 868 -> 866, goodput -0.08 %, do-no-harm misses 18 -> 20);
    # no increase while more than L is in flight (a window read while nothing but P0 was
    # admitted): goodput -22 % over all 357 runs (holdout-rolling-upgrade -78 to -82 %);
    # lower classes not sent to an engine with requests waiting inside it (the picker's
    # prefill room): this one's P0 misses 10 -> 1 and 10 -> 2 at seeds 1 and 3 (goodput -4
    # to -5 %), but over all runs P0 misses 868 -> 847 and goodput +0.06 % at seeds 1-3,
    # 856 -> 851 and -0.18 % at seeds 4-6, do-no-harm misses 18 -> 17 and 12 -> 16, and
    # the code family's P0 misses moved between seeds (code-bursty-3x s1 1.000 -> 0.985).
    # Stop 39: the clock's speed is the access log's, whose entry for a prompt comes when its
    # answer ends (10-20 s later here), the least of the latest 256 bounds: 40 us a token
    # through the whole slowdown while each engine held 5-12 waiting requests. The scraped
    # `vllm:prompt_tokens_total` over windows with requests waiting at both ends (and the
    # engine under its sequence peak and KV target) drained 3x slower while slowed, 0.9-1.2x
    # otherwise. Measured, not kept: the lower classes judged by the clock stretched by that
    # ratio (P0 placement unchanged): this one's P0 misses 28 -> 6 at seeds 1-3 but 20 -> 21
    # at seeds 4-6; over all 357 runs P0 misses 868 -> 856 and 896 -> 882, goodput -0.01 %
    # and -0.1 %, do-no-harm misses 18 -> 19 and 12 -> 13; code-bursty s2, code-bursty-3x s3
    # and code-bursty-medium s1 met, code-bursty-medium s2 and s3 and calm-steady s1 missed.
    # Variants: P0 placed by the stretched clock too, 868 -> 862 (code-bursty-3x s1 missed);
    # the clock run at the slower speed, 868 -> 864, goodput -0.4 %; the ratio believed only
    # from 2x, or after 1-1.5 s of windows, 865 / 855 / 854 at seeds 1-3 and (1 s) 896 -> 901
    # at seeds 4-6, do-no-harm 12 -> 15, this one's seed 6 5 -> 18 misses. Stop 40: first
    # tokens reported within a second (what Envoy's periodic access-log flush,
    # `access_log_flush_interval: 1s`, would send for each open stream), simulated as each
    # first token pulling the clock back at the next 1 s tick after it: this one's P0 misses
    # 28 -> 30 (20 / 9 / 1), over all 357 runs 868 -> 898, goodput -0.07 %, azure-conv s1
    # and s3 and code-bursty-3x s2 lost P0. Not built.
    # Since stop 44 seed 2 meets the goodput target and seed 3 P0's.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 3's goodput is met and its P0 misses (0.929): eight requests decoding on the
    # slowed engines at 55-69 s, TPOT 0.150-0.164 s against 0.15.
    "holdout-b43-fleet-slow3x-h100": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                      "seed 3: P0 attainment"),
    # Heavy-tailed answers behind two replicas on four small engines, seed 2: the best fixed
    # limit, static:24 a replica, gives P0 up (0.934, 262 preemptions); no fixed limit of
    # the sweep keeps it. Adaptive keeps P0 at 1.000 with 61 preemptions.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 2 reads 1.007 of static:24; every target is met
    # (holdout-b43-heavytail-small4-gw2).
    # Batch 44 (eight files written at stop 41 from the issue's families by a helper that had
    # not read the controller, judged as they stood: six missed a target, two
    # (heavytail-stopgen-medium-uneq, slow-pairs-medium4-gw3) met every one. The stop's
    # sequence change was made for one of them (the seqcap entry); the others miss as
    # before it. p1-flood-waves-tiny4-gw2 misses by 0.001.
    # Do no harm with four replicas on three medium engines (one slowed 1.6x): the P1 misses
    # are clients that left (P1 0.923 / 0.912 against none's 0.942 / 0.940 at seeds 2 and
    # 3). At seed 3, 24 grading-agent requests on the slowed engine passed their 20 s
    # deadline while decoding (none: 11, and 2 on another engine), with no wait at the
    # gateway and as many grading-agent requests on that engine under both (72 and 69).
    # Traced at stop 42: the slowed engine decodes at 0.06 s a token under both, so a
    # 400-500-token answer there passes 20 s; P0 is placed where it prefills soonest, which
    # is not the slowed card (35 P0 requests there against none's 53), and the lower classes,
    # balanced by load, fill the room it leaves: 97 P1 requests there against 84, 25 of them
    # cancelled against 15. Measured, not kept: P0 balanced by load like the lower classes
    # among engines that prefill it within a quarter of its TTFT objective (41 P0 and 83 P1
    # there; P1 0.932 / 0.937 at seeds 2 and 3, still below none's), which over every
    # workload met 17 targets and lost 20 (P0 misses 889 -> 892 at seeds 1-3).
    "holdout-b44-calm-gw4-medium3-uneq": ("seed 2: P1 attainment", "seed 3: adaptive",
                                          "seed 3: P1 attainment"),
    # Do no harm on one H100 behind two replicas, 50-80 s busy spells of long prompts: P1
    # 0.985 / 0.993 against none's 1.000 at seeds 1 and 3. Traced at stop 42: each miss is a
    # CI-pipeline request the early-drop forecast refused at the start of a busy spell
    # (forecast 4.0-5.7 s against the 4 s it may wait) and that, retried, waited 1.8-5 s
    # more: its TTFT counts from the first attempt (8.0-10.6 s against 8). The forecast
    # was about right; the threshold is what refused them (as holdout-calm-h100-short).
    # Measured, not kept: five eighths of the TTFT objective instead of half met four
    # do-no-harm targets on three other workloads (not this one's) but lost six P0 targets
    # of five built-ins (azure-conv s1, code-bursty s1, code-bursty-3x s1 and s2,
    # code-bursty-medium s2, heavy-tail s2): 14 targets lost, 12 met.
    "holdout-b44-calm-longprompt-minutes-h100-gw2": ("seed 1: P1 attainment",
                                                     "seed 3: P1 attainment"),
    # The code family at 3x behind two replicas on two small engines: no fixed limit of the
    # sweep keeps P0 (the best, static:6 a replica, 126 tok/s; adaptive 112 with P0 0.987
    # and 87 preemptions).
    # Since stop 43 (wait forecast) P0 is met at seeds 1-2 and missed at seed 3 (0.980); seed
    # 3 reads 0.926 of the best fixed limit.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 3 is met and seed 2's P0 misses (0.980): three prompts of 2,067-4,181 tokens
    # prefilled behind others on one engine (TTFT 2.4-3.8 s), no gateway wait.
    # Since stop 51 (the engines' queue time observed when a request finishes, as vLLM does)
    # seed 2's P0 is met and seed 3 misses again: 0.858 of the best fixed limit and P0 0.973,
    # four prompts of 1,801-4,382 tokens prefilled behind others (TTFT 2.06-3.21 s), no wait.
    # Against the run before (106.2 -> 94.6 tok/s): the limit sits a few percent higher (the
    # queue time, read from finished requests, lags the queue), preemptions 55 -> 66, P1
    # requests meeting their SLO 336 -> 312.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 1 is met; seed 3 reads 0.926 of the best fixed limit, P0 0.986.
    "holdout-b44-longprompt-3x-small-gw2": ("seed 3: P0 attainment", "seed 3: adaptive"),
    # The code family at 1x on two small engines (one 1.5x slower): P0's misses come in the
    # first seconds of a burst after a silent minute (eight at t = 132-134 s at seed 1, each
    # waiting 1.2-3.1 s at the gateway while the lower classes' 2,000-token prompts fill the
    # KV); static:8 keeps P0 at 1.000 with adaptive's goodput (70 tok/s), static:12 serves 76.
    # Traced at stop 42 (t = 133 s): P0 then holds more than its reserved share (7,800 of
    # 8,300 tokens, and a 3,100-token prompt arrives), so it stops at the KV ceiling, which
    # the lower classes' requests below the limit and P0's own fill; an engine would have
    # started it at once. Measured, not kept: the top class admitted past its share wherever
    # an engine would start it at once (no queue, KV below the target with it, prompts ahead
    # prefilled within its late bound): P0 here 0.906 -> 0.963 at seed 1; over every
    # workload P0 misses 889 -> 879 at seeds 1-3 and 920 -> 905 at seeds 4-6, goodput the
    # same, but the targets moved by chance (6 lost, 7 met), calm-steady s1 P1 among the lost.
    # Since stop 43 (wait forecast, picker by KV share: its engines are unequal) seeds 1 and 3
    # meet P0 and seed 1 the goodput target; seed 2 misses P0 (0.950) and seed 3 reads 0.925
    # of the best fixed limit.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 3's goodput is met and its P0 misses (0.983): a 2,707-token prompt prefilled
    # behind others (TTFT 2.36 s) and a 12-token answer beside prefill chunks (TPOT
    # 0.175 s).
    # Since stop 47 (early drop refuses only past the whole TTFT objective while the offered
    # load is calm) seed 3 reads 0.924 of the best fixed limit (80 -> 77 tok/s) and P0 0.957:
    # in the second busy period (from ~125 s, after a silent minute) the last minute's window
    # still holds the silence and reads calm, so more P1 requests queue and then miss their
    # TTFT (late P1 first tokens 177 -> 186, all the change after 130 s).
    # Since stop 51 (the engines' queue time observed when a request finishes, as vLLM does)
    # seed 3's goodput target is met again.
    # holdout-b44-longprompt-minutes-small-uneq meets every target at seeds 1-3 since stop 71; its
    # entry is gone. Since stop 51 (the engines' queue time observed when a request finishes, as
    # vLLM does) seed 3 reads 0.944 of the best fixed limit too: 1,570 -> 1,548 tok/s against the
    # run before, preemptions 13 -> 21 (the lagging queue time, as above), P1 met 2,553 -> 2,515.
    # Since stop 57 (the sequence cap counted after two scrapes) seed 3 is met.
    "holdout-b44-p1-flood-waves-tiny4-gw2": ("seed 1: adaptive",),
    # Three medium engines capped at 12 sequences with ~400-token answers: a full batch holds
    # a quarter of the KV. As written, P0 0.818 / 0.891 / 0.872: P0 requests were let in past
    # the sequences the engines run (the top class could queue waitingTarget more in each)
    # and placed on an engine whose scrape showed nothing waiting but that ran its 12 of 12,
    # where they waited 2-6 s for its next sequence. Since then (stop 41) no class is sent to
    # wait inside an engine and the picker counts an engine at its cap as queueing: P0 1.000
    # / 0.984 / 0.979, one request at seeds 2 and 3 waiting ~2 s at the gateway for the first
    # sequence to end at t = 28-30 s. Holding a sequence per engine free for the top class
    # (while it had sent within 30 s) met seed 2 (1.000 / 1.000 / 0.979; two held: the
    # same) but cost the tiny engines' workloads 5-10 % of goodput (holdout-b43-seqcap-tiny2,
    # holdout-seqcap-small): not kept.
    # Since stop 71: P0 0.964 / 0.953 / 0.979 (seed 1: two TTFTs queued at the gateway).
    "holdout-b44-seqcap-longanswer-medium3-uneq": ("seed 1: P0 attainment",
                                                   "seed 2: P0 attainment",
                                                   "seed 3: P0 attainment"),
    # Batch 45 (eight files written at stop 42 from the issue's families by a helper that had
    # not read the controller, judged as they stood with `simulate --judge`): five met every
    # target (calm-mixedgpu-small3, calm-rag-h100-gw2, flood-ramp-medium4-gw4,
    # heavytail-medium3-mixed, seqcap-h100x2-ramp).
    # Code completion at 1x on three medium engines behind two replicas: every P0 miss is an
    # answer of 2-8 tokens decoded in steps shared with prefill chunks (TPOT 0.151-0.243 s
    # against 0.15, no wait at the gateway, no preemption): 5 / 2 / 2 of ~180, as
    # code-bursty-medium. The best fixed limit by goodput, static:32, has P0 0.98 at seed 1;
    # static:16 keeps it (0.994) at 0.89 of that goodput.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 3 is met.
    # Since stop 51 (the engines' queue time observed when a request finishes, as vLLM does)
    # seed 3 misses again (0.967): answers of 5-13 tokens beside prefill chunks (TPOT
    # 0.151-0.19 s), no wait.
    "holdout-b45-code-medium3-gw2-1x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                        "seed 3: P0 attainment"),
    # Code completion at ~3x on six tiny engines (4,096 KV tokens: two 1,800-token prompts
    # fill one) run by priority, three replicas. As judged: 0.672 / 0.665 / 0.585 of static:4
    # (three replicas, 12 requests, about two an engine, 3,800 preemptions in 150 s), P0
    # 0.9899 at seed 2. Traced at seed 1: an engine preempted in almost every window (two
    # 1,800-token prompts, or one of 3,800 beside another), each preemption cut the limit to
    # 0.9 of what was in flight, and it sat at its minimum (2,048 tokens a replica): four or
    # five requests on six engines, pool KV 0.2-0.4. Since stop 42 preemptions only on
    # engines running one or two sequences, while another engine has room, hold the limit
    # (core/adaptive.py): 0.900 / 0.964 / 0.893, P0 0.995 / 0.995 / 0.991. Measured, not
    # kept: the same for engines running any number of sequences (0.950 / 0.973 / 0.930, but
    # it held while one engine's growing answers preempted: azure-conv s4 28 -> 145
    # preemptions and -9 % goodput, holdout-reason-gw3-hetero s3 P0 1.000 -> 0.906; 7
    # targets met and 6 lost over every workload at seeds 1-3).
    # Since stop 43 seed 1's P0 reads 0.990 (3 of ~200 missed with the wait forecast's change).
    # Since stop 46 (one of R replicas reserves at most twice its share) seed 1's goodput is
    # met and seed 2's P0 reads 0.990 (two of ~200: prompts of 2,795 and 2,582 tokens
    # prefilled behind others inside their engine, TTFT 2.6 and 3.3 s).
    # Since stop 57 (the sequence cap counted after two scrapes) seed 1's P0 is met and seed
    # 2 reads 0.932 of the best fixed limit: the run diverged.
    # Since stop 61 (such preemptions are not a drop: the window is judged by its other
    # signals, and the limit may grow) 1.031 / 1.070 / 1.079 of static:4, P0 0.979 / 0.985 /
    # 0.991: seed 1's four misses are prompts of 2,130-3,052 tokens prefilled behind others
    # inside their engine at 92-106 s (TTFT 2.1-3.9 s, no gateway wait).
    "holdout-b45-code-tiny6-gw3-3x": ("seed 1: P0 attainment", "seed 2: P0 attainment"),
    # Half the fleet slowed 3x, then one engine of four leaves at 100 s: every P0 miss is a
    # request decoding on it as it leaves, dropped with it (4 / 2 / 3 of ~170).
    "holdout-b45-halfslow-leave-small4-gw2": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                              "seed 3: P0 attainment"),
    # batch 46 (written at stop 43 by a helper who had not read the controller; judged as it
    # stood, three of eight met every target). Code completion at 1x on two small engines,
    # from batch 42: since stop 43 seed 3 misses P0 by one (0.985).
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seeds 1 and 2 miss as well (0.984, 0.976): prompts of 2,390-3,800 tokens prefilled
    # behind others inside their engine (TTFT 2.1-2.5 s) and a 6-token answer decoded
    # beside prefill chunks (TPOT 0.188 s), none with a gateway wait of more than 0.2 s.
    # Since stop 47 (early drop refuses only past the whole TTFT objective while the offered
    # load is calm) seed 3 is met.
    # Since stop 71: seed 1's P0 is met (1.000).
    "holdout-b42-code-onoff-small-1x": ("seed 2: P0 attainment",),
    # Do no harm with cancellations (30 % of clients leave after 2-8 s): two or three P1
    # requests of ~260 a seed finish just after their client left under adaptive and just
    # before under `none` (e.g. e2e 2.84 s under `none`, cancelled under adaptive, same
    # engine), or the other way round. As calm-steady seed 2.
    "holdout-b46-calm-chat-cancel-medium2-gw2": ("seed 1: P1 attainment", "seed 2: P1 attainment",
                                                 "seed 3: P1 attainment"),
    # Do no harm: one tenant's 3 s bursts at 28 req/s every 20 s at 0.64x mean load. As
    # written: P1 0.879 / 0.832 / 0.846 against `none`'s 1.000, 0.88-0.91x `none`: every miss
    # an early-drop refusal. Between bursts the unused limit decayed to a quarter of the KV
    # ceiling and the forecast drained the queue at its release rate; since stop 43 it drains
    # at the ceiling the limit regrows to (core/admission.py): P1 0.902 / 0.931 / 0.915,
    # 0.927-0.953x `none`. Left: refusals at forecasts of 4.0-4.1 s against the 4 s it may wait
    # (half of its 8 s TTFT objective) with the limit at the ceiling; the threshold at 5/8 of
    # the objective was measured at stop 42 and not kept, nor were two measured margins at
    # stops 34 and 36 (the objective less the class's p90 time from dispatch to first token,
    # and less the forecast's own error besides): P0 misses +12 to +20 % in overload.
    # Since stop 47 (early drop refuses only past the whole TTFT objective while the offered
    # load is calm) goodput is met at every seed and P1 at seed 1. Seed 2 refuses 9 of ~720
    # P1 requests, 8 of them in its first two bursts, while the minute's window holds one or
    # two bursts and reads above the calm level (0.988); seed 3 refuses 7 of ~760 at one burst
    # (82.8-83.0 s, 57 queued), calm, at forecasts of 8.1 s against its 8 s objective
    # (0.991).
    "holdout-b46-calm-syncburst-small3": ("seed 2: P1 attainment", "seed 3: P1 attainment"),
    # Two of four medium engines cut to 20,000 KV tokens at 50 s. As written 0.941 / 1.008 /
    # 0.877 of the best fixed limit: the cut engines, sent as much as the full ones, preempted
    # at 3-5 requests each and every preemption cut the pool's limit. Since stop 43 the picker
    # balances by each engine's share of the KV: 1.034 / 1.078 / 0.983 (the fixed limits,
    # placed by the same picker, gain too). Left: P0 at seed 1 (0.978).
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 3's goodput misses (0.932 of the best fixed limit; 959 -> 909 tok/s): the wait
    # forecast refuses more P1 arrivals (160 -> 223 of 508) and the capacity goes to P2's
    # queue (P2 dropped at its timeout 105 -> 67, served within its SLO 102 -> 152); not
    # traced further. Since stop 61 (time-shared preemptions are not a drop) seed 3 reads
    # 0.887.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 3 reads 0.980 of static:40.
    "holdout-b46-kvdrop-medium4": ("seed 1: P0 attainment",),
    # Answers of 1-3k tokens on engines run by priority: the limit holds KV at 0.8-0.9 where
    # static:144 runs at 0.95 with 141 preemptions, cheap when the lowest class is the one
    # preempted (0.912 at seed 3). The KV target is the trade, as on holdout-longgen-kv.
    "holdout-b46-longgen-medium3-prio": ("seed 3: adaptive",),
    # Batch 47 (eight files written at stop 44 by a helper who had not read the controller,
    # judged as they stood at af0ca2e; five meet every target).
    # An engine leaves at 70 s and rejoins at 100 s under 1.5x with retries: one P0 request
    # of ~190 at seed 3 (0.989); every fixed limit of 32-64 misses P0 at seed 1.
    # Since stop 46 (the latency reading weighs each scrape by its tokens, not its time)
    # seed 2 misses as well (0.980): seven requests sent at 62-68 s were decoding on the
    # engine that fails at 70 s, and their retries' first tokens came at 70.2-70.5 s (TTFT
    # 2.9-8.2 s from arrival, no gateway wait): the place no admission decision reaches.
    # holdout-b47-outage-rejoin-retry-medium4-gw2 meets every target at seeds 1-3 since stop 71; its
    # entry is gone. Batch 48 (eight files written at stop 54 by a helper who had not read the
    # controller, judged as they stood at dccb945; five met every target). Do no harm with the
    # engines scraped every 5 s (holdout-b48-calm-stale-signals-medium3- gw2): as written 0.942 /
    # 0.945 / 0.959 x `none`, P1 0.907 / 0.920 / 0.944 against its 1.000 (eight targets): each
    # reading was stale after the policy's 2 s, so every engine read saturated three seconds in five
    # and held the lower classes back. Since a staleAfter the policy leaves out follows the scrape
    # interval (twice it; a given one at or below it is an error) it meets every target. RAG with
    # 3-7 % of one tenant's prompts over the 8,192-token context (answered 400 at once): seed 1
    # reads 0.897 of static:24 (1.04 and 1.08 at seeds 2 and 3); not traced. Since stop 63 (below
    # half its KV ceiling, an engine sent nothing since the last cut cuts the limit no further):
    # seed 1 reads 1.017 of static:24; every target is met (holdout-b48-ctx-overflow-rag-small3).
    # Engines capped at 8 sequences, ~300-token answers, retrying bursts: the best fixed limit
    # (static:40, every slot of the fleet) gives P0 up (0.86-0.89), and the best that keeps it
    # serves 0.61-0.90 of its goodput. Adaptive: 0.986 / 0.911 / 0.857 of static:40, P0 0.963 /
    # 0.989 / 1.000. Looked at (seed 1): the three P0 misses of 80 waited at the gateway for a
    # sequence (queue wait p99 1.9 s, TTFT p99 3.1 s) while the lower classes held all 40: a
    # reserved share reserves tokens past the limit, and where sequences bind there is no room past
    # the engines' cap. Not mended. Since stop 57 (the cap counted after two scrapes, not three)
    # seed 3's P0 reads 0.984. Since stop 60 (the offered load counts requests against the sequences
    # where the cap binds: the pool no longer reads calm, so P1 is refused at arrival instead of
    # queued to time out) 1.011 / 1.145 / 0.982 of static:40, P0 0.963 / 0.978 / 1.000.
    "holdout-b48-seqcap-drafts-medium5-retry": ("seed 1: P0 attainment",
                                                "seed 2: P0 attainment"),
    # Batch 49 (eight files written at stop 55 by a helper who had not read the controller,
    # judged as they stood at 84cbcd9; three met every target: code completion on eight
    # small engines behind four replicas at 3x, a P1 tenant flooding at 10x with retries,
    # engines capped at 10 sequences behind three replicas).
    # Heavy-tailed answers (cv 2.5-3) on five small engines behind two replicas: seed 2
    # reads 0.879 of static:24 (1.12 and 0.98 at seeds 1 and 3; P0 1.000 at each, where
    # static:32 gives it up at seed 3). Traced (seed 2): 285 preemptions against static:24's
    # 113, throughput 1,185 against 1,364 tok/s. For the first 100 s the limit, charging each
    # request its prompt and 1.25x its class's mean answer, runs up to 79 requests at KV 0.8
    # (static:24, 48); their answers of up to 4,000 tokens then grow into single engines,
    # which preempt at every window, and from 165 to 230 s each window's preemption cut the
    # limit by a tenth of what was in flight, 35,000 -> 12,500 tokens at pool KV 0.3-0.6.
    # Measured, not kept (stop 55, 501 runs of every ordinary built-in and held-out
    # workload at seeds 1-3): a preemption cuts nothing while the pool's share-weighted KV
    # is below 0.75 (0.6) of the target: this one 0.978 (0.924) of the best fixed limit,
    # goodput +0.09 % (+0.06 %), but P0 targets (by attainment crossing 0.99) lost 14 and
    # met 5 (lost 4, met 1), code-bursty s3 and code-bursty-3x s1 (s2) among them; a
    # preemption cuts no lower than 0.6 of the KV ceiling: 0.959, goodput +0.17 %, P0
    # targets lost 9 and met 2. The cuts after preemptions keep P0's prompts on time too.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 2 reads 0.969 of static:24, P0 1.000; every target is met
    # (holdout-b49-heavytail-small5-gw2).
    # Three of eight tiny engines slowed 3x for 40 s at 1.5x: seed 2 reads 0.914 of
    # static:32, which lets P0 fall to 0.971, and 0.944 of static:24, the best that keeps it
    # (0.960 and 0.956 at seeds 1 and 3). Looked at (seed 2): adaptive refuses 709 P1
    # requests on arrival against static:24's 429, P1 0.810 against 0.891, P0 0.998.
    # Since stop 57 (the sequence cap counted after two scrapes) seed 2 is met and seed 3
    # reads 0.949: the runs diverged.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 3 reads 0.982 of static:32; every target is met
    # (holdout-b49-slow3x-three-of-tiny8-gw2).
    # Do no harm with 24 P1 tenants, eight of them in independent bursts, on four small
    # engines (mean load 0.63-0.71x, but overlapping bursts overload the pool for tens of
    # seconds): `none` runs ~110 requests with 40 waiting in the engines and 74 preemptions at
    # seed 2, P0 0.884; adaptive keeps P0 at 1.000 and refuses or times out P1 requests of
    # the bursting tenants (31 refused, 13 dropped at seed 2). Traced (seed 2): the queue of
    # ~40 P1 builds while KV sits at the 0.8 target and the limit is cut for latency at KV
    # 0.85, which keeps P0's TPOT; the P1 objective (8 s) is loose enough for `none` to serve
    # its requests late in the engines' queues. The trade of the KV target again. Measured,
    # not kept: a KV target that probes up to 0.08 above kvTarget while nothing preempts.
    "holdout-b49-calm-tenants24-small4-gw2": ("seed 2: adaptive", "seed 2: P1 attainment",
                                              "seed 3: P1 attainment"),
    # An engine of three leaves at 70 s and rejoins at 100 s with twice the KV and speed:
    # every P0 miss (9 / 7 / 13 of ~420) is a request in flight on it when it left (arrived
    # 47-70 s at seed 3), the place no admission decision reaches. static:128 keeps P0 at
    # seeds 1 and 3 only because it happened to place P0 on engine 0 (45 of 57 at 40-70 s,
    # adaptive 35 of 57 on engine 2). Measured, not kept: the top class spread over engines
    # that start it as soon (fewest top-class requests first): still 9 dropped (about 40 P0
    # requests are in flight at once), and P0 misses rose over the other workloads.
    "holdout-b49-swap-bigger-medium3": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                        "seed 3: P0 attainment"),
    # One P1 tenant's prompts double at 80 s (1,600 -> 3,200 tokens) on four small engines
    # behind two replicas: seed 1 reads 0.947 of static:16, which gives P0 up (no fixed limit
    # of the sweep keeps it there); 1.09 and 1.12 at seeds 2 and 3. Looked at (seed 1):
    # static:16 serves P1 0.730 and P0 0.977, adaptive P1 0.557 and P0 1.000.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 1 reads 1.086 of static:16; every target is met
    # (holdout-b49-prompt-double-small4-gw2).
    # Batch 50 (eight files written at stop 58 by a helper who had not read the controller,
    # judged as they stood at 038c00b; five met every target: two calm ones, heavy-tailed
    # answers with runaway generations on six small engines behind three replicas, engines
    # capped at 16 sequences, and two pools, one swamped by a P2 job).
    # Two of five small engines slowed at 50 s and reclaimed at 70 and 74 s (spot
    # instances), replaced at 160 and 185 s: every P0 miss (7 of ~210 at seed 1) is a
    # request decoding on an engine as it was reclaimed, the place no admission decision
    # reaches; no fixed limit of the sweep keeps P0 at seeds 1 and 3.
    "holdout-b50-spot-reclaim-small5-gw2-1.5x": ("seed 1: P0 attainment",
                                                 "seed 2: P0 attainment",
                                                 "seed 3: P0 attainment"),
    # An evaluation harness floods P1 with 5,000-token prompts beside four steady P1 teams:
    # seed 1 reads 0.940 of static:12, which gives P0 up (0.974; no fixed limit of the sweep
    # keeps it at any seed); seed 3's two P0 misses are prompts prefilled behind the flood's
    # inside an engine (TTFT 2.5 and 4.5 s, no gateway wait).
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 1 reads 1.001 of static:12.
    # holdout-b50-flood-evalharness-small3-gw2-2x meets every target at seeds 1-3 since stop 71; its
    # entry is gone. Code completion with repository context at 2.5x on two medium engines behind
    # two replicas: seed 3's one P0 miss is a 5,964-token prompt prefilled behind others inside an
    # engine (TTFT 6.0 s, no gateway wait). Since stop 63 (below half its KV ceiling, an engine sent
    # nothing since the last cut cuts the limit no further): seed 3's P0 is met (the runs diverged);
    # every target is met (holdout-b50-code-repoctx-medium2-gw2-2.5x). Batch 51 (eight files written
    # at stop 59 by a helper who had not read the controller, judged as they stood at eaabcd5; three
    # met every target at seeds 1-3, four at 4-6). Do no harm on three small engines behind two
    # replicas, bursts of 15-40 s at 0.55-0.61x mean load: seed 2 P1 0.935 against none's 1.000
    # (goodput 0.981x none). Not traced.
    "holdout-b51-calm-onoff-chat-small3-gw2": ("seed 2: P1 attainment",),
    # Two of five small engines leave at 40 and 60 s and rejoin at 100 and 125 s, four
    # replicas: every P0 miss is a request dropped with a leaving engine (5 of 194 at seed
    # 1); no fixed limit of the sweep keeps P0 at any seed.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 2's P0 reads 0.977: three dropped with the engine that leaves and one
    # late inside an engine.
    "holdout-b51-outage-rejoin-small5-gw4": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                             "seed 3: P0 attainment"),
    # One P1 tenant ramps to 13x its share on four tiny engines behind three replicas:
    # seed 3 reads 0.941 of static:12 (0.961 and 0.971 at seeds 1 and 2). Not traced.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 3 reads 0.972 of static:12; every target is met
    # (holdout-b51-p1-flood-tiny4-gw3).
    # Two H100s capped at 12 sequences, decode-bound (a full batch holds under 1 % of the
    # KV): 0.876 / 0.893 / 0.907 of static:32. Traced at its own seed: adaptive holds what
    # the engines run, 24 of 24, and nothing waits inside them; static:32 keeps 6-9 waiting,
    # so a sequence that ends is refilled at once, where the gateway refills it only once
    # the access log says so (19-24 running). Measured, not kept: every class may have one
    # more in flight per engine than the engines run: this one 0.91x at its worst seed,
    # but `seq-cap` P0 0.942 at seed 2 (small engines, longer answers: P0 queued behind a
    # lower class inside an engine); lower classes alone one more: P0 starved at the
    # gateway (0.046). Traced again at stop 60: most of the gap was not the refill but the
    # calm reading. The pool's offered load was read in tokens against a limit the cap kept
    # unused (about 0.1, calm), so P1 could wait its whole TTFT objective: P1 requests were
    # queued to time out at 15 s (313 against static:24's 143 at seed 1) and retried too late.
    # Counting requests against the sequences: 1.004 / 0.943 / 0.945 of static:32, level with
    # static:24 (2,710 against 2,755 tok/s at seed 2); static:32's 4 % over it is the refill.
    # Since stop 71: 0.931 / 0.980 / 0.977 of static:32.
    "holdout-b51-seqcap-h100x2-moderation": ("seed 1: adaptive",),
    # Two of four small engines 2.5x slower from 40 to 100 s, P0 sending a 30 s deadline:
    # seed 2's four P0 misses are clients that left at their deadline (every P0 request that
    # completed met its SLO, none waited at the gateway); seed 3 P0 0.985. Not traced further.
    "holdout-b51-slow-half-small4-gw2-deadline": ("seed 2: P0 attainment",
                                                  "seed 3: P0 attainment"),
    # Batch 52 (eight files written at stop 60 by a helper who had not read the controller,
    # judged as they stood at b4e232a; four met every target at seeds 1-3, four at 4-6).
    # Do no harm on four tiny engines behind four replicas, every class on and off together
    # (bursts at about 1.3x, 0.56-0.65x mean load): P1 0.932 / 0.936 / 0.958 against none's
    # 1.000 / 0.997 / 1.000. Traced at seed 1: 88 P1 requests refused at arrival, their
    # forecast wait past half their objective in a burst that none serves in time (the last
    # minute reads busy). Judging calm over 180 s instead of 60: 0.950, not kept.
    "holdout-b52-calm-onoff-tiny4-gw4": ("seed 1: P1 attainment", "seed 2: P1 attainment",
                                         "seed 3: P1 attainment"),
    # Heavy-tailed answers (cv 2.5-3) at 2.4-2.7x on eight tiny engines (4,096 KV tokens):
    # 0.789 / 0.834 / 0.742 of the best fixed limit. Traced at seed 3: one engine at a time
    # fills with a runaway answer and preempts (2,332 preemptions) while the pool's mean KV
    # reads 0.3-0.5, and its preemptions held the pool's limit (one or two sequences ran on
    # the engine that preempted).
    # Since stop 61 (preemptions on engines running one or two sequences, while another has
    # room, are not a drop: the limit was held at 12,000 tokens for a minute there, at pool
    # KV 0.3-0.5) 0.871 / 0.892 / 0.902, P0 1.000 at each seed.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seeds 1 and 2 read 0.999 and 1.023 of the best fixed limit, seed 3 0.9498.
    # Since stop 71: 0.978 / 0.936 / 0.954 of static:24.
    "holdout-b52-heavytail-tiny8-gw2-2.5x": ("seed 2: adaptive",),
    # One of two H100s leaves at 50 s and rejoins at 80 s, P1 retrying at once: P0 0.959 /
    # 0.972 / 0.944. Traced at seed 1: twelve P0 streams dropped with the leaving engine and
    # two prefilled behind the refill at its return (TTFT 2.5 s).
    "holdout-b52-outage-retry-storm-h100x2-gw2": ("seed 1: P0 attainment",
                                                  "seed 2: P0 attainment",
                                                  "seed 3: P0 attainment"),
    # Engines capped at 6 sequences behind two replicas: seed 3's P0 reads 0.9899. Not traced.
    "holdout-b52-seqcap-small4-gw2": ("seed 3: P0 attainment",),
    # Batch 53 (eight files written at stop 61 by a helper who had not read the controller,
    # judged as they stood at 892e4f2; two met every target at seeds 1-3, three at 4-6).
    # Do no harm with impatient clients: at seed 2 one more P1 request than under `none` is
    # cancelled by its user (88 against 87 of ~1,030): 0.914 against 0.915. As
    # holdout-b46-calm-chat-cancel-medium2-gw2.
    "holdout-b53-calm-cancel-deadline-medium3-gw2": ("seed 2: P1 attainment",),
    # Do no harm on six tiny engines behind four replicas, P1 spikes of 80 req/s for 2-6 s
    # (about 1.9x) at 0.54-0.59x mean load: P1 0.994 / 0.984 / 0.979 against `none`'s 1.000.
    # Traced: every miss is an early-drop refusal at a forecast of 4-6 s against the 4 s (half
    # the objective) it may wait, 18 / 50 / 56 of them, at seed 3 all in the spike at 27-29 s:
    # the offered load over the 27 s seen so far, which held two spikes, read 0.85-0.90, above
    # the calm level (0.8). Measured, not kept: the calm level at 1.0 (P0 misses over 597
    # runs 1,308 -> 1,350, multi-gateway s2 -7 %); the load over a whole minute from the start
    # (the seconds before it counted as idle): refusals 3 / 5 / 12, P1 0.999 / 0.998 / 0.996,
    # but P0 misses 1,308 -> 1,344 and holdout-b52-calm-onoff P1 0.934 -> 0.884 at seed 2.
    "holdout-b53-calm-spikes-tiny6-gw4": ("seed 1: P1 attainment", "seed 2: P1 attainment",
                                          "seed 3: P1 attainment"),
    # Code completion at ~3x on two H100s, prefill-bound: P0 0.947 / 0.960 / 0.940, every miss
    # (20 of ~380 at seed 1) a TPOT of 0.15-0.29 s against 0.15 for answers of 3-24 tokens
    # decoded in steps shared with prefill chunks, no gateway wait; as holdout-code-h100-onoff.
    # The best fixed limit that keeps P0, static:24, serves 0.95-0.96 of the best's goodput.
    "holdout-b53-code-onoff-h100x2-gw2-3x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                             "seed 3: P0 attainment"),
    # Code completion at ~1x on five medium engines behind four replicas: seed 2's five P0
    # misses are TPOTs of 0.152-0.165 s for answers of 6-13 tokens beside prefill chunks.
    "holdout-b53-code-onoff-medium5-gw4-1x": ("seed 2: P0 attainment",),
    # Heavy-tailed answers on seven small engines: seed 1 reads 0.816 of static:32. From 80
    # to 150 s a runaway answer preempts on one engine at a time, running three or more
    # sequences, and every window's preemptions cut the limit to 0.9 of what is in flight:
    # 80,000 -> 18,000 tokens with the pool's KV at 0.3-0.47 (the heavy-tail cause above).
    # Measured at stop 61, not kept: after a cut for preemptions, none again until as many
    # requests have ended as were in flight at the cut (the same excess draining): this one
    # +20 % at seed 1 (0.98 of static:32, 24 preemptions against 242), batch 52's heavy tail
    # +15-16 % at seeds 1-2, but over 597 runs P0 misses 1,308 -> 1,357, and code-bursty lost
    # P0 at seeds 2-3 (0.98); only while the pool's KV is below 0.75 of the target: +15 %
    # here, 1,308 -> 1,322, code-bursty P0 0.981 / 0.966 at seeds 1 and 3.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 1 reads 1.006 of static:32; every target is met
    # (holdout-b53-heavytail-small7-gw2-2.5x).
    # Five of six small engines slowed 3x for 45 s: seed 2 reads 0.905 of static:96, which
    # gives P0 up (0.949); against the best fixed limit that keeps P0 (static:64), 1.015.
    # holdout-b53-slow3x-five-of-small6-1.5x meets every target at seeds 1-3 since stop 71; its
    # entry is gone. Batch 54 (eight files written at stop 61 by a helper who had not read the
    # controller, judged as they stood at a84edad; four met every target at seeds 1-3). Do no harm
    # with impatient users: at seed 3 one more P1 request than under `none` is cancelled by its user
    # (14 against 13 of 527): 0.973 against 0.975.
    "holdout-b54-calm-jitter-cancel-medium2-gw3": ("seed 3: P1 attainment",),
    # Code completion at ~3x on three medium engines behind four replicas: P0 0.982 / 0.987 /
    # 0.978, TPOTs of 0.15-0.23 s for answers decoded beside prefill chunks (prompts of
    # 2,000-3,400 tokens), no gateway wait; the best fixed limit that keeps P0 serves 0.87-0.95
    # of the best's goodput.
    "holdout-b54-code-onoff-medium3-gw4-3x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                              "seed 3: P0 attainment"),
    # Since stop 71: all four small engines slowed 3x behind two replicas: P0 0.988 at seed 3, one
    # TPOT; no fixed limit of the sweep keeps P0.
    "holdout-b54-fleet-slow3x-small4-gw2": ("seed 3: P0 attainment",),
    # Code completion at ~1.1-1.25x on six small engines: 0.955 / 0.888 / 0.934 of the best
    # fixed limit, P0 0.987 / 0.986 / 0.964. At seed 2 adaptive preempts (229 against
    # static:6's none, which keeps P0 at 1.000 and serves 335 tok/s against 301) and refuses
    # P1 at arrival (222 against static:8's 77, Retry-After up to 60 s). Seed 3's P0 misses
    # are prompts of 2,500-3,700 tokens prefilled behind others inside their engine (TTFT
    # 2.5-4.0 s, no gateway wait). Traced at stop 62 (seed 2): the preemptions are a thrash.
    # A 4,000-token prompt is admitted by its first 2,048-token chunk into an engine whose
    # decoding requests hold 0.79-0.92 of its KV; its next chunk finds no block and it is
    # preempted (the newest), then admitted again, every other step, until they end (vLLM v1
    # allocates a waiting request's blocks chunk by chunk). Each window's preemptions cut the
    # limit to 0.9 of what is in flight: 93,000 -> 22,000 tokens in five windows (99-103 s)
    # while the pool's KV fell to 0.14, and the early-drop forecast, draining the queue at the
    # collapsed in-flight count, refused P1 with Retry-After up to 60 s. One gateway instead
    # of three: 351 tok/s, 107 preemptions. Measured, not kept: lower classes sent only where
    # the prompt fits (last scrape, what was sent since times the replicas, the prompts the
    # backlog clock still counted at the scrape): at one gateway 30 preemptions and P0 147 of
    # 147, at three no change (the replicas release their queues in the same instant, each
    # blind to the others' sends until the next scrape); over every ordinary run goodput
    # +0.13 %, P0 misses 1,331 -> 1,344. The forecast drained at the most in flight in the
    # last 5 s: refusals here 146 -> 86, Retry-After at most 18 s, but over every ordinary
    # run P0 misses 1,331 -> 1,365.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seeds 2 and 3 read 0.983 and 0.981 of static:8; P0 0.974 / 0.973 / 0.978.
    # Since stop 71: P0 0.994 / 0.980 / 0.993.
    "holdout-b54-code-onoff-small6-gw3-1x": ("seed 2: P0 attainment",),
    # One P1 tenant at 10x on eight tiny engines behind four replicas: 0.921 / 0.909 / 0.907
    # of static:16, which gives P0 up at seed 2 (0.979, 970 preemptions against adaptive's
    # 244); against the best fixed limit that keeps P0 (static:12), 0.95 / 0.94 / 0.93.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seeds 1 and 3 read 0.979 and 0.955 of static:16, seed 2 0.940.
    # holdout-b54-p1-flood-tiny8-gw4 meets every target at seeds 1-3 since stop 71; its entry is
    # gone.
    # Batch 55 (eight files written at stop 62 by a helper that had not read the controller,
    # judged as they stood at c2c9073 with `simulate --judge`): three met every target at
    # seeds 1-3 (code-onoff-medium4-kvsplit-1x, heavytail-medium2-gw4-2.5x,
    # p1-flood-medium3-5tenants), four at 4-6.
    # Bursts of 1.4x for 8-20 s at 0.7x mean load on five small engines: P1 0.933 / 0.963 /
    # 0.984 against none's 0.958 / 0.979 / 1.000. Adaptive's P1 misses are requests whose
    # wait at the gateway made them late (`late.ttft_queued` 30 / 14 / 9) and 4-7 refused at
    # arrival in a burst; `none` lets each burst fill the engines past the KV target and serves
    # it late inside them (26 / 12 / 0). The KV target's trade in calm bursts.
    # Since stop 63 (below half its KV ceiling, an engine sent nothing since the last cut cuts the
    # limit no further): seed 2's P1 is met.
    "holdout-b55-calm-bursty-small5-gw2": ("seed 1: P1 attainment", "seed 3: P1 attainment"),
    # One P1 request (a 2,944-token prompt) refused at arrival by the early-drop forecast at
    # 60 s, on one H100 at 0.7x behind four replicas; `none` serves all 382 (calm-steady's
    # miss).
    "holdout-b55-calm-rag-ramp-h100-gw4": ("seed 1: P1 attainment",),
    # Code completion at 3x on one H100 behind three replicas: P0 0.990 / 0.965 / 0.960, every
    # miss an answer decoded in steps shared with 8,192-token prefill chunks (`late.tpot`
    # 2 / 7 / 8), none with a gateway wait. At seeds 1 and 3 the best fixed limit keeping P0
    # (static:6) serves 0.97-0.98 of the best's goodput.
    "holdout-b55-code-onoff-h100-gw3-3x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                           "seed 3: P0 attainment"),
    # Six tiny engines capped at three sequences, short requests, 1.65x, two replicas: 0.899 /
    # 0.903 / 0.899 of static:16. Adaptive holds in flight what the engines run (18), and
    # they run 15.4 of those 18 sequences on average (one gateway: 15.6): about two are
    # always between their end on an engine and their release at the gateway (the access
    # log's delay, ~25 releases a second). static:16 keeps 32 in flight, 13 of them queued
    # inside the engines, which fill each slot as it frees. Measured, not kept: half a
    # request per engine let in past the cap, +7 % here (0.96 of static:16), but over every
    # ordinary run P0 misses 1,331 -> 1,442 (P0 queued inside engines behind long answers:
    # holdout-b44-seqcap-longanswer-medium3-uneq and holdout-b48-seqcap-drafts-medium5-retry
    # lost 8-26 P0 requests a seed); a slack past the cap learned from the scrapes (grows by
    # half the free sequences less the waiting ones each window), +3 % here, P0 misses
    # 1,331 -> 1,352, holdout-b48-seqcap-drafts-medium5-retry -12 % at seed 2. Stop 64: the
    # sequences freed but not yet logged counted as free (the replica's release rate times the
    # access log's measured delay): +4.4-4.9 % here (about 0.94), but over every sequence-cap
    # workload at seeds 1-3 P0 misses 38 -> 100 (P0 queued inside engines again).
    "holdout-b55-seqcap-tiny6-seq3-gw2": ("seed 1: adaptive", "seed 2: adaptive",
                                          "seed 3: adaptive"),
    # Two of three medium engines slowed 3x for 40 s at 1.5x: 0.921 / 0.936 / 0.916 of
    # static:96, which gives P0 up (0.918 at seed 1: 25 answers decoded too slowly on the
    # slowed engines); against the best fixed limit keeping P0 (static:64 at seeds 1-2,
    # static:48 at seed 3), 1.00-1.11.
    # Since stop 71: 0.951 / 0.959 / 0.946 of static:96.
    "holdout-b55-slow3x-two-of-medium3-gw2-1.5x": ("seed 3: adaptive",),
    # Code completion on eight small engines behind four replicas at 3x (batch 49, met every target
    # as written). Since stop 63 (below half its KV ceiling, an engine sent nothing since the last
    # cut cuts the limit no further): seed 3's P0 reads 0.989, three prompts late inside the
    # engines (`ttft_backend`).
    "holdout-b49-code-onoff-small8-gw4-3x": ("seed 3: P0 attainment",),
    # Batch 56 (eight files written at stop 63 by a helper that had not read the controller, judged
    # as they stood at a5946b2 with `simulate --judge`): three met every target at seeds 1-3
    # (calm-trace-medium3-gw3, flood-trace-medium4-gw2, seqcap-medium2-seq20-prio-ramp-2x), four at
    # 4-6. Tracing slow3x-rolling-tiny8-gw3-1.5x gave stop 63's change (core/adaptive.py
    # `_preemptions_counted`); the entries are as judged after it.
    # Do no harm while two of five small engines restart in turn (0.60-0.64x mean load, two
    # replicas): every miss is a request in flight on the engine that left, dropped with it (P0 8 /
    # 2 / 3 of ~245 against `none`'s 3 / 3 / 4; P1 and P2 within one to seven requests of
    # `none`'s). Which requests an engine holds when it leaves is the picker's chance; no admission
    # decision reaches them.
    "holdout-b56-calm-restarts-small5-gw2": ("seed 1: P0 attainment", "seed 1: P2 attainment",
                                             "seed 2: P1 attainment", "seed 3: P0 attainment",
                                             "seed 3: P2 attainment"),
    # Code completion on three H100s, one 1.4x slower, behind two replicas at about 1x: P0 0.948 /
    # 0.932 / 0.926, every miss `tpot` (33 / 45 / 49): short answers decoded in steps shared with
    # other prompts' prefill chunks, none with a gateway wait. Adaptive reads 0.98-1.00 of the best
    # fixed limit (static:64); the best that keeps P0 (static:32, static:24 at seed 3) serves
    # 0.93-0.96 of its goodput.
    "holdout-b56-code-minutes-h100x3-oldcard-gw2-1x": ("seed 1: P0 attainment",
                                                       "seed 2: P0 attainment",
                                                       "seed 3: P0 attainment"),
    # Code completion at 3x on eight small engines behind four replicas: as written 0.943 / 0.937 /
    # 0.884 of static:12 (each window's preemptions cut the limit); since stop 63 1.009-1.015, but
    # P0 0.973 / 0.988 / 0.982 (as written 0.988 / 0.982 / 0.997): long prompts prefilled beside
    # P0's (`ttft_backend` 6 / 4 / 5) and short answers decoded beside prefill chunks (`tpot` 10 /
    # 3 / 6). static:8, the best fixed limit keeping P0, serves 0.93-0.94 of static:12.
    "holdout-b56-code-minutes-small8-gw4-3x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                               "seed 3: P0 attainment"),
    # Half of eight tiny engines slowed 3x for 40 s, then the other half, at 1.5x behind three
    # replicas: as written 0.805 / 0.836 / 0.883 of static:16. Traced (seed 1): one engine
    # preempted a 1,648-token prompt at every step (admitted by its first 1,022-token chunk
    # beside two decoders) while the other seven drained; each window's cut for it (to 0.9 of
    # in-flight) took the three replicas' limits together from 30,000 to 7,000 tokens in six
    # seconds. Since stop 63 0.957 / 0.942 / 0.953.
    # holdout-b56-slow3x-rolling-tiny8-gw3-1.5x meets every target at seeds 1-3 since stop 71; its
    # entry is gone. Batch 57 (eight files written at stop 64 by a helper that had not read the
    # controller, judged as they stood at 8fbdd73 with `simulate --judge`): four met every target at
    # seeds 1-3 (calm-steady-tiny5-gw3, heavytail-h100x2-gw3-2.5x, p1-flood-10x-small6 and
    # seqcap-small8-seq6-gw3-1.8x), three at 4-6. Not traced further. Do no harm in on/off bursts on
    # four medium engines behind two replicas (0.67-0.71x mean load): at seed 2, three P1 requests
    # refused at arrival by the early-drop forecast at 137.0- 137.4 s, inside a burst (`none` serves
    # all 589).
    "holdout-b57-calm-onoff-medium4-gw2": ("seed 2: P1 attainment",),
    # Code completion in minute-long waves at about 3x on three small engines behind two replicas:
    # 0.926 / 0.950 (just under) / 1.001 of static:8; P0 0.967 / 0.973 / 0.985 (`ttft_backend` 3 /
    # 2 / 1, `tpot` 2 / 2 / 1). At seed 1 adaptive refuses fewer P1 requests at arrival than
    # static:8 (1,454 against 1,544) and serves more of them in time (369 against 346), but the P1
    # queue it keeps at the gateway holds P2 back past its queue timeout (350 P2 dropped against
    # 285; 91 met their SLO against 150).
    # Since stop 71: 0.948 / 0.996 / 0.981 of static:8, P0 0.987 / 0.973 / 1.000.
    "holdout-b57-code-minutes-small3-gw2-3x": ("seed 1: adaptive",
                                               "seed 1: P0 attainment",
                                               "seed 2: P0 attainment"),
    # Code completion on six medium engines behind three replicas at about 1x: P0 0.974 / 0.987 /
    # 0.984, every miss `tpot` (12 / 6 / 7): short answers decoded in steps shared with prefill
    # chunks. Adaptive reads 0.98-0.99 of the best fixed limit (static:64); the best that keeps P0
    # (static:32) serves 0.935-0.947 of its goodput.
    "holdout-b57-code-onoff-medium6-gw3-1x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                              "seed 3: P0 attainment"),
    # Both medium engines slowed 3x (from 45 and 55 s to 110 s) at 1.5x behind four replicas, P0
    # about 29 % of the slowed capacity (its share is 30 %): P0 0.987 / 0.985 / 0.958 (`tpot` 2 / 0
    # / 2, `ttft_queued` 0 / 2 / 4); no fixed limit of the sweep keeps P0, and adaptive reads
    # 0.99-1.00 of the best.
    "holdout-b57-slow3x-all-medium2-gw4-1.5x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                                "seed 3: P0 attainment"),
    # Batch 58 (eight files written at stop 66 by a helper that had not read the controller,
    # judged as they stood at e2256de with `simulate --judge`): calm-cron-minutes-small7-gw3,
    # heavytail-diurnal-medium2-gw2-2.5x and slow3x-newpair-mixed-medium4-gw2-1.5x meet every
    # target at seeds 1-3.
    # Do no harm on three tiny engines (4,096 KV tokens) where a fifth of P0's requests carry
    # 2,000-token RAG prompts, 0.73x on average: at seed 1, 57 P1 requests refused at arrival by
    # the early-drop forecast (77-135 s) while the limit was cut 22 times for preemptions
    # (`drop`), the pool's KV at 0.3-0.6: an engine holding one of those prompts and two or
    # three more preempts. `none` preempts 437 times (adaptive 193) and serves every P1 request
    # in time; P0 0.986 against `none`'s 0.969. Not mended: the cut on preemptions is what keeps
    # P0 elsewhere (azure-conv, holdout-longgen-kv). Tried on this file alone, not kept: an
    # engine whose KV holds at most four of the pool's average sequence read as time-sharing
    # (its preemptions no drop): seeds 1-2 meet the goodput target (P1 0.966 / 0.962), but at
    # seed 3 P1 reads 0.907 against `none`'s 0.925 and P0 0.978.
    "holdout-b58-calm-ragchat-diurnal-tiny3": ("seed 1: P0 attainment", "seed 1: adaptive",
                                               "seed 1: P1 attainment", "seed 2: adaptive",
                                               "seed 2: P1 attainment", "seed 3: P0 attainment"),
    # Code completion on two small engines behind three replicas, P1 and P2 jumping 11x at each
    # minute: 0.933 / 0.943 / 0.915 of static:4 / 4 / 3. At seed 3 adaptive preempts 84 times
    # against static:3's 17 and serves 55 P2 requests in time against 88. From 13 s on, the three
    # replicas' limits, summed, swing from second to second between 22,000 and 37,000 tokens
    # (two engines of 16,384; one replica's steps alternate between increase and pressure), and
    # the engines' KV between 0.5 and 0.98. P0 0.989 / 0.941 / 0.977; no fixed limit keeps it at
    # seeds 1 and 2. Not a grid artifact: at timing draws 1 and 2, 0.82-0.96. Measured, not
    # kept: for 30 s after a cut an increase stops at the level cut from (0.93 / 0.99 / 0.98
    # here, but goodput -2.2 % over every ordinary run; for replicas of several only, stop 67,
    # 14 P0 targets met and 13 goodput and do-no-harm targets lost over the 109 held-out files
    # with several replicas; docs/design.md, "The control law").
    # Since stop 71: goodput met: 0.972 / 0.989 / 1.000 of static:3-4; P0 0.978 / 0.965 / 0.977.
    "holdout-b58-code-cron-minutes-small2-gw3-3x": ("seed 1: P0 attainment",
                                                    "seed 2: P0 attainment",
                                                    "seed 3: P0 attainment"),
    # Code completion whose prompts grow from ~1,600 to ~2,700 tokens at 90 s, five small
    # engines at 1x: seed 1's P0 0.989, one request inside an engine and one TPOT. Not traced.
    "holdout-b58-code-ctxshift-small5-1x": ("seed 1: P0 attainment",),
    # One P1 tenant ramping to 10x four steady ones on four small engines behind four replicas,
    # P0 mixing chat with 3,000-token RAG prompts: P0 0.986 / 0.978 / 0.979, every miss TTFT
    # inside an engine; the best fixed limit keeping P0 serves 0.972 of the best at seed 2, and
    # none keeps it at seed 3. Not traced.
    "holdout-b58-p1-flood-ragchat-small4-gw4": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                                "seed 3: P0 attainment"),
    # Three H100s capped at 6 sequences behind four replicas, 2x: P0 0.788 / 0.803 / 0.775
    # until stop 76, waiting at their replica for one of its own 4.5 sequences to end; no fixed
    # limit keeps P0. Since the shares are rounded down below P0 and P0 is sent on (stop 76,
    # docs/design.md): P0 0.973 / 0.992 / 1.000, seed 1's four misses TTFT inside an engine;
    # goodput 0.962 / 0.946 / 0.962 of `static:5`, whose 20 requests per pool overfill the
    # engines' 18 sequences where the rounding leaves two of them to P0.
    "holdout-b58-seqcap-judge-h100x3-seq6-gw4-2x": ("seed 1: P0 attainment",
                                                    "seed 2: adaptive"),
    # Batch 59 (eight files written at stop 67 by a helper that had not read the controller,
    # judged as they stood at 23e97ea with `simulate --judge`): heavytail-tutor-small3-2.5x,
    # p1-flood-synthdata-h100x2-gw2, seqcap-prio-small6-seq4-gw2-2x and
    # slow3x-powercap-h100x2-gw3-1.5x meet every target at seeds 1-3. None of the misses was
    # traced; the first was looked at.
    # Do no harm on four medium engines behind four replicas, code review on/off at 0.63-0.65x:
    # P1 0.972 / 0.971 against `none`'s 1.000 at seeds 1-2 (goodput 0.986 / 0.982 x none).
    # Seed 1, looked at: in the on-spells (16-35 s) the pool's KV sits at the 0.8 target, the
    # limit holds, and 30-45 P1 requests queue; 38 are refused, 7 late in the queue, 2 dropped.
    # `none` preempts 99 times and serves every P1 request in time, but its P0 reads 0.831
    # against adaptive's 0.997: the trade of the KV target again.
    "holdout-b59-calm-codereview-onoff-medium4-gw4": ("seed 1: P1 attainment",
                                                      "seed 2: P1 attainment"),
    # Do no harm on four tiny engines (4,096 KV tokens), two ramps crossing at 0.63-0.68x: at
    # seed 1 P1 0.968 against `none`'s 1.000 and 0.977 x none.
    "holdout-b59-calm-shifthandover-tiny4": ("seed 1: adaptive", "seed 1: P1 attainment"),
    # Code completion on four small engines behind three replicas, every bursty class switching
    # on together at about 3x, P1 retrying at once: 0.961 / 0.978 / 0.968 of static:6, P0
    # 0.911 / 0.955 / 0.929 (TTFT inside an engine and short answers' TPOT beside prefill
    # chunks). The best fixed limit keeping P0 serves 0.961 of the best at seed 1 and 0.907 at
    # seed 3; at seed 2 static:6 keeps it.
    "holdout-b59-code-release-retry-small4-gw3-3x": ("seed 1: P0 attainment",
                                                     "seed 2: P0 attainment",
                                                     "seed 3: P0 attainment"),
    # Code completion at 1x on five tiny engines behind two replicas, two offices on their own
    # on/off schedules; each engine's KV holds one or two prompts: P0 0.965 / 0.965 / 0.977,
    # every miss TTFT inside an engine. No fixed limit keeps P0 at seed 1; the best that does
    # serves 0.759 and 0.800 of the best at seeds 2 and 3.
    "holdout-b59-code-twooffice-tiny5-gw2-1x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                                "seed 3: P0 attainment"),
    # Batch 60 (eight files written at stop 68 by a helper that had not read the controller,
    # judged as they stood at f71388e with `simulate --judge`): calm-teams-onoff-h100x3-gw2,
    # heavytail-timeout-medium6-gw2-2.5x, p1-flood-prefill-medium5-gw3,
    # seqcap-onoff-h100x4-seq8-gw3-2x and slow3x-stagger-small8-cancel-1.5x meet every
    # target at seeds 1-3. Looked at, not traced further:
    # Do no harm on eight medium engines behind four replicas at 0.67-0.73x, two P1 tenants
    # with a 20 s client deadline: one more P1 request than under `none` reaches its deadline
    # before its answer ends (seed 1: 5 against 4 of 1,369; 0.996 against 0.997), and one at
    # seed 2 (0.999 against 0.999).
    "holdout-b60-calm-steady-medium8-gw4-deadline": ("seed 1: P1 attainment",
                                                     "seed 2: P1 attainment"),
    # Code completion at 3x on seven tiny engines, P0 on and off with the bursts: P0 0.966 /
    # 0.993 / 0.989, every miss TTFT inside an engine with no gateway wait (seed 1: prompts of
    # 1,200-3,200 tokens, TTFT 2.0-4.2 s), as on holdout-b59-code-twooffice-tiny5-gw2-1x. The
    # best fixed limit keeping P0 at seed 1 (static:4) serves 0.669 of the best.
    "holdout-b60-code-minutes-tiny7-p0onoff-3x": ("seed 1: P0 attainment",
                                                  "seed 3: P0 attainment"),
    # Code completion at 1x on two small engines that schedule by priority, behind four
    # replicas: P0 0.985 at seed 1, one answer of 14 tokens decoded beside prefill chunks
    # (TPOT 0.165 s against 0.15).
    "holdout-b60-code-onoff-small2-gw4-prio-deadline-1x": ("seed 1: P0 attainment",),
    # Batch 61 (eight files written at stop 68 by a helper that had not read the controller,
    # judged as they stood at 2ddbf57 with `simulate --judge`): code-trace-medium2-gw3-1x,
    # heavytail-prio-h100x2-2.5x, p1-flood-vs-bursty-small7-gw2, seqcap-hog-medium8-seq16-2x
    # and slow3x-all-tiny5-gw4-prio-straggler-1.5x meet every target at seeds 1-3.
    # All five tiny engines slowed 3x behind four replicas (met every target as written). Since
    # stop 76 (P0 not held by the sequence count behind several replicas) seed 3's P0 reads
    # 0.990: two of 198 prompts, sent at 84 s in the slowdown to an engine running its
    # eight sequences with one to three waiting (TTFT 2.03 and 2.16 s against 2 s): the
    # trade of sending P0 on (its share of 40 sequences is whole), docs/design.md (stop 76).
    "holdout-b61-slow3x-all-tiny5-gw4-prio-straggler-1.5x": ("seed 3: P0 attainment",),
    # Do no harm on three pools of mixed engines (one H100, two medium, two tiny) behind two
    # replicas at 0.64x: P1 0.999 against `none`'s 1.000 at every seed. Looked at (seed 1): at
    # 20.0 s one replica's limit on the two tiny engines is cut for pressure (1.5) to what it
    # held in flight, 2,048 tokens, and regrows over about 2.5 s; three P1 requests arriving at
    # 20.5-21.3 s are refused at a forecast wait of 4.6-9.7 s against 4 s (the offered load
    # reads 1.1 of the cut limit, so the pool is not calm). Measured, not kept: calm judged
    # against the KV ceiling (one refused here; goodput cells 36 -> 49 elsewhere: design.md).
    "holdout-b61-calm-mixedprofiles-3pools-gw2": ("seed 1: P1 attainment",
                                                  "seed 2: P1 attainment",
                                                  "seed 3: P1 attainment"),
    # Do no harm on six small engines at 0.54-0.69x, two P1 notebook tenants bursting to
    # 1.5-1.7x for 3-10 s with retries: 0.957 / 0.993 / 0.926 x none, P1 0.922 / 0.988 / 0.799
    # against 0.981 / 1.000 / 0.889. Looked at (seed 3): adaptive preempts nothing, holds about
    # 88 requests in flight (6.4 s each) with ~100 P1 queued, and 145 P1 requests are late in
    # the gateway's queue and 88 on a retry; `none` preempts 178 times and is late on 129,
    # inside the engines, and its P0 reads 0.919 / 0.974 / 0.751 against adaptive's 1.000
    # (TTFT inside the engines). A higher KV target (0.9, 0.95) does not close it: seed 3 P1
    # 0.840 / 0.845, 0.965 / 0.971 x none, with 6 / 10 preemptions. Not traced further.
    "holdout-b61-calm-runall-bursts-small6": ("seed 1: adaptive", "seed 1: P1 attainment",
                                              "seed 2: P1 attainment", "seed 3: adaptive",
                                              "seed 3: P1 attainment"),
    # Code completion at 3x on five small engines, P0 with a 6 s deadline, a quarter of P1
    # cancelled by its clients: P0 0.989 / 0.985 at seeds 1-2, TTFT inside an engine and one
    # TPOT each. Not traced.
    "holdout-b61-code-deadline-cancel-small5-3x": ("seed 1: P0 attainment",
                                                   "seed 2: P0 attainment"),
    # Batch 62 (eight files written at stop 69 by a helper that had not read the controller,
    # judged as they stood at cda6b58 with `simulate --judge`): calm-eagerretry-small4-gw2,
    # heavytail-reasoning-stopbutton-small5-gw2-2.5x, seqcap-tpotguard-h100x3-seq48-gw2-2x and
    # slow3x-four-of-medium5-gw3-retry-1.5x meet every target at seeds 1-3.
    # p1-flood-agentloop-h100x2-gw3 (one tenant's agent loop flooding P1 at 10x its share on
    # two H100s behind three replicas, the steady P1 tenants sending 20 s deadlines) read
    # 0.870 / 0.847 / 0.861 of the best fixed limit: the pool decoded at 0.101 s a token,
    # within the 0.12 s ITL target, and 772 P1 answers reached their deadline mid-answer at
    # seed 2 (static:128: 0.059 s, 68). Met since stop 70, whose limiter tightens its ITL
    # target while such answers are cut (core/deadline_pace.py): 0.962 / 0.960 / 0.956
    # (seeds 4-6: 0.967 / 0.984 / 0.950). Not traced:
    # A Monday-morning ramp on two medium engines behind four replicas at 0.62-0.67x, P0 with
    # a 15 s client deadline: P0 0.922 / 0.884 / 0.928, every miss a request its client
    # cancelled at the deadline; `none` 0.930 / 0.901 / 0.932, and no fixed limit of the sweep
    # keeps P0 either.
    "holdout-b62-calm-morningwave-medium2-gw4": ("seed 1: P0 attainment",
                                                 "seed 2: P0 attainment",
                                                 "seed 3: P0 attainment"),
    # Code completion at 3x on four medium engines behind four replicas, P1 and P2 retrying
    # every refusal at once: P0 0.936 / 0.947 / 0.950, every miss a TPOT (short answers beside
    # prefill chunks), and 0.937 of the best fixed limit at seed 2.
    "holdout-b62-code-3x-medium4-gw4-immediate-retry": ("seed 1: P0 attainment",
                                                        "seed 2: adaptive",
                                                        "seed 2: P0 attainment",
                                                        "seed 3: P0 attainment"),
    # Inline completion and next-edit suggestions at 1x on three small engines behind two
    # replicas: P0 0.985 / 0.972 / 0.980, TPOT beside prefill chunks (2-4 a seed) and one
    # TTFT inside an engine at seeds 2-3.
    "holdout-b62-code-inline-nextedit-small3-gw2-1x": ("seed 1: P0 attainment",
                                                       "seed 2: P0 attainment",
                                                       "seed 3: P0 attainment"),
    # Batch 63 (eight files written at stop 69 by a second helper, judged the same way):
    # calm-rag-mixedcards-medium4-gw2, p1-flood-pulse20s-small6-gw3,
    # seqcap-medium4-halfkv-seq24-gw3-2x and slow3x-two-of-three-pools-gw2-1.5x meet every
    # target at seeds 1-3. Not traced:
    # Do no harm for chat in waves with cancellations on three small engines behind four
    # replicas at 0.63-0.72x: P1 0.928 / 0.985 against `none`'s 0.950 / 0.990 at seeds 1-2.
    "holdout-b63-calm-chat-cancel-bursty-small3-gw4": ("seed 1: P1 attainment",
                                                       "seed 2: P1 attainment"),
    # Code completion at 1x on eight tiny engines behind four replicas: P0 0.909 / 0.867 /
    # 0.900, TTFT inside the engines (prompts of ~2,200 tokens on engines of 4,096 KV tokens),
    # as on holdout-b60-code-minutes-tiny7-p0onoff-3x; no fixed limit of the sweep keeps P0.
    "holdout-b63-code-onoff-tiny8-gw4-1x": ("seed 1: P0 attainment", "seed 2: P0 attainment",
                                            "seed 3: P0 attainment"),
    # Two products' code completion at 3x on three medium engines behind two replicas: P0
    # 0.947 / 0.967 / 0.973, every miss a TPOT beside prefill chunks.
    "holdout-b63-code-twoapps-medium3-gw2-3x": ("seed 1: P0 attainment",
                                                "seed 2: P0 attainment",
                                                "seed 3: P0 attainment"),
    # Heavy-tailed answers at 2.5x on two H100s behind two replicas, P1 deadlines: 0.945 of
    # the best fixed limit (static:192) at seed 2.
    # holdout-b63-heavytail-deadline-h100x2-gw2-2.5x meets every target at seeds 1-3 since stop 71;
    # its entry is gone.
    # Batch 64 (eight files written at stop 70 by a helper that had not read the controller,
    # every one with client deadlines on at least one class, judged as they stood with stop
    # 70's controller): calm-voice-booking-bursty-tiny3-gw3, code-ghosttext-deadline-tiny2-
    # kv16k-gw2-1x and seqcap-guardrail-h100x2-seq24-gw4-2x meet every target at seeds 1-3.
    # Not traced:
    # Do no harm on a workday ramp with stop-button cancellations on five medium engines at
    # 0.59-0.74x: P1 0.982 / 0.989 against `none`'s 0.984 / 0.990 at seeds 1-2.
    "holdout-b64-calm-workday-ramp-cancel-medium5": ("seed 1: P1 attainment",
                                                     "seed 2: P1 attainment"),
    # Pre-commit code waves at about 3x on four medium engines, IDE P0 with a 6 s deadline:
    # P0 0.865-0.869 (27-35 cancelled at the deadline, 16-23 TPOT a seed), and 0.875 of the
    # best fixed limit at seed 1. The best fixed limit keeping P0 is 0.63-0.85 of the best's.
    # Since stop 71: 0.852 / 0.873 / 1.010 of static:48 (fixed limits gained more), P0 0.906 / 0.890
    # / 0.870.
    "holdout-b64-code-precommit-medium4-gw2-3x": ("seed 1: adaptive",
                                                  "seed 1: P0 attainment",
                                                  "seed 2: adaptive",
                                                  "seed 2: P0 attainment",
                                                  "seed 3: P0 attainment"),
    # Heavy tails at 2.1-2.75x on four small engines behind four replicas: P0 0.984 at seed 3
    # (one TTFT inside an engine); no fixed limit of the sweep keeps P0 at seeds 2-3.
    "holdout-b64-heavytail-agent-report-deadlines-small4-gw4-2.5x": ("seed 3: P0 attainment",),
    # An eval harness flooding P1 at 10x a team's share, retrying at once, on three medium
    # engines behind four replicas; voice P0 with an 8 s deadline: P0 0.831-0.863, 51-61 a
    # seed cancelled at the deadline (70-token answers: not traced where they waited). The
    # best fixed limit keeping P0 (static:16) is 0.69-0.70 of the best's goodput.
    "holdout-b64-p1-flood-retrying-harness-medium3-gw4": ("seed 1: P0 attainment",
                                                          "seed 2: P0 attainment",
                                                          "seed 3: P0 attainment"),
    # All six small engines slowed 3x for 40 s at 1.5x, phone P0 with an 8 s deadline: P0
    # 0.919-0.927, 9-10 a seed cancelled at it; no fixed limit of the sweep keeps P0.
    "holdout-b64-slow3x-all-ivr-small6-gw3-1.5x": ("seed 1: P0 attainment",
                                                   "seed 2: P0 attainment",
                                                   "seed 3: P0 attainment"),
    # Batch 65 (eight files written at stop 70 by a helper that had not read the controller,
    # judged as they stood with stop 70's controller): calm-translation-ramp-medium3-gw3,
    # heavytail-translation-medium4-gw2-2.5x, p1-flood-launchday-h100x3-gw4,
    # seqcap-lora-medium3-seq12-gw4-2x and slow3x-chiller-small5-gw2-deadline-1.5x meet every
    # target at seeds 1-3. Not traced:
    # Do no harm after an outage on five tiny engines at 0.65-0.70x (support chat at about
    # 1.1x capacity for 30 s): P1 0.975 / 0.920 / 0.951 against `none`'s 0.996 / 0.948 / 0.985.
    "holdout-b65-calm-support-aftermath-tiny5": ("seed 1: P1 attainment",
                                                 "seed 2: P1 attainment",
                                                 "seed 3: P1 attainment"),
    # Code completion with a LoRA per customer at 1x on three small engines (one an older card
    # with less KV) behind three replicas: P0 0.955 / 0.973 / 0.947, TPOT beside prefill
    # chunks and TTFT inside the engines; no fixed limit of the sweep keeps P0.
    "holdout-b65-code-lora-mixedcards-small3-gw3-1x": ("seed 1: P0 attainment",
                                                       "seed 2: P0 attainment",
                                                       "seed 3: P0 attainment"),
    # A live-coding workshop's waves of code completion at about 3x on four medium engines:
    # 0.833 / 0.847 / 0.846 of the best fixed limit (static:48-64), P0 0.971 / 0.970 / 0.959,
    # every P0 miss a TPOT (10-16 a seed). The best fixed limit keeping P0 is 0.73-0.80 of
    # the best's goodput.
    # Since stop 71: adaptive's goodput 391-400 -> 634-659 tok/s, 0.922 / 1.007 / 0.940 of static:96
    # (which gained as much: the rule is the queue's), P0 0.966 / 0.953 / 0.944.
    "holdout-b65-code-workshop-waves-medium4-3x": ("seed 1: adaptive",
                                                   "seed 1: P0 attainment",
                                                   "seed 2: P0 attainment",
                                                   "seed 3: adaptive",
                                                   "seed 3: P0 attainment"),
    # Batch 66 (eight files written at stop 72 by a helper that had not read the controller,
    # judged as they stood with stop 71's controller): calm-trace-5tenants-small5-gw3,
    # heavytail-research-agents-medium7-3x, p1-flood-cron-sawtooth-small4-gw3 and
    # seqcap-stated-small5-seq6-ramp-2x meet every target at seeds 1-3; adaptive's goodput is
    # 0.96-1.06 of the best fixed limit in all eight.
    # Code completion in waves at about 3x on three tiny engines behind three replicas: P0
    # 0.969 at seed 2, four prompts prefilled behind others' in the engines; no fixed limit of
    # the sweep keeps P0 at seeds 1-2.
    "holdout-b66-code-hackathon-ramp-tiny3-gw3-3x": ("seed 2: P0 attainment",),
    # Code completion in work blocks at about 1x on two H100s behind four replicas: P0 0.913 /
    # 0.931 / 0.948, every miss a TPOT (45 / 36 / 27): short answers decoded beside prefill
    # chunks, as b56's H100 files. No fixed limit of the sweep keeps P0 at seeds 1-2; at seed
    # 3 static:8 does, at 0.963 of the best's goodput.
    "holdout-b66-code-monorepo-h100x2-gw4-1x": ("seed 1: P0 attainment",
                                                "seed 2: P0 attainment",
                                                "seed 3: P0 attainment"),
    # Clients that retry every way at about 1.8x on four medium engines, P0 sending a 6 s
    # deadline over answers of ~120 tokens (up to 600): P0 0.372 / 0.427 / 0.403, 279-319 a
    # seed cut at the deadline at a decode pace of 0.05-0.08 s a token. No fixed limit of the
    # sweep keeps P0: static:8 comes nearest (0.929 at seed 1, at 0.23 of the best's goodput),
    # static:96 (the best) reads 0.354. The deadline pace does not step for it: its floor (half
    # the policy's ITL target, 0.06 s) would still cut most of them. What would meet it is P0
    # decoded faster than the rest (an engine that runs a small batch), not a pool-wide pace.
    "holdout-b66-retry-mix-p0deadline-medium4-gw2-1.8x": ("seed 1: P0 attainment",
                                                          "seed 2: P0 attainment",
                                                          "seed 3: P0 attainment"),
    # Half of six small engines slowed 2.5x at about 1.5x, one of them leaving at 75 s: P0
    # 0.969 / 0.980 at seeds 1-2, six and four P0 requests decoding on the engine as it left
    # (placed there while its inter-token latency read within the ITL target).
    "holdout-b66-slow2.5x-half-then-crash-small6-gw2-1.5x": ("seed 1: P0 attainment",
                                                             "seed 2: P0 attainment"),
    # Batch 67 (eight files written at stop 73 by a helper that had not read the controller,
    # judged as they stood with stop 72's controller): calm-cityhall-6t-h100-gw2,
    # code-classroom-squeeze-small3-mbt1k-gw4-3x, heavytail-legal-redline-medium3-gw2-2.5x,
    # p1-flood-overstated-maxtokens-medium2-gw2 and seqcap-unequal-h100x2-seq16-gw3-2x meet
    # every target at seeds 1-3; adaptive's goodput is 0.95-1.07 of the best fixed limit in
    # all eight but one cell (below).
    # Code completion in out-of-phase typing flickers at about 1x on five small engines with
    # priority scheduling: P0 0.955 / 0.966 / 0.935, every miss a TPOT (8 / 7 / 14): short
    # answers decoded beside prefill chunks, as b56's and b66's code files. static:8 keeps P0
    # at seeds 1-2 at 0.966 / 0.983 of the best's goodput; no fixed limit of the sweep at 3.
    "holdout-b67-code-keystroke-flicker-small5-gw2-prio-1x": ("seed 1: P0 attainment",
                                                              "seed 2: P0 attainment",
                                                              "seed 3: P0 attainment"),
    # Kiosks, shelf labels, leaflets and a price job retrying every way at about 1.9x on six
    # tiny engines: adaptive 0.950 / 0.962 / 0.903 of static:24, which loses P0 (0.965 at seed
    # 3); static:16 keeps P0 at 0.948 / 0.953 / 0.940 of it. P0 is met at every seed (0.997-
    # 1.000). Traced at seed 3 (means over 10-170 s): adaptive runs the engines at KV 0.70
    # with 28 sequences running and 0.5 waiting, static:16 at 0.73 / 29 / 1.8, static:24 at
    # 0.88 / 35 / 11 (its preemptions 1,807 against 599: cheap to recompute on prompts of
    # 350-700 tokens) for 8 % more throughput. The KV target's trade (docs/design.md); P1 and
    # P2 are cut by their clients' deadlines and timeouts in either. At timing draw 1 adaptive
    # reads 0.917-0.947 at seeds 1-3.
    "holdout-b67-deadline-retry-kiosk-tiny6-gw2-2x": ("seed 3: adaptive",),
    # Two of five medium engines slowed 3x and a third 2x, which then leaves and returns, at
    # about 1.5x: P0 0.986 / 0.980 / 0.989, 3 / 5 / 3 requests decoding on the engine as it
    # left and 2 / 3 / 1 TPOTs. static:48 keeps P0 at seeds 1 and 3 at 0.936 / 0.929 of the
    # best's goodput, static:24 at seed 2 at 0.660.
    "holdout-b67-slow-noisy-cotenant-drain-medium5-gw3-1.5x": ("seed 1: P0 attainment",
                                                               "seed 2: P0 attainment",
                                                               "seed 3: P0 attainment"),
    # Batch 68 (stop 74). Code completion at about 3x on two medium engines with a 2,048-token
    # step budget, four replicas, P0 and P1 only: adaptive 0.916 / 0.952 / 0.883 of
    # static:16 / 16 / 12. Traced at seed 3: the engines are prefill-bound (each step carries
    # one prompt's chunk), so one or two requests wait in each engine at any moment; the limit
    # reads that as a queue over its target (waitingTarget 1) and holds about 35 requests in
    # flight where static:12 holds 48, whose larger decode batch rides the same prefill steps
    # (throughput 326 against 356 tokens/s; P0 1.000 under both). Judging the engines' queue
    # by its queue time instead (docs/design.md, stop 74) lost P0 on 59 runs of the grid.
    "holdout-b68-code-assessment-cohorts-medium2-mbt2k-gw4-3x": ("seed 1: adaptive",
                                                                 "seed 3: adaptive"),
    # An airline's storm day on four small engines: P0 replays the conversation trace (answers
    # of 250-350 tokens) under a 20 s client deadline, and 30-33 P0 answers a seed are cut by
    # it; no fixed limit of the sweep keeps P0 (the deadline cuts family).
    "holdout-b68-deadline-irops-trace-small4-gw3-2x": ("seed 1: P0 attainment",
                                                       "seed 2: P0 attainment",
                                                       "seed 3: P0 attainment"),
    # Seven medium engines capped at 10 sequences (not stated in the policy): at seed 1 four
    # P0 requests sent at 7-9 s waited 2.1-3.3 s inside engines that had filled their
    # sequences before any scrape showed the cap binding (as the built-in seq-cap; stating
    # maxNumSeqs is the remedy, docs/policy.md), one more queued at the gateway.
    "holdout-b68-seqcap-telco-care-medium7-seq10-gw1-2x": ("seed 1: P0 attainment",),
    # Batch 69 (stop 75). A library's one medium engine behind three replicas, calm (0.66-0.70)
    # with short P1 pushes: 5 / 1 / 11 P1 requests refused for their forecast wait in the
    # pushes (seed 3 at 70-75 s) where `none` serves them (P1 0.984 / 0.997 / 0.938 against
    # 1.000 / 1.000 / 0.963); goodput 0.996-1.033 of `none`'s.
    "holdout-b69-calm-library-thesisweek-medium1-gw3": ("seed 1: P1 attainment",
                                                        "seed 2: P1 attainment",
                                                        "seed 3: P1 attainment"),
    # Code completion at about 3x on four H100s behind three replicas: P0 0.977 / 0.987 /
    # 0.987, 13 / 8 / 7 TPOTs, all answers of 3-19 tokens decoded in steps that carry other
    # prompts' 8,192-token chunks (the short answers' TPOT family; static:48 keeps P0 at seed 1,
    # static:32 at seed 2 at 0.950 of the best's goodput).
    "holdout-b69-code-migrationday-h100x4-gw3-3x": ("seed 1: P0 attainment",
                                                    "seed 2: P0 attainment",
                                                    "seed 3: P0 attainment"),
    # Two small engines capped at five sequences behind four replicas (2.5 sequences each):
    # P0 0.29-0.47 until stop 76, its requests waiting at their replica for one of its own
    # sequences to end (2 s TTFT); no fixed limit of the sweep keeps P0, and engines run by
    # priority did not either (0.458 at seed 1). Since the shares are rounded down below P0
    # and P0 is sent on (stop 76): 0.938 / 1.000 / 0.983, the misses TTFT inside an engine
    # (3 / 0 / 1), goodput 0.983-0.989 of `static:3`.
    "holdout-b69-seqcap-discharge-letters-small2-seq5-gw4-2x": ("seed 1: P0 attainment",
                                                                "seed 3: P0 attainment"),
    # Two of three H100s slowed 2x then 4x in turn under about 1.5x, one replica: P0 0.871 /
    # 0.849 / 0.847 (TPOT and TTFT inside the slowed engines). Traced at seed 1: the picker
    # reads an engine slow from its last scrape's ITL, which swings 0.06-0.6 s between scrapes
    # with and without an 8,192-token prefill step, so P0 went to the engine slowed 2x whenever
    # its last scrape read fast and it had no queue. static:256 keeps P0 at 0.91-0.93 of
    # static:512's goodput (docs/design.md, stop 75).
    "holdout-b69-slow2x-4x-irqstorm-h100x3-gw1-1.5x": ("seed 1: P0 attainment",
                                                       "seed 2: P0 attainment",
                                                       "seed 3: P0 attainment"),
    # Batch 70 (stop 76; judged at 2bef698): the P1 flood on three medium engines (one with
    # half its KV) behind four replicas and the sequence cap of 8 on three medium engines
    # behind two replicas meet every target at seeds 1-3.
    # A credit union's calm day on four tiny engines, one replica (0.61-0.69): at seed 3 30 P1
    # requests refused for their forecast wait in bursts at 10-117 s, P1 0.957 against `none`'s
    # 0.961 (the calm early-drop trade of batches 53-69).
    "holdout-b70-calm-creditunion-tiny4-gw1": ("seed 3: P1 attainment",),
    # Code completion at 1x on six small engines behind three replicas: P0 0.987 / 0.986,
    # two TTFTs inside the engines and one TPOT each (static:8 keeps P0 at seed 1 at 0.928 of
    # the best's goodput). Not traced further.
    "holdout-b70-code-ecu-shifts-small6-gw3-1x": ("seed 1: P0 attainment",
                                                  "seed 2: P0 attainment"),
    # Code completion at 3x on five tiny engines, one replica: P0 0.927 / 0.947 at seeds 1 and
    # 3, every miss TTFT inside an engine. Looked at (seed 1): P0 prompts of 0.9-2.5k tokens
    # sent to an engine with one other request in prefill waited 2.3-5.5 s behind it (tiny
    # engines prefill slowly); the best fixed limit keeping P0 is static:2, at 0.52-0.54 of
    # the best's goodput.
    "holdout-b70-code-mooc-duehour-tiny5-gw1-3x": ("seed 1: P0 attainment",
                                                   "seed 3: P0 attainment"),
    # Food delivery with client deadlines and retries on five small engines behind three
    # replicas, 1.8x: P0 0.910-0.923, 13-17 P0 requests a seed cancelled at their clients'
    # deadline; no fixed limit of the sweep keeps P0 at seeds 1 and 3 (static:8 at seed 2, at
    # 0.662 of the best's goodput). Looked at (seed 1): each of the 14 had its first token
    # within 0.3 s and was cut mid-answer at the 8 s deadline, on engines running 10-17
    # sequences; the first five were answers of 166-300 tokens (~80 on average), which need
    # 26-46 ms a token (P0 cut at its clients' deadlines, as in batches 64-68).
    "holdout-b70-deadline-fooddelivery-small5-gw3-1.8x": ("seed 1: P0 attainment",
                                                          "seed 2: P0 attainment",
                                                          "seed 3: P0 attainment"),
    # Heavy-tailed answers at 2.5x on two H100s behind two replicas: P0 0.985 / 0.990 / 0.990
    # (just under), 3-4 TPOTs a seed; static:96-128 keeps P0 at 0.86-0.92 of static:192's
    # goodput. The TPOT-under-long-batches family of the heavy-tail files. Not traced.
    "holdout-b70-heavytail-questwriter-h100x2-gw2-2.5x": ("seed 1: P0 attainment",
                                                          "seed 2: P0 attainment",
                                                          "seed 3: P0 attainment"),
    # Four medium engines, all slowed 2x, then two of them 3.5x, under 1.5x, one replica: P0
    # 0.954 / 0.971 at seeds 1-2, all TPOT (6 / 4); static:64 keeps P0 at 0.86-0.88 of
    # static:96's goodput. Not traced.
    "holdout-b70-slow2x-3.5x-backup-storm-medium4-gw1-1.5x": ("seed 1: P0 attainment",
                                                              "seed 2: P0 attainment"),
}

HOLDOUT = Path(__file__).parent / "data" / "holdout"
FULL = bool(os.environ.get("LLMVALVE_ISSUE10_FULL"))
ON_REQUEST = pytest.mark.skipif(not FULL, reason="set LLMVALVE_ISSUE10_FULL=1 to run")


def judged_runs(sc: Scenario, seeds: list[int]) -> dict[str, dict]:
    """Per seed, `none` and `adaptive` with their ratios to the oracles, as
    `simulate --oracle` reports them. The best fixed limit's goodput and what `none` gave
    come from tests/oracle_cache.py when it was computed from this source (only `adaptive`
    runs here), else from the sweep run here (nine of each seed's eleven runs)."""
    cache = oracle_cache.cached(sc.name, seeds)
    if cache is None:
        res, _ = simulate_seeds(sc, list(targets.JUDGED), seeds, oracle=True, hindsight=False)
        return res["seeds"]["runs"]
    runs = {}
    for seed in seeds:
        r, _ = simulate(sc, ["adaptive"], seed)
        none = r["controllers"]["none"] = cache[str(seed)]["none"]
        oracles = {"fixed": {"goodput_tok_s": cache[str(seed)]["fixed"]},
                   "none": {"goodput_tok_s": none["goodput_tok_s"]}}
        r["vs_oracle"] = {c: ratios(v["goodput_tok_s"], oracles)
                          for c, v in r["controllers"].items()}
        runs[str(seed)] = r
    return runs


def misses(scenario: str, seeds: list[int] = SEEDS) -> list[str]:
    """Every target the scenario misses, one line each (empty: all met)."""
    sc = load_scenario(scenario)
    runs = judged_runs(sc, seeds)
    out = targets.misses(sc, runs)
    old = OLD_BASELINE.get(sc.name)
    if old is None:
        return out
    for seed, r in runs.items():
        before = old[SEEDS.index(int(seed))]
        goodput = r["controllers"]["adaptive"]["goodput_tok_s"]
        if goodput < (1 - OLD_REGRESSION) * before:
            out.append(f"seed {seed}: goodput {goodput:.0f} < baseline {before:.0f} - "
                       f"{OLD_REGRESSION:.0%}")
    return out


def _fleet_scale(name: str) -> bool:
    return load_scenario(name).backends >= FLEET_SIZE


ORDINARY = [n for n in builtin_names() if not _fleet_scale(n)]
FLEET = [n for n in builtin_names() if _fleet_scale(n)]


def judge(name: str, found: list[str]) -> None:
    known = KNOWN_MISSES.get(name, ())
    unexpected = [m for m in found if not m.startswith(known)]
    assert not unexpected, f"{name}:\n" + "\n".join(unexpected)
    met_again = [k for k in known if not any(m.startswith(k) for m in found)]
    assert not met_again, f"{name}: met again, remove from KNOWN_MISSES: {met_again}"
    if found:
        pytest.xfail(f"{name}: known misses: " + "; ".join(found))


@pytest.mark.slow
@pytest.mark.parametrize("name", ORDINARY)
def test_adaptive_meets_issue_10_targets(name):
    judge(name, misses(name))


@ON_REQUEST
@pytest.mark.slow
# three seeds with the oracle sweep: 177 s beside one make test, past 300 s beside another
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", FLEET)
def test_fleet_scale_meets_issue_10_targets(name):
    found = misses(name)
    assert not found, f"{name}:\n" + "\n".join(found)


@ON_REQUEST
@pytest.mark.slow
@pytest.mark.timeout(1800)  # four H100s at 3x with their sweep took over 300 s on a busy machine
@pytest.mark.parametrize("path", sorted(HOLDOUT.glob("*.yaml")), ids=lambda p: p.stem)
def test_held_out_workloads_meet_issue_10_targets(path):
    judge(path.stem, misses(str(path)))


def test_every_built_in_is_judged():
    assert sorted(ORDINARY + FLEET) == builtin_names()
    assert len(list(HOLDOUT.glob("*.yaml"))) >= 2


def test_the_held_out_counts_in_the_docs_match_known_misses():
    """README and docs/held-out.md give the held-out counts at seeds 1-3: files, those that
    meet every target, the target cells missed and the files in `KNOWN_MISSES` (stop 73's
    docs said 269 cells where `KNOWN_MISSES` listed 265)."""
    files = {p.stem for p in HOLDOUT.glob("*.yaml")}
    listed = {k: v for k, v in KNOWN_MISSES.items() if k in files}
    cells = sum(len(v) for v in listed.values())
    claim = (f"At seeds 1–3, {len(files) - len(listed)} meet every target and {cells} target "
             f"cells are missed; the other {len(listed)}")
    root = Path(__file__).parent.parent
    for doc, total in (("README.md", f"on {len(files)} held-out workloads"),
                       ("docs/held-out.md", f"{len(files)} files. {claim}")):
        text = " ".join((root / doc).read_text().split())
        assert claim in text, f"{doc}: {claim!r}"
        assert total in text, f"{doc}: {total!r}"


def test_a_simulation_never_imports_the_docs_generators():
    """The oracle cache's key leaves out `oracle_cache.DOCS_ONLY`, so a judged simulation must
    not run their code."""
    code = ("import sys; from llmvalve.cli import main; "
            "main(['simulate', '--scenario', 'calm-steady', '--oracle', '--judge']); "
            f"print(sorted(set({oracle_cache.DOCS_ONLY!r}) & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_oracle_cache_is_what_the_sweep_gives():
    """The cached best fixed limit is the sweep's own result at this source, and the cached
    `none` what `none` gives run alone, as the judgement would run it (one cheap built-in,
    one seed)."""
    cache = oracle_cache.cached("calm-steady", [1])
    if cache is None:
        pytest.skip("tests/data/oracle-cache.json is stale: the judgement runs the sweep itself "
                    "(refresh it: python tests/oracle_cache.py)")
    sc = load_scenario("calm-steady")
    res, _ = simulate_seeds(sc, ["none"], [1], oracle=True, hindsight=False)
    alone, _ = simulate(sc, ["none"], 1)
    assert cache["1"]["fixed"] == res["oracles"]["fixed"]["goodput_tok_s"]
    assert cache["1"]["none"] == oracle_cache.none_summary(alone["controllers"]["none"])
