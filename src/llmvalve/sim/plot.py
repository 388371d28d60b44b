"""PNG plots of simulation (and bench) runs: what a person would rather look at than read."""

from __future__ import annotations

from llmvalve.sim.harness import RunResult


def plot_runs(runs: dict[str, RunResult], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    fig, axes = plt.subplots(4, len(names), figsize=(4.2 * len(names), 10), sharex=True,
                             squeeze=False)
    for col, name in enumerate(names):
        ts = [p for p in runs[name].timeseries if p.t <= runs[name].duration_s]
        t = [p.t for p in ts]
        ax = axes[0][col]
        ax.set_title(name)
        ax.plot(t, [p.inflight_requests for p in ts], label="in flight (requests)")
        ax.plot(t, [p.engine_running for p in ts], label="running in engines", alpha=0.7)
        ax.plot(t, [p.engine_waiting for p in ts], label="waiting in engines", alpha=0.7)
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[1][col]
        ax.plot(t, [p.kv_usage for p in ts], color="tab:red", label="KV usage (mean)")
        ax.set_ylim(0, 1.05)
        twin = ax.twinx()
        twin.plot(t, [p.limit if p.limit != float("inf") else float("nan") for p in ts],
                  color="tab:gray", linestyle="--", label=f"limit ({ts[0].limit_unit})")
        twin.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left")
        twin.legend(fontsize=7, loc="upper right")
        ax = axes[2][col]
        prios = sorted(ts[0].queue_depth) if ts else []
        for p in prios:
            ax.plot(t, [x.queue_depth[p] for x in ts], label=f"P{p} queue")
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[3][col]
        ax.bar(t, [p.rejections for p in ts], width=1.0, color="tab:orange",
               label="rejected / s")
        ax.legend(fontsize=7, loc="upper left")
        ax.set_xlabel("time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_sweep(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ctrls = list(rows[0]["controllers"]) if rows else []
    for c in ctrls:
        ax.plot([r["load"] for r in rows], [r["controllers"][c]["goodput_tok_s"] for r in rows],
                marker="o", label=c)
    ax.set_xlabel("offered load (× capacity)")
    ax.set_ylabel("goodput (output tok/s within SLO)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
