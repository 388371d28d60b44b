"""The engine settings a sim-backend takes on its command line, under vLLM's flag names, so a
scenario's backend overrides (`maxNumSeqs`, `kvBlocks`, `maxBatchedTokens`, `schedulingPolicy`)
start the same engines under `bench` as under `simulate`."""

from __future__ import annotations

import argparse
from dataclasses import replace

from llmvalve.engine.profiles import EngineProfile, get_profile

# EngineProfile field → the flag that sets it
PROFILE_FLAGS = {"max_num_seqs": "--max-num-seqs",
                 "max_num_batched_tokens": "--max-num-batched-tokens",
                 "num_gpu_blocks": "--num-gpu-blocks-override",
                 "scheduling_policy": "--scheduling-policy"}


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine settings (vLLM's flags of the same names; "
                                       "default: the profile's)")
    engine.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default=None,
                        help="priority schedules and preempts by the body's `priority` (lower "
                        "first); fcfs (the profiles') answers 400 to one other than 0")
    for flag, what in (("--max-num-seqs", "sequences the engine runs at once"),
                       ("--max-num-batched-tokens", "tokens one engine step takes"),
                       ("--num-gpu-blocks-override", "KV cache blocks")):
        engine.add_argument(flag, type=int, default=None, metavar="N", help=what)


def profile_args(overrides: tuple[tuple[str, int | str], ...]) -> tuple[str, ...]:
    """The flags that start a sim-backend with a scenario's profile overrides."""
    return tuple(x for attr, value in overrides for x in (PROFILE_FLAGS[attr], str(value)))


def profile_from(args: argparse.Namespace) -> EngineProfile:
    """`--profile` with the engine flags applied; ValueError for a value vLLM would refuse."""
    overrides: dict[str, int | str] = {}
    for attr, flag in PROFILE_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{flag} must be ≥ 1")
        if value is not None:
            overrides[attr] = value
    profile = replace(get_profile(args.profile), **overrides)  # type: ignore[arg-type]
    if why := profile.startup_error():
        raise ValueError(why)
    return profile
