"""Scenarios are data: YAML files naming backends, capacity events, gateways, traffic classes and
the policy. Built-ins live in `sim/scenarios/`; a file path works wherever a name does.
docs/scenarios.md is the reference for every key; `scenario_load` reads and checks the YAML."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from llmvalve.core.policy import Policy
from llmvalve.engine.profiles import EngineProfile, get_profile


class ScenarioError(ValueError):
    """A scenario that cannot be used; one line per problem (file:line: field: message)."""


@dataclass(frozen=True)
class Dist:
    """A length distribution: lognormal with a mean and a coefficient of variation, or fixed."""

    mean: float
    cv: float = 0.0
    min: int = 1
    max: int = 1_000_000


@dataclass(frozen=True)
class RetrySpec:
    mode: str = "none"  # none | jitter (honour Retry-After, full jitter) | immediate
    max_attempts: int = 3
    base_s: float = 1.0
    cap_s: float = 30.0
    # each attempt says how many came before it, in the policy's retry-count header (the
    # OpenAI and Anthropic SDKs send x-stainless-retry-count); None: `sends_count`'s default
    count_header: bool | None = None

    @property
    def sends_count(self) -> bool:
        """Jitter clients do (an SDK's back-off), immediate ones do not (a caller's loop that
        sends again), unless `count_header` says otherwise."""
        return self.mode == "jitter" if self.count_header is None else self.count_header


@dataclass(frozen=True)
class TraceSpec:
    file: str  # "azure-conv" or a CSV path (timestamp, prompt tokens, output tokens)
    speed: float = 1.0
    start_s: float = 0.0  # offset into the trace
    split: tuple[tuple[int, float], ...] = ((0, 0.2), (1, 0.4), (2, 0.4))  # priority → share
    # priority → tenants with their shares of that priority's requests (one tenant: all of them)
    tenants: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()


@dataclass(frozen=True)
class OnOff:
    """Bursty traffic: periods at `on` req/s alternate with periods at `off` req/s; each
    period's length is drawn uniformly from its range, per seed (a two-state modulated
    Poisson process). The first period is an on period."""

    on: float
    off: float = 0.0
    on_for_s: tuple[float, float] = (60.0, 60.0)
    off_for_s: tuple[float, float] = (60.0, 60.0)


@dataclass(frozen=True)
class TrafficClass:
    name: str
    priority: int = 0
    tenant: str = ""
    rate: tuple[tuple[float, float], ...] = ()  # (from time s, req/s) points
    ramp: bool = False  # False: each rate holds until the next point; True: linear between
    on_off: OnOff | None = None  # instead of `rate`
    prompt: Dist = Dist(500, 0.5)
    output: Dist = Dist(150, 0.5)
    max_tokens: int = 0  # 0 → 2 × output mean
    stream: bool = True
    cancel_prob: float = 0.0
    cancel_after_s: tuple[float, float] = (0.5, 5.0)
    # the client's deadline after its first attempt (0: none): it sends the time left in the
    # policy's deadline header and gives up when it passes, queued or mid-stream
    deadline_s: float = 0.0
    retry: RetrySpec = RetrySpec()
    trace: TraceSpec | None = None
    model: str = ""  # the OpenAI `model` its requests ask for ("": none; the first pool)


@dataclass(frozen=True)
class CapacityEvent:
    at_s: float
    backend: int
    slowdown: float | None = None
    leave: bool = False
    rejoin: bool = False
    kv_blocks: int | None = None


@dataclass(frozen=True)
class PoolDef:
    """One fleet of a multi-pool scenario: the policy pool it is, the models it serves and its
    backends. Backends are numbered across pools in pool order (capacity events use those
    numbers)."""

    name: str
    models: tuple[str, ...] = ()
    backends: int = 2
    profile: str = "small"
    profile_overrides: tuple[tuple[str, int | str], ...] = ()

    def engine_profile(self) -> EngineProfile:
        return replace(get_profile(self.profile), **dict(self.profile_overrides))


@dataclass(frozen=True)
class Scenario:
    name: str
    duration_s: float
    classes: tuple[TrafficClass, ...]
    description: str = ""
    seed: int = 1
    backends: int = 2
    profile: str = "small"
    profile_overrides: tuple[tuple[str, int | str], ...] = ()  # EngineProfile field → value
    events: tuple[CapacityEvent, ...] = ()
    gateways: int = 1
    scrape_interval_s: float = 0.5
    als_delay_s: float = 0.05
    # 0: scrapes and access-log entries on a fixed grid; k > 0: timing draw k (the harness draws
    # each scraper's phase and each entry's delay, as a real stack leaves them to chance).
    timing_draw: int = 0
    policy: Policy | None = None
    controllers: tuple[str, ...] = ("none", "static:32", "seed", "adaptive")
    oracle_sweep: tuple[int, ...] = (8, 12, 16, 24, 32, 40, 48, 64, 96)
    sweep_loads: tuple[float, ...] = ()  # overload-sweep: multipliers of the class rates
    extra: dict = field(default_factory=dict)  # `expect:` (what the scenario is judged on)
    # Several fleets, one policy pool each (the policy's pools are these; `backends` is then
    # their total and `profile` the first pool's). Empty: one pool, the policy's first.
    pools: tuple[PoolDef, ...] = ()

    def requests_bound(self, load_scale: float = 1.0) -> float:
        """At most about this many attempts are sent: each rate class at its peak (of its
        steps, or its on and off rates) for the whole run, at the largest of its loads (1 and
        `sweep_loads`), each request tried once and then as often as its retries allow
        (`maxAttempts` counts retries; traces are bounded by their files)."""
        peak = sum(max([r for _, r in c.rate]
                       + ([c.on_off.on, c.on_off.off] if c.on_off else []), default=0.0)
                   * (1 + (c.retry.max_attempts if c.retry.mode != "none" else 0))
                   for c in self.classes if c.trace is None)
        return peak * max((1.0, *self.sweep_loads)) * load_scale * self.duration_s

    def engine_profile(self) -> EngineProfile:
        """The backends' profile with the scenario's overrides (e.g. a smaller max_num_seqs)."""
        return replace(get_profile(self.profile), **dict(self.profile_overrides))

    def layout(self, policy: Policy) -> tuple[PoolDef, ...]:
        """Every pool with its backends: the scenario's pools, or the policy's first pool with
        the scenario's `backends` × `profile`."""
        if self.pools:
            return self.pools
        return (PoolDef(policy.pools[0].name, policy.pools[0].models, self.backends,
                        self.profile, self.profile_overrides),)

    def backend_pools(self, policy: Policy) -> list[PoolDef]:
        """The pool of each backend, by its scenario-wide number."""
        return [p for p in self.layout(policy) for _ in range(p.backends)]


def builtin_names() -> list[str]:
    files = resources.files("llmvalve.sim").joinpath("scenarios").iterdir()
    return sorted(p.name.removesuffix(".yaml") for p in files if p.name.endswith(".yaml"))


def builtin_dir() -> Path:
    return Path(str(resources.files("llmvalve.sim").joinpath("scenarios")))


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in by name, or a YAML file; relative paths inside resolve against its folder."""
    from llmvalve.sim.scenario_load import parse_scenario

    path = Path(name_or_path)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = (f"not UTF-8 text (byte {exc.start}); save it as UTF-8"
                      if isinstance(exc, UnicodeDecodeError) else str(exc))
            raise ScenarioError(f"{path}: cannot read: {reason}") from None
        return parse_scenario(text, str(path), base=path.resolve().parent)
    if path.is_dir():
        raise ScenarioError(f"{path}: a folder, not a scenario file")
    res = builtin_dir() / f"{name_or_path}.yaml"
    if path.suffix in (".yaml", ".yml") or not res.is_file():
        raise ScenarioError(
            f"no scenario {name_or_path!r}: no such file, and built-ins are "
            f"{', '.join(builtin_names())}")
    return parse_scenario(res.read_text(encoding="utf-8"), f"{name_or_path}.yaml",
                          base=builtin_dir())
