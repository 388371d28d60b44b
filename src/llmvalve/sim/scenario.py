"""Scenarios are data: YAML files naming backends, capacity events, gateways, traffic classes and
the policy. Built-ins live in `sim/scenarios/`; a file path works wherever a name does.
docs/scenarios.md is the reference for every key."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from llmvalve.core.policy import Policy
from llmvalve.core.policy_load import _parse_duration, load_policy, load_policy_file


class ScenarioError(ValueError):
    pass


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


@dataclass(frozen=True)
class TraceSpec:
    file: str  # "azure-conv" or a CSV path (timestamp, prompt tokens, output tokens)
    speed: float = 1.0
    start_s: float = 0.0  # offset into the trace
    split: tuple[tuple[int, float], ...] = ((0, 0.2), (1, 0.4), (2, 0.4))  # priority → share
    tenants: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class TrafficClass:
    name: str
    priority: int = 0
    tenant: str = ""
    rate: tuple[tuple[float, float], ...] = ()  # piecewise-constant (from time s, req/s)
    prompt: Dist = Dist(500, 0.5)
    output: Dist = Dist(150, 0.5)
    max_tokens: int = 0  # 0 → 2 × output mean
    stream: bool = True
    cancel_prob: float = 0.0
    cancel_after_s: tuple[float, float] = (0.5, 5.0)
    retry: RetrySpec = RetrySpec()
    trace: TraceSpec | None = None


@dataclass(frozen=True)
class CapacityEvent:
    at_s: float
    backend: int
    slowdown: float | None = None
    leave: bool = False
    rejoin: bool = False
    kv_blocks: int | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    duration_s: float
    classes: tuple[TrafficClass, ...]
    description: str = ""
    seed: int = 1
    backends: int = 2
    profile: str = "small"
    events: tuple[CapacityEvent, ...] = ()
    gateways: int = 1
    scrape_interval_s: float = 0.5
    als_delay_s: float = 0.05
    policy: Policy | None = None
    controllers: tuple[str, ...] = ("none", "static:32", "seed", "adaptive")
    oracle_sweep: tuple[int, ...] = (8, 12, 16, 24, 32, 40, 48, 64, 96)
    sweep_loads: tuple[float, ...] = ()  # overload-sweep: multipliers of the class rates
    extra: dict = field(default_factory=dict)


def builtin_names() -> list[str]:
    files = resources.files("llmvalve.sim").joinpath("scenarios").iterdir()
    return sorted(p.name.removesuffix(".yaml") for p in files if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return parse_scenario(path.read_text(), str(path), base=path.parent)
    res = resources.files("llmvalve.sim").joinpath("scenarios", f"{name_or_path}.yaml")
    if not res.is_file():
        raise ScenarioError(
            f"no scenario {name_or_path!r}: not a file, and built-ins are "
            f"{', '.join(builtin_names())}")
    return parse_scenario(res.read_text(), f"{name_or_path}.yaml", base=None)


def _dur(v: object, where: str) -> float:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    d = _parse_duration(str(v)) if isinstance(v, str) else None
    if d is None or d < 0:
        raise ScenarioError(f"{where}: {v!r} is not a duration (e.g. 8s, 150ms, 2m)")
    return d


def _dist(d: dict | float | int, where: str) -> Dist:
    if isinstance(d, int | float):
        return Dist(float(d))
    try:
        return Dist(float(d["mean"]), float(d.get("cv", 0.0)), int(d.get("min", 1)),
                    int(d.get("max", 1_000_000)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: bad distribution {d!r}: {exc}") from None


def _rate(v: object, where: str) -> tuple[tuple[float, float], ...]:
    if isinstance(v, int | float):
        return ((0.0, float(v)),)
    if isinstance(v, list):
        out = []
        for item in v:
            if not (isinstance(item, list | tuple) and len(item) == 2):
                raise ScenarioError(f"{where}: rate steps are [time, req/s] pairs, got {item!r}")
            out.append((_dur(item[0], where), float(item[1])))
        return tuple(sorted(out))
    raise ScenarioError(f"{where}: rate is a number or a list of [time, req/s]")


def _policy(v: object, base: Path | None, where: str) -> Policy | None:
    if v is None or v == "default":
        return None
    if isinstance(v, str):
        p = Path(v) if base is None else base / v
        return load_policy_file(p)
    if isinstance(v, dict):
        return load_policy(yaml.safe_dump(v), where)
    raise ScenarioError(f"{where}: policy is 'default', a file path or a mapping")


def parse_scenario(text: str, source: str, base: Path | None = None) -> Scenario:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping")
    classes = []
    for i, c in enumerate(raw.get("classes") or []):
        where = f"{source}: classes[{i}]"
        trace = None
        if "trace" in c:
            t = c["trace"]
            trace = TraceSpec(
                file=str(t["file"]), speed=float(t.get("speed", 1.0)),
                start_s=_dur(t.get("start", 0), where),
                split=tuple((int(k), float(v)) for k, v in (t.get("split") or {
                    0: 0.2, 1: 0.4, 2: 0.4}).items()),
                tenants=tuple((int(k), str(v)) for k, v in (t.get("tenants") or {}).items()))
        r = c.get("retry") or {}
        classes.append(TrafficClass(
            name=str(c.get("name", f"class{i}")),
            priority=int(c.get("priority", 0)),
            tenant=str(c.get("tenant", c.get("name", f"tenant{i}"))),
            rate=_rate(c.get("rate", 0.0), where),
            prompt=_dist(c.get("prompt", 500), where + ".prompt"),
            output=_dist(c.get("output", 150), where + ".output"),
            max_tokens=int(c.get("maxTokens", 0)),
            stream=bool(c.get("stream", True)),
            cancel_prob=float((c.get("cancel") or {}).get("prob", 0.0)),
            cancel_after_s=tuple(_dur(x, where) for x in (c.get("cancel") or {}).get(
                "after", [0.5, 5.0])),  # type: ignore[arg-type]
            retry=RetrySpec(str(r.get("mode", "none")), int(r.get("maxAttempts", 3)),
                            _dur(r.get("base", 1.0), where), _dur(r.get("cap", 30.0), where)),
            trace=trace,
        ))
    if not classes:
        raise ScenarioError(f"{source}: no traffic classes")
    b = raw.get("backends") or {}
    events = tuple(CapacityEvent(
        at_s=_dur(e["at"], f"{source}: events"), backend=int(e.get("backend", 0)),
        slowdown=e.get("slowdown"), leave=bool(e.get("leave", False)),
        rejoin=bool(e.get("rejoin", False)), kv_blocks=e.get("kvBlocks"))
        for e in raw.get("events") or [])
    m = raw.get("metrics") or {}
    defaults = Scenario(name="", duration_s=0.0, classes=())
    return Scenario(
        name=str(raw.get("name", Path(source).stem)),
        description=str(raw.get("description", "")).strip(),
        duration_s=_dur(raw.get("duration", 120), source),
        seed=int(raw.get("seed", 1)),
        backends=int(b.get("count", 2)),
        profile=str(b.get("profile", "small")),
        events=events,
        gateways=int(raw.get("gateways", 1)),
        scrape_interval_s=_dur(m.get("scrapeInterval", 0.5), source),
        als_delay_s=_dur(m.get("alsDelay", 0.05), source),
        policy=_policy(raw.get("policy"), base, f"{source}: policy"),
        controllers=tuple(raw.get("controllers", defaults.controllers)),
        oracle_sweep=tuple(int(x) for x in raw.get("oracleSweep", defaults.oracle_sweep)),
        sweep_loads=tuple(float(x) for x in raw.get("sweepLoads", ())),
        classes=tuple(classes),
        extra=dict(raw.get("expect") or {}),
    )
