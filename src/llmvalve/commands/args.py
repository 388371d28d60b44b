"""Argument types the commands share: a bad value is one line and exit 2 (argparse's),
not a traceback when it is first used."""

from __future__ import annotations

import argparse


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
    """An argparse type: HOST:PORT (an empty host: every interface; [v6] in brackets)."""
    _host, sep, port = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    port_number(port)
    return text
