"""A multi-pool scenario through real processes: each pool's simulated backends (its count and
engine profile, serving the pool's first model under that name, as a vLLM server started with
`--served-model-name` would), and for the `none` mode Envoy's routes from the request's model
header to the pool's cluster (Envoy alone cannot read the body's `model`; the load generator
sends both, as the simulator's gateway does).

Backends are numbered across the pools in the scenario's pool order, as in `simulate`: the
capacity events, the collector and the time series use those numbers."""

from __future__ import annotations

from typing import Any

from llmvalve.backend.engine_flags import profile_args
from llmvalve.core.policy import Policy
from llmvalve.engine.profiles import get_profile
from llmvalve.sim.scenario import PoolDef
from llmvalve.stack import READY_LINE, Proc, wait_until


def served_model(pool: PoolDef) -> str:
    return pool.models[0] if pool.models else get_profile(pool.profile).model


def backend_argv(stack: Any, pool: PoolDef) -> list[str]:
    """The command of one of the pool's backends: its profile and overrides, its model."""
    c = stack.config
    return stack._py("sim-backend", "--host", c.host, "--port", "0", "--profile", pool.profile,
                     "--model", served_model(pool), "--time-scale", str(c.time_scale),
                     *c.backend_args, *profile_args(pool.profile_overrides))


def start_pool_backends(stack: Any, layout: tuple[PoolDef, ...]) -> None:
    """Start every pool's backends on `stack` (a `Stack`): `pool_backends` by pool name, and
    `backends` the first pool's (as `Stack.start_backends` leaves them)."""
    pending: list[tuple[str, Proc]] = []
    for pool in layout:
        for i in range(pool.backends):
            name = f"{pool.name}-{i}"
            pending.append((pool.name, Proc(name, backend_argv(stack, pool),
                                            stack.workdir / f"{name}.log")))
    ports: dict[int, int] = {}

    def ready() -> bool:
        for k, (_, proc) in enumerate(pending):
            if k in ports:
                continue
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.output()[-2000:].decode()}")
            match = READY_LINE.search(proc.output())
            if match:
                ports[k] = int(match.group(2))
        return len(ports) == len(pending)

    try:
        wait_until(ready, 30.0, "the simulated backends")
    finally:
        for k, (pool_name, proc) in enumerate(pending):
            stack.pool_backends.setdefault(pool_name, []).append((proc, ports.get(k, 0)))
    stack.backends = stack.pool_backends[layout[0].name]


def all_backends(stack: Any, layout: tuple[PoolDef, ...]) -> list:
    """Every backend (proc, port) in scenario order."""
    if len(layout) <= 1:
        return list(stack.backends)
    return [b for pool in layout for b in stack.pool_backends.get(pool.name, [])]


def none_clusters(stack: Any, policy: Policy) -> dict[str, tuple[tuple[str, int], ...]]:
    """Envoy alone: each pool's cluster and its endpoints, the first pool's first."""
    host = stack.config.host
    return {p.cluster: tuple((host, port) for _, port in stack.pool_backends.get(p.name, []))
            for p in policy.pools}


def model_routes(policy: Policy) -> dict[str, str]:
    """model → the cluster of the pool serving it (the catch-all pool takes the rest)."""
    return {m: p.cluster for p in policy.pools for m in p.models}
