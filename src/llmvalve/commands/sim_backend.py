"""`llmvalve sim-backend`: one or more simulated vLLM backends in one process.

Prints `sim-backend ready on http://HOST:PORT` (one line per backend, flushed) once every port
listens; runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import sys

from llmvalve.commands.args import nonempty, port_number, positive_number


def _ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ports: {text!r}") from None
    if any(not 0 <= p < 65536 for p in ports):
        raise argparse.ArgumentTypeError(f"bad port list: {text!r}")
    if twice := [p for p in set(ports) if p and ports.count(p) > 1]:
        raise argparse.ArgumentTypeError(f"port {twice[0]} given twice: one backend each")
    return ports


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from llmvalve.backend.engine_flags import add_engine_flags  # pure: cheap to import

    where = parser.add_mutually_exclusive_group()
    where.add_argument("--port", type=port_number, default=8001,
                       help="first port (0: pick free ports); with --count N, N consecutive "
                            "ports from here (default 8001)")
    where.add_argument("--ports", type=_ports, help="comma-separated ports, one backend each")
    parser.add_argument("--count", type=int, help="backends to run with --port (default 1)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1)")
    from llmvalve.engine.profiles import PROFILES  # pure data: cheap to import

    parser.add_argument("--profile", default="small",
                        help=f"engine profile: {', '.join(PROFILES)} (default small)")
    parser.add_argument("--model", default=None, type=nonempty,
                        help="served model name (default: profile's)")
    add_engine_flags(parser)
    parser.add_argument("--time-scale", type=positive_number, default=1.0,
                        help="engine time = X × wall time (2: twice as fast)")
    parser.add_argument("--tokens-per-chunk", type=int, default=1,
                        help="output tokens per SSE chunk (bounds the event rate)")
    parser.add_argument("--metrics-flavor", choices=("vllm", "trtllm", "sglang"), default="vllm",
                        help="whose metric names /metrics uses (default vllm)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the error_rate RNG")
    faults = parser.add_argument_group("faults (also at run time: POST /admin/faults)")
    faults.add_argument("--slowdown", type=float, default=1.0, help="step-time multiplier")
    faults.add_argument("--kv-blocks", type=int, default=None, help="KV cache size in blocks")
    faults.add_argument("--error-rate", type=float, default=0.0,
                        help="fraction of requests failed with 500")
    faults.add_argument("--hang", action="store_true", help="accept requests, never answer")
    faults.add_argument("--down", nargs="?", const="503", choices=("503", "close"), default=None,
                        help="answer 503 (or close connections) on everything but /admin")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from llmvalve.backend import faults as fault_mod
    from llmvalve.backend.engine_flags import profile_from
    from llmvalve.backend.exposition import Flavor
    from llmvalve.backend.server import SimBackend, serve_all
    from llmvalve.processes import join_addr
    try:
        profile = profile_from(args)
        initial = fault_mod.apply(fault_mod.Faults(), {
            "slowdown": args.slowdown, "kv_blocks": args.kv_blocks,
            "error_rate": args.error_rate, "hang": args.hang, "down": args.down})
        if args.ports and args.count is not None:
            raise ValueError("--count goes with --port; --ports runs one backend per port")
        count = 1 if args.count is None else args.count
        if args.tokens_per_chunk < 1 or count < 1:
            raise ValueError("--tokens-per-chunk and --count must be ≥ 1")
        if args.port and args.port + count > 65536:
            raise ValueError(f"--port {args.port} --count {count}: past port 65535")
    except ValueError as exc:
        print(f"sim-backend: {exc}", file=sys.stderr)
        return 2
    if args.ports:
        ports = args.ports
    elif args.port == 0:
        ports = [0] * count
    else:
        ports = [args.port + i for i in range(count)]

    async def main() -> int:
        backends = [
            SimBackend(profile, model=args.model, time_scale=args.time_scale,
                       tokens_per_chunk=args.tokens_per_chunk, flavor=Flavor(args.metrics_flavor),
                       initial_faults=initial, seed=args.seed + i, name=f"sim{i}")
            for i in range(len(ports))
        ]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            bound = await serve_all(backends, args.host, ports)
        except OSError as exc:
            print(f"sim-backend: {exc}", file=sys.stderr)
            for b in backends:
                await b.stop()
            return 1
        for port in bound:
            print(f"sim-backend ready on http://{join_addr(args.host, port)}", flush=True)
        await stop.wait()
        for b in backends:
            await b.stop()
        return 0

    return asyncio.run(main())
