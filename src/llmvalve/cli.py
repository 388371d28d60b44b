"""The `llmvalve` command: dispatch only. Each subcommand lives in its own module of
`llmvalve.commands` exposing `add_arguments(parser)` and `run(args) -> int`; those modules keep
heavy imports (grpc, aiohttp, matplotlib) inside `run`, so `llmvalve policy check` does not pay
for grpc."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name → (module with `add_arguments(parser)` and `run(args) -> int`, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("llmvalve.commands.up",
           "the embedded stack: simulated backends + control plane + Envoy"),
    "serve": ("llmvalve.commands.serve", "the control plane alone (runs next to Envoy)"),
    "sim-backend": ("llmvalve.commands.sim_backend", "a vLLM-compatible simulated GPU backend"),
    "simulate": ("llmvalve.commands.simulate", "virtual-time evaluation of admission controllers"),
    "bench": ("llmvalve.commands.bench",
              "a scenario through real Envoy, control plane and backends"),
    "load": ("llmvalve.commands.load", "drive a running gateway with a scenario's traffic"),
    "policy": ("llmvalve.commands.policy",
               "policy tools: `llmvalve policy check FILE`, `llmvalve policy hash-key -`"),
    "status": ("llmvalve.commands.status", "print the control plane's status"),
    "top": ("llmvalve.commands.top",
            "a live terminal view of the control plane (admin gRPC)"),
    "override": ("llmvalve.commands.override",
                 "hold a pool at a fixed limit for a while, or clear it"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmvalve", description="llmvalve: admission control for LLM inference behind "
        "Envoy (admit, queue by priority, or shed), with its simulator and benchmarks. "
        "`llmvalve COMMAND --help` for each command.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                p.set_defaults(_missing=module_name)
                continue
            raise
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "_missing", None):
            print(f"llmvalve {args.command}: not available in this build", file=sys.stderr)
            return 2
        return int(args._run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C where a command does not handle it (its imports)
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `llmvalve status | head`: the reader has what it wanted
        # the interpreter's own flush of stdout at exit would raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
