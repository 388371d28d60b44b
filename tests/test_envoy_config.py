"""Every shipped Envoy config, and the rendered template, pass `envoy --mode validate`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from deploy_support import clusters, hcm_of
from llmvalve.gateway.envoy_config import EnvoyParams, main, render
from llmvalve.processes import Proc, free_port, http_get, wait_until

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "envoy").glob("*.yaml"))


def validate(envoy_bin: str, path: Path) -> None:
    done = subprocess.run(
        [envoy_bin, "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_configs_validate(envoy_bin, path):
    validate(envoy_bin, path)


def test_shipped_config_is_the_rendered_template():
    assert SHIPPED, "envoy/envoy.yaml is missing"
    assert (ROOT / "envoy" / "envoy.yaml").read_text() == render(EnvoyParams())


@pytest.mark.parametrize(("failure_mode_allow", "admission"),
                         [(False, "http"), (True, "http"), (False, "grpc")])
def test_local_render_validates(envoy_bin, tmp_path, failure_mode_allow, admission):
    params = EnvoyParams(
        listen_address="127.0.0.1", listen_port=18080, admin_port=18081, admission=admission,
        control_plane_http=("127.0.0.1", 19001), control_plane_grpc=("127.0.0.1", 19000),
        clusters={"llm_backends": (("127.0.0.1", 18001), ("127.0.0.1", 18002)),
                  "fallback_model": (("127.0.0.1", 18003),)},
        failure_mode_allow=failure_mode_allow, note="test", extra_headers=("x-tier",),
        priority_header="x-tier",
    )
    text = render(params)
    assert f"failure_mode_allow: {str(failure_mode_allow).lower()}" in text
    assert ("http_service:" in text) == (admission == "http")
    assert ("cluster_name: llmvalve_grpc}\n                timeout" in text) == (
        admission == "grpc")
    assert "- {exact: x-tier}" in text
    # the clamped class reaches the backend, not the client's (found by a review: only
    # x-llmvalve-* went upstream, so a policy's own class header kept the client's value)
    assert ("patterns: [{prefix: x-llmvalve-}, {exact: x-tier}]" in text) == (
        admission == "http")
    assert "type: STATIC" in text and "STRICT_DNS" not in text
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    validate(envoy_bin, path)


def test_render_needs_a_backend_cluster_and_a_known_mode():
    with pytest.raises(ValueError, match="default pool"):
        render(EnvoyParams(clusters={}))
    with pytest.raises(ValueError, match="admission"):
        render(EnvoyParams(admission="ext_proc"))


def test_the_control_plane_is_reached_on_loopback_only():
    """Compose and Kubernetes run the control plane beside Envoy (one network namespace): the
    shipped config reaches its data-plane listeners on 127.0.0.1 (docs/deployment.md)."""
    doc = yaml.safe_load(render(EnvoyParams()))
    for cluster in doc["static_resources"]["clusters"]:
        if cluster["name"].startswith("llmvalve"):
            for group in cluster["load_assignment"]["endpoints"]:
                for ep in group["lb_endpoints"]:
                    assert ep["endpoint"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_a_listen_port_another_envoy_holds_fails_to_bind(envoy_bin, tmp_path):
    """Two stacks side by side can pick the same free port before either binds it. The second
    Envoy must fail ("Address already in use": `Stack.start_envoy` picks new ports), not share
    the port: with Envoy's default SO_REUSEPORT both bind it, the kernel splits the port's
    connections between them, and a client of one stack is answered by the other (or dropped
    when that one stops)."""
    port = free_port()

    def start(name: str) -> Proc:
        path = tmp_path / f"{name}.yaml"
        path.write_text(render(EnvoyParams(
            listen_address="127.0.0.1", listen_port=port, admin_port=free_port(),
            clusters={"llm_backends": (("127.0.0.1", free_port()),)}, note="test")))
        return Proc(name, [envoy_bin, "-c", str(path), "--disable-hot-restart",
                           "--log-level", "error"], tmp_path / f"{name}.log")

    first = start("first")
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/ready")[0] == 200, 30,
                   "the first Envoy", first)
        second = start("second")
        try:
            assert second.popen.wait(timeout=30) != 0
            assert b"Address already in use" in second.output()
        finally:
            second.stop()
    finally:
        first.stop()


def test_the_command_line_renders_your_own_backends(envoy_bin, tmp_path, capsys):
    """docs/deployment.md: a fleet at other addresses than compose's `backend:8000` gets its
    Envoy config from the renderer's command line, not by editing the shipped file."""
    assert main(["--cluster", "llm_backends=10.0.0.5:8000,10.0.0.6:8000",
                 "--cluster", "small_pool=vllm-small.inference.svc:8001",
                 "--cluster", "fallback_model=[fd00::7]:8000"]) == 0
    text = capsys.readouterr().out
    cfg = yaml.safe_load(text)
    assert clusters(cfg)["llm_backends"] == [("10.0.0.5", 8000), ("10.0.0.6", 8000)]
    assert clusters(cfg)["small_pool"] == [("vllm-small.inference.svc", 8001)]
    assert clusters(cfg)["fallback_model"] == [("fd00::7", 8000)]
    kinds = {c["name"]: c["type"] for c in cfg["static_resources"]["clusters"]}
    assert kinds["llm_backends"] == "STATIC" and kinds["small_pool"] == "STRICT_DNS"
    assert "--cluster llm_backends=10.0.0.5:8000" in text.splitlines()[1]  # how it was made
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    validate(envoy_bin, path)


@pytest.mark.parametrize("bad", ["llm_backends", "=h:1", "llm_backends=host",
                                 "llm_backends=host:0", "llm_backends=h:1,:80",
                                 "llm backends=h:1", "llm_backends=fd00::7:80",
                                 "llm_backends={h}:80", "llm_backends=[nope]:80"])
def test_a_bad_cluster_argument_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--cluster", bad])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--cluster" in err and "Traceback" not in err


def seconds(text: str) -> float:
    return float(text.removesuffix("s"))


def test_long_silent_answers_are_not_cut_and_clients_are_bounded():
    """Found by a review against a real Envoy: the idle timeouts were 300 s, so every
    non-streamed answer longer than 5 minutes (the batch class's 1 s TPOT allows one of 300
    tokens) got `504 stream_idle_timeout`, and the breaker counted it; HTTP/2 uploads of held
    requests grew Envoy's memory past the 1 MiB buffer (a 256 MiB stream window); no header
    timeout, no bound on connections."""
    from llmvalve.sim.runner import default_policy

    cfg = yaml.safe_load((ROOT / "envoy" / "envoy.yaml").read_text())
    hcm = hcm_of(cfg)
    longest_queue = max(q.timeout_s for q in default_policy().queues)
    idle = seconds(hcm["stream_idle_timeout"])
    assert idle >= 1800 and idle > longest_queue + EnvoyParams().check_timeout_s
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    llm = [r["route"] for r in routes if r.get("route", {}).get("timeout") == "0s"]
    assert llm and all(seconds(r["idle_timeout"]) == idle for r in llm)
    assert seconds(hcm["request_headers_timeout"]) <= 30
    h2 = hcm["http2_protocol_options"]
    [listener] = cfg["static_resources"]["listeners"]
    assert h2["initial_stream_window_size"] <= listener["per_connection_buffer_limit_bytes"]
    connections, heap = cfg["overload_manager"]["resource_monitors"]
    assert connections["typed_config"]["max_active_downstream_connections"] > 0
    assert heap["typed_config"]["max_heap_size_bytes"] == EnvoyParams().max_heap_bytes


def test_envoy_drops_idle_backend_connections_before_vllm_does():
    """vLLM's server closes a connection idle for 5 s: every backend cluster's pool closes
    its own first (e2e/test_e2e_envoy_upstream.py shows the race it removes)."""
    from llmvalve.backend.server import KEEP_ALIVE_S

    cfg = yaml.safe_load(render(EnvoyParams(clusters={
        "llm_backends": (("10.0.0.1", 8000),), "small": (("vllm-small", 8000),)})))
    backends = [c for c in cfg["static_resources"]["clusters"]
                if not c["name"].startswith("llmvalve")]
    assert {c["name"] for c in backends} == {"llm_direct", "llm_backends", "small"}
    for cluster in backends:
        options = cluster["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        idle = seconds(options["common_http_protocol_options"]["idle_timeout"])
        assert 0 < idle < KEEP_ALIVE_S, cluster["name"]


def test_the_idle_timeout_is_a_command_line_choice(capsys):
    assert main(["--idle-timeout", "7200"]) == 0
    text = capsys.readouterr().out
    assert seconds(hcm_of(yaml.safe_load(text))["stream_idle_timeout"]) == 7200
    assert "--idle-timeout 7200" in text.splitlines()[1]  # how it was made
    with pytest.raises(SystemExit):
        main(["--idle-timeout", "0"])
    assert "--idle-timeout" in capsys.readouterr().err


def test_the_heap_bound_is_a_command_line_choice(capsys):
    assert main(["--max-heap", "3072"]) == 0
    [heap] = [m for m in yaml.safe_load(capsys.readouterr().out)["overload_manager"][
        "resource_monitors"] if "max_heap_size_bytes" in m["typed_config"]]
    assert heap["typed_config"]["max_heap_size_bytes"] == 3072 * 2**20
    with pytest.raises(SystemExit):
        main(["--max-heap", "8"])
    assert "--max-heap" in capsys.readouterr().err


def test_the_proxies_trusted_in_front_of_envoy_are_a_command_line_choice(capsys):
    def hcm(argv: list[str]) -> dict:
        assert main(argv) == 0
        listener = yaml.safe_load(capsys.readouterr().out)["static_resources"]["listeners"][0]
        return listener["filter_chains"][0]["filters"][0]["typed_config"]

    assert (hcm([])["use_remote_address"], hcm([])["xff_num_trusted_hops"]) == (True, 0)
    assert hcm(["--xff-trusted-hops", "2"])["xff_num_trusted_hops"] == 2
    for bad in ("-1", "11"):
        with pytest.raises(SystemExit):
            main(["--xff-trusted-hops", bad])
        assert "--xff-trusted-hops" in capsys.readouterr().err


def test_a_deployment_renders_what_envoy_reads_of_its_policy(envoy_bin, tmp_path, capsys):
    """docs/policy.md: a raised queue timeout, maxBodyBytes, the policy's own headers and
    failureModeAllow are read by Envoy, so "render the config again". The renderer could not
    read a policy: a queue timeout above 90 s ended, held, in the shipped 120 s check timeout's
    `503 control_plane_unavailable` (found by a review)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "tests" / "e2e" / "policy-models.yaml").read_text()
                      .replace("timeout: 60s", "timeout: 10m")
                      .replace("anonymous: null", "anonymous: null\nfailureModeAllow: true\n"
                               "requests: {maxBodyBytes: 524288, priorityHeader: x-prio}"))
    with pytest.raises(SystemExit):  # the policy's pool `small` routes to small_model
        main(["--policy", str(policy)])
    assert "--cluster small_model=HOST:PORT" in capsys.readouterr().err
    assert main(["--policy", str(policy), "--cluster", "small_model=10.0.0.9:8000"]) == 0
    text = capsys.readouterr().out
    cfg = yaml.safe_load(text)
    hcm = hcm_of(cfg)
    [authz] = [f["typed_config"] for f in hcm["http_filters"]
               if f["name"] == "envoy.filters.http.ext_authz"]
    check = authz["http_service"]["server_uri"]["timeout"]
    assert seconds(check) == 630  # the longest queue timeout + 30 s
    assert authz["failure_mode_allow"] is True
    assert authz["with_request_body"]["max_request_bytes"] == 524288
    assert "x-prio" in text
    assert seconds(hcm["stream_idle_timeout"]) > seconds(check)
    assert clusters(cfg)["small_model"] == [("10.0.0.9", 8000)]
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    validate(envoy_bin, path)
    with pytest.raises(SystemExit):  # an idle timeout that would cut a held request
        main(["--policy", str(policy), "--cluster", "small_model=h:1", "--idle-timeout", "600"])
    assert "--idle-timeout" in capsys.readouterr().err


def test_envoy_answers_503_with_a_retry_after_while_its_heap_is_at_its_bound(envoy_bin,
                                                                              tmp_path):
    """Found by a deployment review, measured with Envoy 1.40: a queued request holds about
    2.3 times its body, so the seed policy's 1,700 queue places of 256 KiB bodies are about
    1 GiB, and larger prompts grew Envoy past its container's limit (an OOM kill cuts every
    stream of the pod). Past 95 % of `max_heap_bytes` new requests get 503, in OpenAI's error
    shape with a Retry-After: here a bound below what an idle Envoy holds."""
    import json
    import urllib.error
    import urllib.request

    port = free_port()
    path = tmp_path / "envoy.yaml"
    path.write_text(render(EnvoyParams(
        listen_address="127.0.0.1", listen_port=port, admin_port=free_port(),
        clusters={"llm_backends": (("127.0.0.1", free_port()),)}, max_heap_bytes=1_048_576,
        note="test")))
    proc = Proc("envoy", [envoy_bin, "-c", str(path), "--disable-hot-restart",
                          "--log-level", "error"], tmp_path / "envoy.log")
    url = f"http://127.0.0.1:{port}/v1/models"
    try:
        wait_until(lambda: b"gateway_memory" in http_get(url)[1], 30, "the heap bound", proc)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url, timeout=5)
    finally:
        proc.stop()
    reply = info.value
    assert reply.code == 503 and reply.headers["retry-after"] == "1"
    assert json.loads(reply.read())["error"]["type"] == "service_unavailable"


def test_health_and_unnamed_requests_go_to_the_policys_first_pool(tmp_path, capsys):
    """`/health` and a request the check names no cluster for (failureModeAllow while the
    control plane is down) went to `llm_backends` whatever the policy's first pool's cluster
    was: a load balancer's probe of a pool on `vllm_big` asked a host that may not exist
    (found by a review of the docs against the code)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("queues: [{priority: 0, name: p0, maxQueueSize: 10, timeout: 8s,"
                      " dropPolicy: tail}]\npools:\n  - {name: big, cluster: vllm_big}\n")
    assert main(["--policy", str(policy), "--cluster", "vllm_big=10.0.0.7:8000"]) == 0
    [host] = hcm_of(yaml.safe_load(capsys.readouterr().out))["route_config"]["virtual_hosts"]
    targets = {r["match"].get("path", r["match"].get("prefix")): r["route"]["cluster"]
               for r in host["routes"] if "cluster" in r.get("route", {})}
    assert targets["/health"] == "vllm_big" and targets["/"] == "vllm_big", targets


def test_a_new_first_pool_cluster_is_what_envoy_reads():
    """Envoy's default route and /health go to the first pool's cluster: a reload that
    changes it (pools reordered onto clusters Envoy has) said nothing was left for Envoy."""
    from llmvalve.core.policy import load_policy
    from llmvalve.gateway.envoy_config import envoy_read_changes

    head = "queues: [{priority: 0, name: p0, maxQueueSize: 9, timeout: 8s, dropPolicy: tail}]\n"
    a = load_policy(head + "pools: [{name: a, cluster: ca}, {name: b, cluster: cb, "
                    "models: [m]}]\n")
    b = load_policy(head + "pools: [{name: b, cluster: cb}, {name: a, cluster: ca, "
                    "models: [m]}]\n")
    assert envoy_read_changes(a, b) == ["the first pool's cluster (Envoy's default route and "
                                        "/health)"]
    assert envoy_read_changes(a, a) == []
