"""A port picked free can be taken before Envoy or the control plane binds it (another test
suite on the machine picks ports too): the stack starts it again on ports picked anew."""

from __future__ import annotations

import socket

import pytest

from llmvalve.processes import envoy_binary, http_get
from llmvalve.stack import Stack, StackConfig


@pytest.mark.parametrize("taken_attr", ["port", "envoy_admin_port", "http_port"])
def test_envoy_and_the_control_plane_start_on_new_ports_when_one_was_taken(tmp_path,
                                                                            taken_attr):
    """`port`: Envoy's listener. `envoy_admin_port`: Envoy's admin, which the control plane
    relays at /envoy/metrics (it answered 502 when Envoy moved to a new admin port).
    `http_port`: the control plane's, taken between the pick and the bind in a run beside
    another suite (its control plane exited with `address already in use` and its e2e
    module errored)."""
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    stack = Stack(StackConfig(backends=1, profile="small", time_scale=4.0, port=0, admin_port=0,
                              envoy_concurrency=1, workdir=tmp_path))
    taken = getattr(stack.config, taken_attr)
    with socket.socket() as squatter:
        # as the servers bind: a port picked free may still hold an earlier stack's
        # connections in TIME-WAIT (port_free reads it free), which a plain bind refuses
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((stack.config.host, taken))
        squatter.listen()
        with stack:
            assert getattr(stack.config, taken_attr) != taken
            assert http_get(stack.admin_url + "/readyz")[0] == 200
            assert http_get(stack.gateway_url + "/ready")[0] == 200
            assert http_get(stack.admin_url + "/envoy/metrics")[0] == 200
