"""`llmvalve status`: print a running control plane's /status (admin port)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

DEFAULT_ADMIN_URL = "http://127.0.0.1:9100"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin", default=DEFAULT_ADMIN_URL, metavar="URL",
                        help=f"the control plane's admin URL (default {DEFAULT_ADMIN_URL})")
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    parser.add_argument("--timeout", type=float, default=3.0)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(status: dict[str, Any]) -> str:
    lines = [f"policy {status.get('policy_version') or '-'}  controller "
             f"{status.get('controller', '-')}  ready {status.get('ready')}  draining "
             f"{status.get('draining')}"]
    gateway = status.get("gateway", {})
    if gateway:
        lines.append("gateway  " + "  ".join(f"{k} {_fmt(v)}" for k, v in gateway.items()
                                             if not isinstance(v, dict | list)
                                             and k != "last_sample"))
    for name, pool in (status.get("pools") or {}).items():
        lines.append(f"pool {name}: limit {_fmt(pool.get('limit'))}  in flight "
                     f"{_fmt(pool.get('inflight'))} ({pool.get('inflight_requests')} requests)  "
                     f"saturation {_fmt(pool.get('saturation'))}")
        for priority, cls in (pool.get("classes") or {}).items():
            lines.append(f"  P{priority} {cls.get('name', ''):24s} queued "
                         f"{cls.get('queue_depth', 0):5d}  oldest "
                         f"{_fmt(cls.get('oldest_wait_s', 0.0))} s  in flight "
                         f"{_fmt(cls.get('inflight', 0.0))}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    url = args.admin.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            status = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"llmvalve status: cannot read {url}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=1) if args.json else render(status))
    return 0
