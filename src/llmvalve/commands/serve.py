"""`llmvalve serve`: the control plane process that runs next to Envoy.

The assembly is gateway/control_plane.py; this module is the command: arguments, signals,
logging. SIGTERM/SIGINT → /readyz turns 503, new requests get 503 draining, held and in-flight
requests may finish (up to --drain-timeout), then exit 0. SIGHUP, or a change of the policy
file (polled every --watch-interval s; see gateway/policy_watch.py) → reload the policy file
(a bad file is refused: logged, in /status and in llmvalve_policy_reloads_total{result="error"};
the running policy stays).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from fractions import Fraction
from pathlib import Path

from llmvalve.commands.args import (
    address,
    controller,
    file_path,
    pool_metrics_url,
    positive_number,
    seconds,
)
from llmvalve.gateway.replicas import DEFAULT_INTERVAL_S as REPLICAS_INTERVAL_S

DEFAULT_HTTP = "127.0.0.1:9001"
DEFAULT_GRPC = "127.0.0.1:9000"
DEFAULT_ADMIN = "0.0.0.0:9100"
DEFAULT_ADMIN_GRPC = "127.0.0.1:9101"


def replica_share(text: str) -> float:
    """A replica's share of the fleet: a number in (0, 1] or a fraction ("1/3")."""
    try:
        share = float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a number or fraction: {text!r}") from None
    if not 0.0 < share <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return share


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=file_path, default=None,
                        help="policy YAML or ConfigMap (default: the packaged default policy)")
    parser.add_argument("--http", type=address, default=DEFAULT_HTTP, metavar="ADDR",
                        help=f"data plane, HTTP: Envoy's ext_authz checks (default {DEFAULT_HTTP})")
    parser.add_argument("--grpc", type=address, default=DEFAULT_GRPC, metavar="ADDR",
                        help="data plane, gRPC: Envoy's access log and ext_authz over gRPC "
                        f"(default {DEFAULT_GRPC})")
    parser.add_argument("--admin", type=address, default=DEFAULT_ADMIN, metavar="ADDR",
                        help=f"admin HTTP: /metrics and probes, open; /status and the "
                        f"dashboard, which need --admin-token-file unless bound to loopback "
                        f"(default {DEFAULT_ADMIN})")
    parser.add_argument("--admin-grpc", type=address, default=DEFAULT_ADMIN_GRPC, metavar="ADDR",
                        help="admin gRPC API: status, overrides (default "
                        f"{DEFAULT_ADMIN_GRPC}; loopback only without a token)")
    parser.add_argument("--envoy-admin", type=address, default=None, metavar="ADDR",
                        help="Envoy's admin address beside it (127.0.0.1:9901 in the shipped "
                        "deployments): the admin port's /envoy/metrics relays Envoy's "
                        "/stats/prometheus, so Envoy's admin stays on loopback (default: "
                        "not relayed)")
    parser.add_argument("--admin-token-file", type=file_path, default=None, metavar="FILE",
                        help="the admin APIs' bearer token (e.g. a mounted Secret)")
    parser.add_argument("--admin-tls-cert", type=Path, default=None, metavar="FILE",
                        help="TLS on both admin listeners: this PEM certificate chain (with "
                        "--admin-tls-key; read again when it changes)")
    parser.add_argument("--admin-tls-key", type=Path, default=None, metavar="FILE",
                        help="the PEM private key of --admin-tls-cert")
    parser.add_argument("--controller", type=controller, default=None,
                        help="override the policy's controller: adaptive, seed, static:N, none")
    parser.add_argument("--metrics-url", action="append", default=[], metavar="[POOL=]URL",
                        type=pool_metrics_url,
                        help="a backend /metrics URL of POOL (default: the first pool); "
                        "repeatable; replaces that pool's list in the policy")
    parser.add_argument("--drain-timeout", type=seconds, default=30.0, metavar="S",
                        help="on SIGTERM, wait this long for open requests (default 30)")
    parser.add_argument("--watch-interval", type=seconds, default=1.0, metavar="S",
                        help="poll the policy file for changes every S seconds (0: only on "
                        "SIGHUP; default 1)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="INFO (state changes), DEBUG (also one line per decision)")
    parser.add_argument("--log-format", default="json", choices=("json", "text"),
                        help="json (one object per line, default) or text")
    parser.add_argument("--log-decisions", default="none", choices=("none", "refused"),
                        help="refused: a line at INFO for each request answered without a "
                        "backend serving it (at most 10 a second for each reason, the others "
                        "counted), whatever --log-level; none (default): decisions only at "
                        "DEBUG")
    parser.add_argument("--metrics-tenants", default="*", metavar="LIST",
                        help="tenants with their own metrics label, comma-separated; the "
                        "others count as `other` ('*': the first 64 seen, default; '': none)")
    parser.add_argument("--replica-share", "--budget-share", type=replica_share, metavar="F",
                        dest="replica_share",
                        default=os.environ.get("LLMVALVE_REPLICA_SHARE",
                                               os.environ.get("LLMVALVE_BUDGET_SHARE", "1")),
                        help="this replica's share of the fleet, 1/R with R gateway replicas: "
                        "it enforces that share of every tenant budget, and the adaptive limit "
                        "steps toward that share of the backends (default: "
                        "$LLMVALVE_REPLICA_SHARE, or the old $LLMVALVE_BUDGET_SHARE, else 1; "
                        "--budget-share is the old name)")
    parser.add_argument("--replicas-from", default=os.environ.get("LLMVALVE_REPLICAS_FROM"),
                        metavar="NAME",
                        help="a DNS name with one address per gateway replica (a headless "
                        "Service of the gateway pods): the replica share follows their count "
                        "R (1/R), re-read every --replicas-interval seconds; --replica-share "
                        "holds until the first answer and while lookups fail (default: "
                        "$LLMVALVE_REPLICAS_FROM, else off)")
    parser.add_argument("--replicas-interval", type=positive_number, metavar="S",
                        help="with --replicas-from: seconds between lookups (default "
                        f"{REPLICAS_INTERVAL_S:g})")


def _with_host(addr: str) -> str:
    """HOST:PORT to connect to: an empty host is this host (127.0.0.1)."""
    host, _, port = addr.rpartition(":")
    return f"{host or '127.0.0.1'}:{port}"


async def _main(args: argparse.Namespace) -> int:
    from llmvalve.gateway.control_plane import ControlPlane, ControlPlaneConfig
    from llmvalve.gateway.policy_file import default_policy_path, load_policy_file

    policy = load_policy_file(args.policy or default_policy_path())
    plane = ControlPlane(policy, ControlPlaneConfig(
        http=args.http, grpc=args.grpc, admin=args.admin, admin_grpc=args.admin_grpc,
        admin_token_file=args.admin_token_file, controller=args.controller,
        admin_tls=(args.admin_tls_cert, args.admin_tls_key) if args.admin_tls_cert else None,
        policy_path=args.policy or None, metrics_urls=tuple(args.metrics_url),
        watch_interval_s=args.watch_interval, metrics_tenants=args.metrics_tenants,
        replica_share=args.replica_share, replicas_from=args.replicas_from or None,
        replicas_interval_s=(REPLICAS_INTERVAL_S if args.replicas_interval is None
                             else args.replicas_interval),
        envoy_admin=args.envoy_admin and _with_host(args.envoy_admin)))
    await plane.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(plane.reload()))
    ports = plane.ports
    print(f"llmvalve serve: http :{ports['http']}, grpc :{ports['grpc']}, admin "
          f":{ports['admin']}, admin-grpc :{ports['admin_grpc']}", flush=True)
    await stop.wait()
    await plane.drain(args.drain_timeout)
    await plane.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    from llmvalve.core.policy import PolicyError
    from llmvalve.gateway import logs
    from llmvalve.processes import event_loop_factory, raise_fd_limit

    if (args.admin_tls_cert is None) != (args.admin_tls_key is None):
        print("llmvalve serve: --admin-tls-cert and --admin-tls-key go together",
              file=sys.stderr)
        return 2
    if args.replicas_interval is not None and not args.replicas_from:
        print("llmvalve serve: --replicas-interval paces --replicas-from's lookups: give them "
              "together", file=sys.stderr)
        return 2
    logs.setup(args.log_level, args.log_format, decisions=args.log_decisions)
    raise_fd_limit()
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(_main(args))
    except (PolicyError, OSError, ValueError) as exc:
        print(f"llmvalve serve: {exc}", file=sys.stderr)
        return 1
