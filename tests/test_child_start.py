"""Children start while another thread uses gRPC: `processes.Proc` forks (for the
parent-death signal) and gRPC must not restart its poller in the forked child."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A fresh interpreter: what counts is the environment gRPC sees when it is first imported.
PROGRAM = textwrap.dedent("""
    import asyncio, sys, threading, time
    from pathlib import Path
    from llmvalve.processes import Proc
    import grpc

    def busy():
        async def main():
            server = grpc.aio.server()
            server.add_insecure_port("127.0.0.1:0")
            await server.start()
            channel = grpc.aio.insecure_channel("127.0.0.1:1")
            while True:
                try:
                    await asyncio.wait_for(channel.channel_ready(), 0.01)
                except Exception:
                    pass
        asyncio.run(main())

    threading.Thread(target=busy, daemon=True).start()
    time.sleep(0.5)
    failed = []
    for i in range(200):
        log = Path(sys.argv[1]) / f"child-{i}.log"
        rc = Proc(f"child-{i}", ["true"], log).popen.wait()
        if rc != 0:
            failed.append(f"{rc}: {log.read_text()[:160]}")
    print(len(failed), failed[:2])
""")


def test_children_start_while_another_thread_uses_grpc(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("0 "), done.stdout
