"""`llmvalve top`: a terminal view of a running control plane that refreshes itself.

It subscribes to the admin gRPC API's `WatchStatus` stream and redraws on every snapshot:
per pool the limit, in flight and the backends' KV usage as bars, the breaker and any limit
override; per class the queue depth, the oldest wait, admitted and shed per second and the
SLO attainment. Ctrl-C quits. `--iterations N` draws N snapshots and exits (for scripts).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from llmvalve.commands.args import count, positive_number
from llmvalve.commands.status import add_connection_arguments, admin_channel

CLEAR = "\x1b[H\x1b[2J"
BAR = 28


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    parser.add_argument("--interval", type=positive_number, default=1.0, metavar="S",
                        help="refresh every S seconds (default 1)")
    parser.add_argument("--iterations", type=count, default=0, metavar="N",
                        help="stop after N screens (default, or 0: until Ctrl-C)")


def bar(value: float, full: float, width: int = BAR) -> str:
    filled = 0 if full <= 0 else round(width * min(1.0, max(0.0, value / full)))
    return "█" * filled + "·" * (width - filled)


def short_number(value: float) -> str:
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.2f}"


def render(status: Any) -> str:
    """One screen from a `llmvalve.admin.v1.Status` message."""
    import time

    when = time.strftime("%H:%M:%S", time.localtime(status.unix_time_s or time.time()))
    state = "draining" if status.draining else ("ready" if status.ready else "starting")
    g = status.gateway
    lines = [f"llmvalve top — {when}  policy {status.policy_version[:12] or '-'}  controller "
             f"{status.controller}  {state}",
             f"queued {g.checks_held}  admitted and running {g.open_tickets}", ""]
    for pool in status.pools:
        unit = "KV tokens" if pool.unit == "tokens" else "requests"
        limit = pool.limit if pool.HasField("limit") else None
        head = f"pool {pool.name}  breaker {pool.breaker}  saturation {pool.saturation:.2f}"
        if pool.override.active:
            left = (f" for {pool.override.expires_in_s:.0f} s"
                    if pool.override.HasField("expires_in_s") else "")
            head += f"  LIMIT OVERRIDE {short_number(pool.override.limit)}{left}"
        lines.append(head)
        full = limit if limit else max(pool.inflight, 1.0)
        lines.append(f"  in flight  {bar(pool.inflight, full)}  {short_number(pool.inflight)} / "
                     f"{'∞' if limit is None else short_number(limit)} {unit} "
                     f"({pool.inflight_requests} requests)")
        seen = [b for b in pool.backends if b.ok]
        if seen:
            kv = sum(b.kv_usage for b in seen) / len(seen)
            lines.append(f"  KV usage   {bar(kv, 1.0)}  {100 * kv:.0f}% (mean of {len(seen)} "
                         f"backend{'s' if len(seen) != 1 else ''})")
        lines.append(f"  {'class':26s} {'queued':>7s} {'oldest':>8s} {'admit/s':>8s} "
                     f"{'shed/s':>7s} {'SLO':>5s}")
        for c in pool.classes:
            slo = f"{100 * c.slo_attainment:.0f}%" if c.HasField("slo_attainment") else "-"
            lines.append(f"  P{c.priority} {c.name:23s} {c.queue_depth:7d} "
                         f"{c.oldest_wait_s:7.2f}s {c.admitted_per_s:8.1f} "
                         f"{c.shed_per_s:7.1f} {slo:>5s}")
        for b in pool.backends:
            if b.ok:
                lines.append(f"  backend {b.name:14s} KV {100 * b.kv_usage:3.0f}%  running "
                             f"{b.running:4.0f}  waiting {b.waiting:4.0f}")
            else:
                lines.append(f"  backend {b.name:14s} scrape failing ({b.age_s:.1f} s)")
        lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import grpc

    from llmvalve.admin.v1 import admin_pb2 as pb
    from llmvalve.admin.v1 import admin_pb2_grpc as pb_grpc
    from llmvalve.gateway.admin_auth import call_metadata, client_token, token_hint

    tty = sys.stdout.isatty()
    shown = 0
    try:
        metadata = call_metadata(client_token(args.token_file))
        with admin_channel(args) as channel:
            stream = pb_grpc.AdminStub(channel).WatchStatus(
                pb.WatchStatusRequest(interval_s=args.interval), metadata=metadata)
            for status in stream:
                sys.stdout.write((CLEAR if tty else "") + render(status) + "\n")
                sys.stdout.flush()
                shown += 1
                if args.iterations and shown >= args.iterations:
                    stream.cancel()
                    break
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"llmvalve top: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED and shown:
            return 0
        print(f"llmvalve top: {args.grpc}: {exc.details()}{token_hint(exc)}", file=sys.stderr)
        return 1
    return 0
