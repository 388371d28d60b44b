"""`llmvalve policy check FILE` and `llmvalve policy hash-key KEY`.

`check` validates a policy file (bare or a Kubernetes ConfigMap holding policy.yaml): exit 0
with a one-line summary, or exit 1 with one `FILE:LINE: FIELD: message` line per issue on
stderr. `hash-key` prints the `sha256:<hex>` form of an API key for `apiKeyHashes`; pass `-`
to read the key from stdin so that it stays out of the shell history.
Only the pure policy loader is imported: no grpc, no aiohttp.
"""

from __future__ import annotations

import argparse
import sys

from llmvalve.commands.args import nonempty
from llmvalve.core.policy import Policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="policy_command", required=True, metavar="{check,hash-key}")
    check = sub.add_parser("check", help="validate a policy file (or a ConfigMap holding one)")
    check.add_argument("file", type=nonempty,
                       help="policy.yaml, or a ConfigMap with data.\"policy.yaml\"")
    hash_key = sub.add_parser("hash-key", help="print the sha256:<hex> form of an API key")
    hash_key.add_argument("key", help="the API key, or - to read it from stdin")


def run(args: argparse.Namespace) -> int:
    if args.policy_command == "hash-key":
        return _hash_key(args.key)
    return _check(args.file)


def summary(source: str, policy: Policy) -> str:
    queues = ", ".join(f"P{q.priority} {q.name}" for q in policy.queues)
    anonymous = ("anonymous off" if policy.anonymous is None
                 else f"anonymous P{policy.anonymous.default_priority}"
                      f" (max P{policy.anonymous.max_priority})")
    n_tenants = len(policy.tenants)
    budgeted = sum(t.budgets is not None for t in policy.tenants)
    budgets = f" ({budgeted} with budgets)" if budgeted else ""
    return (f"{source}: ok — {len(policy.queues)} queue{'s' * (len(policy.queues) != 1)} "
            f"({queues}), {n_tenants} tenant{'s' * (n_tenants != 1)}{budgets}, {anonymous}, "
            f"controller {policy.limiter.controller}, version {policy.version}")


def _check(path: str) -> int:
    from llmvalve.core.policy import PolicyError
    from llmvalve.gateway.policy_file import load_policy_file

    try:
        policy = load_policy_file(path)
    except PolicyError as exc:
        for issue in exc.errors:
            print(issue, file=sys.stderr)
        n = len(exc.errors)
        print(f"{path}: {n} error{'s' * (n != 1)}", file=sys.stderr)
        return 1
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        if isinstance(exc, UnicodeDecodeError):
            reason = f"not UTF-8 text (byte {exc.start}); save it as UTF-8"
        print(f"{path}: cannot read: {reason}", file=sys.stderr)
        return 1
    print(summary(path, policy))
    return 0


def _hash_key(key: str) -> int:
    from llmvalve.core.policy import hash_api_key

    if key == "-":
        key = sys.stdin.readline().rstrip("\r\n")
        # piped: one key, not a list whose first line alone would be hashed (a terminal
        # ends the key at its line)
        if not sys.stdin.isatty() and sys.stdin.read().strip():
            print("llmvalve policy hash-key: stdin holds more than one line: one key at a "
                  "time", file=sys.stderr)
            return 1
    if not key:
        print("llmvalve policy hash-key: empty key", file=sys.stderr)
        return 1
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        print("llmvalve policy hash-key: the key holds a tab or another control character "
              "(a client could not send it)", file=sys.stderr)
        return 1
    try:
        print(hash_api_key(key))
    except UnicodeError:  # bytes that are not UTF-8 (read from stdin as escapes)
        print("llmvalve policy hash-key: the key is not UTF-8 text", file=sys.stderr)
        return 1
    return 0
