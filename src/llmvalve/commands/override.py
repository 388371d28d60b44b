"""`llmvalve override`: the admin gRPC API's incident lever, `SetLimitOverride` /
`ClearLimitOverride`: hold a pool at a fixed limit for a while, or clear it."""

from __future__ import annotations

import argparse
import re
import sys

from llmvalve.commands.args import nonempty, positive_number
from llmvalve.commands.status import add_connection_arguments, admin_channel
from llmvalve.commands.top import short_number

DEFAULT_FOR_S = 600.0
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    match = DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 300, 90s, 10m, 1h)")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    return float(match.group(1)) * scale


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    parser.add_argument("--pool", type=nonempty, help="the pool (default: the first)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--limit", type=positive_number,
                      help="hold the pool at this limit (its unit: KV tokens for adaptive, "
                      "requests otherwise)")
    what.add_argument("--clear", action="store_true", help="hand the pool back to its limiter")
    parser.add_argument("--for", dest="duration", type=parse_duration, default=None,
                        metavar="DURATION", help="how long the override lasts (default 10m, "
                        "at most 24h)")


def run(args: argparse.Namespace) -> int:
    import grpc

    from llmvalve.admin.v1 import admin_pb2 as pb
    from llmvalve.admin.v1 import admin_pb2_grpc as pb_grpc
    from llmvalve.gateway.admin_auth import call_metadata, client_token, token_hint
    from llmvalve.gateway.admin_grpc import MAX_OVERRIDE_S

    if args.clear and args.duration is not None:
        print("llmvalve override: --for: --clear ends the override now", file=sys.stderr)
        return 2
    duration = DEFAULT_FOR_S if args.duration is None else args.duration
    if not 0 < duration <= MAX_OVERRIDE_S:
        print(f"llmvalve override: --for must be above 0 and at most {MAX_OVERRIDE_S / 3600:g}h",
              file=sys.stderr)
        return 2
    try:
        metadata = call_metadata(client_token(args.token_file))
        with admin_channel(args) as channel:
            stub = pb_grpc.AdminStub(channel)
            if args.clear:
                reply = stub.ClearLimitOverride(pb.ClearLimitOverrideRequest(pool=args.pool or ""),
                                                timeout=5, metadata=metadata)
            else:
                reply = stub.SetLimitOverride(pb.SetLimitOverrideRequest(
                    pool=args.pool or "", limit=args.limit, duration_s=duration), timeout=5,
                    metadata=metadata)
    except OSError as exc:
        print(f"llmvalve override: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        print(f"llmvalve override: {exc.details()}{token_hint(exc)}", file=sys.stderr)
        return 1
    if reply.active:
        print(f"pool {reply.pool}: limit held at {short_number(reply.limit)} for "
              f"{reply.expires_in_s:.0f} s")
    else:
        print(f"pool {reply.pool}: no override, the limiter decides")
    return 0
