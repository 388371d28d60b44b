"""PNG plots of bench runs.

- time series per mode (the simulator's layout: in flight and engine queues, KV usage and the
  limit, queue depth per class, rejections per second), from `sim.plot.plot_runs`;
- TTFT distribution per class: for each mode, the share of the class's requests whose first
  token came within t (requests refused or never answered never arrive, so a curve ends at
  the class's completion rate), with the class's TTFT objective marked;
- goodput against offered load (overload-sweep), bench solid and simulator dashed.
"""

from __future__ import annotations

from llmvalve.core.policy import Policy
from llmvalve.sim.harness import RunResult

COLORS = {"none": "tab:red", "seed": "tab:purple", "adaptive": "tab:green"}


def _color(mode: str, i: int) -> str:
    if mode.startswith("static"):
        return "tab:blue"
    return COLORS.get(mode, f"C{i}")


def plot_timeseries(runs: dict[str, RunResult], path: str, title: str) -> None:
    from llmvalve.sim.plot import plot_runs

    plot_runs(runs, path, title)


def plot_ttft(runs: dict[str, RunResult], policy: Policy, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prios = [p for p in policy.priorities
             if any(s.job.priority == p for r in runs.values() for s in r.jobs)]
    fig, axes = plt.subplots(1, len(prios), figsize=(4.6 * len(prios), 4.0), squeeze=False)
    for col, p in enumerate(prios):
        ax = axes[0][col]
        q = policy.queue(p)
        for i, (mode, run) in enumerate(runs.items()):
            jobs = [s for s in run.jobs if s.job.priority == p]
            if not jobs:
                continue
            ttft = sorted(s.first_token_at - s.job.arrival_s for s in jobs  # type: ignore[operator]
                          if s.status == "completed" and s.first_token_at is not None)
            n = len(jobs)
            xs = [max(t, 1e-2) for t in ttft]
            ys = [(k + 1) / n for k in range(len(xs))]
            ax.step([1e-2, *xs], [0.0, *ys], where="post", color=_color(mode, i), label=mode)
        ax.axvline(q.slo.ttft_s, color="black", linestyle=":", linewidth=1)
        ax.text(q.slo.ttft_s, 1.02, f" SLO {q.slo.ttft_s:g} s", fontsize=7, va="bottom")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.08)
        ax.set_xlabel("time to first token (s, scenario time)")
        ax.set_title(f"P{p} {q.name}", fontsize=10)
        ax.grid(alpha=0.3)
        if col == 0:
            ax.set_ylabel("share of the class's requests answered within t")
            ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_sweep(rows: list[dict], path: str, title: str, sim_rows: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    modes = list(rows[0]["controllers"]) if rows else []
    for i, m in enumerate(modes):
        ax.plot([r["load"] for r in rows], [r["controllers"][m]["goodput_tok_s"] for r in rows],
                marker="o", color=_color(m, i), label=f"{m} (bench)")
        if sim_rows:
            pts = [(r["load"], r["controllers"][m]["goodput_tok_s"]) for r in sim_rows
                   if m in r["controllers"]]
            ax.plot([a for a, _ in pts], [b for _, b in pts], linestyle="--", alpha=0.6,
                    color=_color(m, i), label=f"{m} (simulate)")
    ax.set_xlabel("offered load (× the scenario's rates)")
    ax.set_ylabel("goodput (output tok/s within SLO)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
