"""`llmvalve status`: print a running control plane's status.

By default it asks the admin gRPC API (`GetStatus`, protos/llmvalve/admin/v1/admin.proto) on
the control plane's admin gRPC listener (127.0.0.1:9101 by default); `--admin URL` reads the
admin HTTP port's /status instead.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from llmvalve.commands.args import address, http_url, nonempty, positive_number

DEFAULT_GRPC_ADDR = "127.0.0.1:9101"
DEFAULT_ADMIN_URL = "http://127.0.0.1:9100"


def add_connection_arguments(parser: argparse.ArgumentParser, with_admin: bool = False) -> None:
    """--grpc, --token-file and TLS, shared by `status`, `top` and `override` (`with_admin`:
    the command also has --admin, the HTTP alternative)."""
    parser.add_argument("--grpc", type=address, default=DEFAULT_GRPC_ADDR, metavar="ADDR",
                        help="the control plane's admin gRPC address (default "
                        f"{DEFAULT_GRPC_ADDR})")
    parser.add_argument("--token-file", default=None, type=nonempty, metavar="FILE",
                        help="a file holding the admin token (without it: $LLMVALVE_ADMIN_TOKEN)")
    parser.add_argument("--ca-file", default=None, type=nonempty, metavar="FILE",
                        help="TLS (serve --admin-tls-cert): the PEM certificates to trust "
                        "(without it: $LLMVALVE_ADMIN_CA; neither: plain gRPC)")
    parser.add_argument("--tls-server-name", default=None, type=nonempty, metavar="NAME",
                        help="with TLS over gRPC: the name the certificate must hold, when the "
                        "address is not it (a port-forward to 127.0.0.1)"
                        + ("; not with --admin" if with_admin else ""))


def ca_file(args: argparse.Namespace) -> str | None:
    """The CA to trust (--ca-file, else $LLMVALVE_ADMIN_CA), checked: OSError naming it when
    it cannot be read or holds no PEM certificate (gRPC's own error never names the file)."""
    ca = args.ca_file or os.environ.get("LLMVALVE_ADMIN_CA") or None
    if ca is not None:
        try:
            ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise OSError(f"--ca-file {ca}: {exc.strerror or exc}") from None
    return ca


def admin_channel(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """A channel to the admin gRPC API: TLS when a CA is given, else plain. OSError when the
    CA file cannot be used."""
    import grpc

    ca = ca_file(args)
    if ca is None:
        return grpc.insecure_channel(args.grpc)
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())
    options = ([("grpc.ssl_target_name_override", args.tls_server_name)]
               if args.tls_server_name else [])
    return grpc.secure_channel(args.grpc, credentials, options=options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser, with_admin=True)
    parser.add_argument("--admin", default=None, type=http_url, metavar="URL",
                        help=f"read /status over HTTP from this admin URL instead (e.g. "
                        f"{DEFAULT_ADMIN_URL})")
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    parser.add_argument("--timeout", type=positive_number, default=3.0, metavar="S",
                        help="seconds to wait for the answer (default 3)")


def _fmt(value: Any) -> str:
    """A float as people read it: 27680, 3.2, 0.042 (not 2.768e+04)."""
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.3g}" if abs(value) >= 0.001 or value == 0 else f"{value:.1e}"
    return str(value)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def render(status: dict[str, Any]) -> str:
    lines = [f"policy {status.get('policy_version') or '-'}  controller "
             f"{status.get('controller', '-')}  ready {status.get('ready')}  draining "
             f"{status.get('draining')}"]
    reload = (status.get("policy") or {}).get("last_reload") or {}
    if reload and not reload.get("ok"):
        lines.append(f"policy: the last reload ({reload.get('trigger')}) FAILED, the policy "
                     f"above still runs: {reload.get('error')}")
    elif reload.get("needs_envoy"):
        lines.append("policy: the last reload changed what Envoy reads from its own config "
                     "(render and roll out Envoy's config for it): "
                     + "; ".join(reload["needs_envoy"]))
    gateway = status.get("gateway", {})
    if gateway:
        lines.append("gateway  " + "  ".join(f"{k} {_fmt(v)}" for k, v in gateway.items()
                                             if not isinstance(v, dict | list)
                                             and k != "last_sample"))
    for name, pool in (status.get("pools") or {}).items():
        override = ""
        if pool.get("override") is not None:
            expires = pool.get("override_expires_in_s")
            override = (f"  OVERRIDE {_fmt(pool['override'])}"
                        + ("" if expires is None else f" for {expires:.0f} s"))
        lines.append(f"pool {name}: limit {_fmt(pool.get('limit'))}  in flight "
                     f"{_fmt(pool.get('inflight'))} ({pool.get('inflight_requests')} requests)  "
                     f"saturation {_fmt(pool.get('saturation'))}  breaker "
                     f"{pool.get('breaker', '-')}{override}")
        for priority, cls in (pool.get("classes") or {}).items():
            lines.append(f"  P{priority} {cls.get('name', ''):24s} queued "
                         f"{cls.get('queue_depth', 0):5d}  oldest "
                         f"{_fmt(cls.get('oldest_wait_s', 0.0))} s  in flight "
                         f"{_fmt(cls.get('inflight', 0.0))}  SLO "
                         f"{_pct(cls.get('slo_attainment'))}")
        for backend, b in (pool.get("backends") or {}).items():
            if b.get("ok"):
                lines.append(f"  backend {backend}: KV {_pct(b.get('kv_usage'))}  running "
                             f"{_fmt(b.get('running'))}  waiting {_fmt(b.get('waiting'))}  "
                             f"scraped {_fmt(b.get('age_s'))} s ago")
            else:
                lines.append(f"  backend {backend}: scrape failing")
    return "\n".join(lines)


def grpc_status(args: argparse.Namespace, token: str | None = None) -> dict[str, Any]:
    """GetStatus over gRPC → the /status document (with ready and draining)."""
    from llmvalve.admin.v1 import admin_pb2 as pb
    from llmvalve.admin.v1 import admin_pb2_grpc as pb_grpc
    from llmvalve.gateway.admin_auth import call_metadata

    timeout_s = args.timeout
    with admin_channel(args) as channel:
        reply = pb_grpc.AdminStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout_s,
                                                     metadata=call_metadata(token))
    status = _document(json.loads(reply.status_json) if reply.status_json else {})
    status.update(ready=reply.ready, draining=reply.draining)
    return status


def http_status(url: str, timeout_s: float, token: str | None = None,
                ca: str | None = None) -> dict[str, Any]:
    """GET /status; an https URL is checked against `ca` (else the system's certificates)."""
    request = urllib.request.Request(url.rstrip("/") + "/status",
                                     headers={"authorization": f"Bearer {token}"} if token else {})
    context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
        return _document(json.loads(response.read()))


def _document(status: Any) -> dict[str, Any]:
    """The status document, or ValueError when the answer is not one (another server)."""
    if not isinstance(status, dict) or not all(
            isinstance(status.get(k, {}), dict) for k in ("gateway", "pools", "policy")):
        raise ValueError("the answer is not llmvalve's status document")
    return status


def run(args: argparse.Namespace) -> int:
    import grpc

    from llmvalve.gateway.admin_auth import client_token, token_hint

    where = args.admin or args.grpc
    if args.admin and args.tls_server_name:
        print("llmvalve status: --tls-server-name is for the admin gRPC API; with --admin, "
              "give a URL whose host the certificate names", file=sys.stderr)
        return 2
    try:
        token = client_token(args.token_file)
        status = (http_status(args.admin, args.timeout, token, ca_file(args)) if args.admin
                  else grpc_status(args, token))
        text = json.dumps(status, indent=1) if args.json else render(status)
    except (urllib.error.URLError, OSError, ValueError, grpc.RpcError,
            http.client.HTTPException) as exc:  # HTTPException: a port that is not HTTP
        detail = exc.details() if isinstance(exc, grpc.RpcError) else exc
        print(f"llmvalve status: cannot read the status from {where}: {detail}"
              f"{token_hint(exc)}", file=sys.stderr)
        return 1
    print(text)
    return 0
