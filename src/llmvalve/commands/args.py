"""Argument types the commands share: a bad value is one line and exit 2 (argparse's),
not a traceback when it is first used."""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from pathlib import Path

# the limit controllers a gateway runs (`simulate` also takes its hindsight `schedule:`)
CONTROLLERS = re.compile(r"none|seed|adaptive|static(:[1-9][0-9]*)?")


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= port < 65536:
        raise argparse.ArgumentTypeError(f"not a port (0-65535): {text}")
    return port


def address(text: str) -> str:
    """An argparse type: HOST:PORT (an empty host: every interface; [v6] in brackets). Not a
    URL: `http://127.0.0.1:9901` read as the host `http://127.0.0.1`."""
    host, sep, port = text.rpartition(":")
    if not sep or "/" in host or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (no scheme, no path), got {text!r}")
    port_number(port)
    bracketed = host.startswith("[") or host.endswith("]")
    if bracketed or ":" in host:
        try:
            if not (host.startswith("[") and host.endswith("]")):
                raise ValueError
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected HOST:PORT with an IPv6 host in brackets ([::1]:PORT), got {text!r}"
            ) from None
    return text


def nonempty(text: str) -> str:
    """An argparse type: any text but an empty one (a name, a host, a file given as "", which
    would otherwise read as the default, or as the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def file_path(text: str) -> Path:
    """An argparse type: a file's path, not empty (Path("") is the current folder)."""
    return Path(nonempty(text))


def ip_address(text: str) -> str:
    """An argparse type: an IP address to listen on (Envoy's listener takes no host name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None
    return text


def http_url(text: str) -> str:
    """An argparse type: an http(s)://HOST[:PORT] URL (a path may follow; no query or
    fragment: a base URL that paths are joined to)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (it raises for a port that is no number from 0 to 65535)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.query
            or parts.fragment or text != text.strip()):
        raise argparse.ArgumentTypeError(f"expected http://HOST:PORT, got {text!r}")
    return text


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, a scale, a limit)."""
    value = _number(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    value = _number(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def controller(text: str) -> str:
    """An argparse type: a limit controller a gateway runs (adaptive, seed, static,
    static:N with N >= 1, none)."""
    if CONTROLLERS.fullmatch(text):
        return text
    if text.startswith("static:"):
        raise argparse.ArgumentTypeError(f"{text!r}: static:N wants a whole number N >= 1")
    raise argparse.ArgumentTypeError(
        f"unknown controller {text!r} (adaptive, seed, static, static:N, none)")


def pool_metrics_url(text: str) -> str:
    """An argparse type: [POOL=]URL, a backend's metrics URL (the pool is checked against
    the policy when it is read)."""
    from llmvalve.core.policy.pools import metrics_url_problem, pool_and_url

    if problem := metrics_url_problem(pool_and_url(text)[1]):
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return text
