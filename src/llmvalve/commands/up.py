"""`llmvalve up`: simulated backends + control plane + Envoy on this machine, in one command
(the stack is `llmvalve.stack.Stack`). Ctrl-C or SIGTERM stops the control plane (it drains
for at most 5 s: requests in flight may finish), then Envoy, then the backends.

While it runs it says in its terminal what the control plane did with each edit of the policy
file, and starts a control plane that exits again on its own ports, as Kubernetes restarts a
container (at most `RESTARTS_PER_MINUTE`); any other process that exits stops the stack."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from llmvalve.commands.args import (
    controller,
    count,
    file_path,
    ip_address,
    port_number,
    positive_number,
)
from llmvalve.processes import port_free
from llmvalve.stack import DEMO_KEYS, Stack, StackConfig

MAX_BACKENDS = 64  # each is a process on this machine (a demo stack, not a fleet)
RESTARTS_PER_MINUTE = 3  # a control plane that exits more often stops the stack (a crash loop)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=file_path, default=None,
                        help="policy file (default: a copy of the packaged default policy in "
                        "the logs folder, named in the banner)")
    from llmvalve.engine.profiles import PROFILES  # pure data: cheap to import

    parser.add_argument("--backends", type=count, default=2, help="simulated backends (default 2)")
    parser.add_argument("--profile", default="small", choices=tuple(PROFILES),
                        help="engine profile (default small)")
    parser.add_argument("--time-scale", type=positive_number, default=1.0,
                        help="simulated engine speed-up (default 1)")
    parser.add_argument("--port", type=port_number, default=8080,
                        help="Envoy listener (default 8080; 0: a free port, in the banner)")
    parser.add_argument("--listen", type=ip_address, default="127.0.0.1",
                        help="Envoy listener address (default 127.0.0.1)")
    parser.add_argument("--admin-port", type=port_number, default=9100,
                        help="control plane admin HTTP (default 9100; 0: a free port)")
    parser.add_argument("--admin-grpc-port", type=port_number, default=9101,
                        help="control plane admin gRPC API: status, top, override (default "
                        "9101; a free port if it is taken)")
    parser.add_argument("--admission", choices=("http", "grpc"), default="http",
                        help="how Envoy asks the control plane: ext_authz over HTTP (default) "
                        "or gRPC")
    parser.add_argument("--controller", type=controller, default=None,
                        help="adaptive (default: the policy's), seed, static:N, none")


def run(args: argparse.Namespace) -> int:
    from llmvalve.core.policy import PolicyError
    from llmvalve.gateway.policy_file import default_policy_path, load_policy_file

    if not 1 <= args.backends <= MAX_BACKENDS:
        print(f"llmvalve up: --backends must be from 1 to {MAX_BACKENDS}", file=sys.stderr)
        return 2
    given: dict[int, str] = {}  # port → the flag that gave it
    for flag, port in (("--port", args.port), ("--admin-port", args.admin_port),
                       ("--admin-grpc-port", args.admin_grpc_port)):
        if port and port in given:
            print(f"llmvalve up: {given[port]} and {flag} are both {port}: each needs its own "
                  "(0: a free port)", file=sys.stderr)
            return 2
        given[port] = flag
    if args.policy is not None:  # before any process starts: its error, not a child's log
        try:
            load_policy_file(args.policy)
        except (PolicyError, OSError) as exc:
            print(f"llmvalve up: --policy: {exc}", file=sys.stderr)
            return 2
    # Another stack on these ports would answer this one's readiness checks: it would print
    # its banner, then stop as its Envoy and control plane fail to bind.
    taken = [f"{flag} {port}" for flag, port, host in (("--port", args.port, args.listen),
                                                       ("--admin-port", args.admin_port,
                                                        "127.0.0.1"))
             if port and not port_free(port, host)]
    if taken:
        print(f"llmvalve up: {' and '.join(taken)} in use (another `llmvalve up`?); stop it, "
              "or choose others (0: a free port)", file=sys.stderr)
        return 1
    policy, workdir = args.policy, None
    if policy is None:  # a copy to edit: reloaded on save, as any policy file the stack runs
        workdir = Path(tempfile.mkdtemp(prefix="llmvalve-up-"))
        policy = workdir / "policy.yaml"
        shutil.copyfile(default_policy_path(), policy)
    stack = Stack(StackConfig(policy=policy, workdir=workdir, backends=args.backends,
                              profile=args.profile, time_scale=args.time_scale, port=args.port,
                              listen_address=args.listen, admin_port=args.admin_port,
                              admin_grpc_port=(args.admin_grpc_port
                                               if port_free(args.admin_grpc_port) else 0),
                              admission=args.admission, controller=args.controller))
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print("starting: backends, control plane, Envoy …", flush=True)
        stack.start()
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"llmvalve up: {exc}\nlogs: {stack.workdir}", file=sys.stderr)
        return 1
    print(banner(stack), flush=True)
    try:
        return 0 if watch(stack, stopping) else 1
    finally:
        print("stopping …", flush=True)
        stack.stop()


def watch(stack: Stack, stopping: threading.Event) -> bool:
    """Until `stopping`: say each policy reload, start an exited control plane again. False
    when a process exited for good."""
    assert stack.control_plane is not None
    reloads = PolicyReloads(stack.control_plane.log_path)
    restarts: deque[float] = deque(maxlen=RESTARTS_PER_MINUTE)
    while not stopping.is_set():
        for line, ok in reloads.read():
            print(line, file=sys.stdout if ok else sys.stderr, flush=True)
        control_plane = stack.control_plane
        now = time.monotonic()
        if (control_plane is not None and not control_plane.alive()
                and (len(restarts) < RESTARTS_PER_MINUTE or now - restarts[0] > 60.0)):
            restarts.append(now)
            print(f"llmvalve up: the control plane exited ({control_plane.popen.returncode});"
                  " starting it again", file=sys.stderr, flush=True)
            try:
                stack.start_control_plane()
            except (RuntimeError, TimeoutError, OSError) as exc:
                print(f"llmvalve up: {exc}", file=sys.stderr)
                return False
            print("llmvalve up: the control plane is back", flush=True)
        for proc in [stack.envoy, stack.control_plane, *(p for p, _ in stack.backends)]:
            if proc is not None and not proc.alive():
                print(f"llmvalve up: {proc.name} exited ({proc.popen.returncode}); "
                      f"see {proc.log_path}", file=sys.stderr)
                return False
        stopping.wait(0.5)
    return True


class PolicyReloads:
    """The control plane's reloads of the policy file, read from its log as it grows: a refused
    edit was said only there, in /status and in a metric, not in `up`'s own terminal."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.offset = log_path.stat().st_size if log_path.exists() else 0
        self.partial = b""

    def read(self) -> list[tuple[str, bool]]:
        """(what to say, applied) for each `policy_reload` logged since the last read."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.offset)
                data = self.partial + f.read()
                self.offset = f.tell()
        except OSError:
            return []
        *lines, self.partial = data.split(b"\n")
        out = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or record.get("event") != "policy_reload":
                continue
            if record.get("ok"):
                out.append((f"policy reloaded ({record.get('trigger')}): "
                            f"{record.get('version')}", True))
            else:
                out.append(("policy refused, the running policy stays: "
                            f"{record.get('error')}", False))
        return out



def banner(stack: Stack) -> str:
    c = stack.config
    gw = stack.gateway_url
    backends = "; ".join(
        f"{pool}: " + ", ".join(f"http://{c.host}:{port}" for _, port in procs)
        for pool, procs in stack.pool_backends.items())
    keys = "\n".join(f"    {who:22s} {key}" for who, key in DEMO_KEYS.items())
    # this environment's (the checkout's .venv has the openai package: its dev extra)
    python = sys.executable
    script = Path(sys.executable).with_name("llmvalve")
    llmvalve = str(script) if script.exists() else "llmvalve"
    p0 = DEMO_KEYS["interactive-app (P0)"]
    return f"""
llmvalve is up.
  gateway (OpenAI API)   {gw}/v1
  dashboard              {stack.admin_url}/dashboard
  control plane admin    {stack.admin_url}/status   {stack.admin_url}/metrics
  control plane admin API {c.host}:{c.admin_grpc_port} (llmvalve status / top / override)
  Envoy admin            {stack.envoy_admin_url}
  backends (by pool)     {backends}
  policy                 {c.policy}
                         (edit it: reloaded within a second; a bad edit is refused, the
                         running policy stays, and this terminal names its line and field)
  logs                   {stack.workdir}
  demo API keys:
{keys}

try:
  curl -sS {gw}/v1/chat/completions -H 'authorization: Bearer {p0}' \\
    -H 'content-type: application/json' \\
    -d '{{"model": "sim-{c.profile}", "max_tokens": 32,
         "messages": [{{"role": "user", "content": "hi"}}]}}' -i

  # the small model's own pool (policy: pools[].models): ask for model "sim-tiny"

{python} - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{gw}/v1", api_key="{p0}")
for chunk in client.chat.completions.create(model="sim-{c.profile}", stream=True,
        messages=[{{"role": "user", "content": "hello"}}]):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
EOF

  {llmvalve} load --target {gw} --scenario burst     # then watch the dashboard
  {llmvalve} top --grpc {c.host}:{c.admin_grpc_port}
A control plane that exits (kill it to see Envoy refuse requests while it is away) is started
again. Ctrl-C stops everything: the control plane drains first (at most 5 s: streams in flight
may finish, new requests get 503), then Envoy and the backends.
"""
