"""How much one `llmvalve sim-backend` process sustains on this machine.

    python -m llmvalve.backend.loadtest [--profile llama3-8b-h100] [--concurrency 64,256,512]
        [--backends 1] [--time-scale 1] [--tokens-per-chunk 1] [--duration 10] [--json]

For each concurrency C it starts one sim-backend process (with `--backends` engines), keeps C
streaming chat requests open from this process (closed loop: a finished stream is replaced at
once), and after a warm-up measures over `--duration` seconds:
  tok/s         output tokens the engines produced per wall second (= token events)
  chunks/s      SSE chunks the client received per second
  expected      tok/s the same engines produce in virtual time with the same requests running
                (the pure `Engine`, no IO): `kept up` = tok/s ÷ expected
  cpu           the server process's CPU time per wall second (1.0 = one core saturated)
  µs/token      server CPU microseconds per token event
  resyncs       times an engine fell > 100 ms of wall time behind its clock
  load1         the machine's load average before the run: other work on the machine is noise
The client parses no JSON (it counts SSE events), so it stays cheaper than the server it
measures; its own CPU share is reported too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

PROMPT_TOKENS = 256


@dataclass
class Row:
    concurrency: int
    backends: int
    tokens_per_chunk: int
    time_scale: float
    tok_s: float
    chunks_s: float
    expected_tok_s: float
    kept_up: float
    server_cpu: float
    client_cpu: float
    us_per_token: float
    resyncs: int
    load1: float  # the machine's 1-minute load average before the run (other work = noise)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def expected_tok_s(profile_name: str, running: int, mean_output: int, seconds: float) -> float:
    """Tokens per engine second of one engine with `running` streams in a closed loop (the
    same output-length distribution as the client's), stepped in virtual time."""
    from llmvalve.engine.engine import Engine
    from llmvalve.engine.profiles import get_profile

    engine = Engine(get_profile(profile_name))
    rng = random.Random(1)
    n = 0

    def add(now: float) -> None:
        nonlocal n
        out = rng.randint(mean_output // 2, mean_output * 3 // 2)
        engine.add(f"r{n}", PROMPT_TOKENS, out, now, max_tokens=out)
        n += 1

    for _ in range(running):
        add(0.0)
    t, tokens, warm = 0.0, 0, seconds
    while t < warm + seconds:
        step = engine.step(t)
        t += step.duration_s
        for ev in step.events:
            if t >= warm:
                tokens += 1
            if ev.finished:
                add(t)
    return tokens / seconds


async def _measure(ports: list[int], pid: int, concurrency: int, output_tokens: int,
                   warmup_s: float, duration_s: float) -> tuple[float, int, float, dict]:
    import aiohttp

    chunks = 0
    stop = False
    rng = random.Random(2)

    async def stream(session: aiohttp.ClientSession, port: int) -> None:
        nonlocal chunks
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        while not stop:
            out = rng.randint(output_tokens // 2, output_tokens * 3 // 2)
            body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": out,
                    "stream": True}
            headers = {"x-sim-prompt-tokens": str(PROMPT_TOKENS), "x-sim-output-tokens": str(out)}
            async with session.post(url, json=body, headers=headers) as resp:
                async for data in resp.content.iter_any():
                    chunks += data.count(b"\n\n")

    async def stats(session: aiohttp.ClientSession) -> dict:
        out = {"generation_tokens": 0, "resyncs": 0}
        for port in ports:
            async with session.get(f"http://127.0.0.1:{port}/admin/stats") as resp:
                s = await resp.json()
            out["generation_tokens"] += s["generation_tokens"]
            out["resyncs"] += s["resyncs"]
        return out

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.ensure_future(stream(session, ports[i % len(ports)]))
                 for i in range(concurrency)]
        await asyncio.sleep(warmup_s)
        s0, c0, cpu0, ccpu0, t0 = (await stats(session), chunks, _cpu_seconds(pid),
                                   time.process_time(), time.perf_counter())
        await asyncio.sleep(duration_s)
        s1, c1, cpu1, ccpu1, t1 = (await stats(session), chunks, _cpu_seconds(pid),
                                   time.process_time(), time.perf_counter())
        stop = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wall = t1 - t0
    result = {"tokens": s1["generation_tokens"] - s0["generation_tokens"],
              "resyncs": s1["resyncs"] - s0["resyncs"], "client_cpu": (ccpu1 - ccpu0) / wall}
    return wall, c1 - c0, cpu1 - cpu0, result


def run_one(profile: str, concurrency: int, backends: int, time_scale: float,
            tokens_per_chunk: int, output_tokens: int, warmup_s: float,
            duration_s: float) -> Row:
    from llmvalve.engine.profiles import get_profile

    load1 = os.getloadavg()[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmvalve.cli", "sim-backend", "--port", "0", "--count",
         str(backends), "--profile", profile, "--time-scale", str(time_scale),
         "--tokens-per-chunk", str(tokens_per_chunk)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ports = []
        for _ in range(backends):
            line = proc.stdout.readline()
            if "ready on" not in line:
                raise RuntimeError(f"sim-backend did not start: {line!r}")
            ports.append(int(line.strip().rsplit(":", 1)[1]))
        wall, chunks, cpu, r = asyncio.run(
            _measure(ports, proc.pid, concurrency, output_tokens, warmup_s, duration_s))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    p = get_profile(profile)
    per_engine = [concurrency // backends + (1 if i < concurrency % backends else 0)
                  for i in range(backends)]
    expected = sum(expected_tok_s(profile, min(n, p.max_num_seqs), output_tokens, 60.0)
                   for n in per_engine if n) * time_scale
    tok_s = r["tokens"] / wall
    return Row(concurrency, backends, tokens_per_chunk, time_scale, round(tok_s),
               round(chunks / wall), round(expected), round(tok_s / expected, 3),
               round(cpu / wall, 3), round(r["client_cpu"], 3),
               round(1e6 * cpu / max(1, r["tokens"]), 1), r["resyncs"], round(load1, 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmvalve.backend.loadtest",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--concurrency", default="64,256",
                        help="comma-separated numbers of concurrent streams")
    parser.add_argument("--backends", type=int, default=1, help="engines in the process")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--output-tokens", type=int, default=256,
                        help="mean output length (uniform over mean/2 … 3·mean/2)")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    header = ("streams", "engines", "K", "scale", "tok/s", "chunks/s", "expected", "kept up",
              "cpu", "client", "µs/token", "resyncs", "load1")
    if not args.json:
        print(" ".join(f"{h:>9}" for h in header), flush=True)
    for c in (int(x) for x in args.concurrency.split(",")):
        row = run_one(args.profile, c, args.backends, args.time_scale, args.tokens_per_chunk,
                      args.output_tokens, args.warmup, args.duration)
        if args.json:
            print(json.dumps(asdict(row)), flush=True)
        else:
            print(" ".join(f"{v:>9}" for v in asdict(row).values()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
