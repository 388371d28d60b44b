"""`llmvalve load` against a scripted gateway: the command's arguments, live lines, table and
JSON."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from llmvalve.cli import main
from test_bench_loadgen import Gateway

SCENARIO = """
name: tiny
duration: 2s
classes:
  - {name: chat, priority: 0, tenant: app, rate: 5, prompt: 50, output: 6}
  - {name: batch, priority: 2, tenant: batch, rate: 3, prompt: 80, output: 4,
     retry: {mode: immediate, maxAttempts: 2}}
"""


@pytest.fixture
def gateway_url():
    gw = Gateway()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state: dict = {}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "served-model"}]})

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", gw.handle)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        state["runner"] = runner
        state["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                              loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield state["url"], gw
    asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_load_command(gateway_url, tmp_path, capsys):
    url, gw = gateway_url
    sc = tmp_path / "tiny.yaml"
    sc.write_text(SCENARIO)
    out = tmp_path / "res.json"
    code = main(["load", "--target", url, "--scenario", str(sc), "--time-scale", "2",
                 "--drain", "4", "--every", "0.5", "--keys", "app=k-app", "--key", "k-other",
                 "--json", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    cls = res["controllers"]["gateway"]["classes"]
    assert cls["0"]["offered"] > 0 and cls["0"]["completed"] == cls["0"]["offered"]
    assert cls["2"]["rejected"] == cls["2"]["offered"]  # the scripted gateway sheds P2
    assert res["controllers"]["gateway"]["traffic_classes"]["batch"][
        "attempts_per_request"] == 3.0
    assert {h["Authorization"] for h in gw.headers} == {"Bearer k-app", "Bearer k-other"}
    assert all(b["model"] == "served-model" for b in gw.bodies)  # discovered
    err = capsys.readouterr().err
    assert "in flight" in err  # live lines while it ran


def test_load_command_table_and_bad_arguments(gateway_url, tmp_path, capsys):
    url, _ = gateway_url
    sc = tmp_path / "tiny.yaml"
    sc.write_text(SCENARIO)
    assert main(["load", "--target", url, "--scenario", str(sc), "--time-scale", "4",
                 "--drain", "2", "--every", "0"]) == 0
    text = capsys.readouterr().out
    assert "P0 att" in text and "preempt" not in text
    assert main(["load", "--scenario", "no-such-scenario"]) == 2
    assert main(["load", "--scenario", str(sc), "--keys", "oops"]) == 2


def test_load_exits_1_when_every_request_failed(tmp_path, capsys):
    """Nothing listens at the target: every request fails to connect. The table still
    prints, and the exit status says the run measured nothing (it was 0)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sc = tmp_path / "tiny.yaml"
    sc.write_text(SCENARIO)
    code = main(["load", "--target", f"http://127.0.0.1:{port}", "--scenario", str(sc),
                 "--time-scale", "4", "--drain", "1", "--every", "0", "--model", "m"])
    assert code == 1
    captured = capsys.readouterr()
    assert "no request was answered or shed" in captured.err
    assert "ClientConnectorError" in captured.err
    assert "goodput" in captured.out  # the table


def test_load_exits_1_when_nothing_was_answered(tmp_path, capsys):
    """A target that takes connections and never answers (a hung gateway): no request failed,
    none was answered; the exit status said 0 (found by a review)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(128)  # connections complete in the kernel's backlog; nobody reads them
        sc = tmp_path / "tiny.yaml"
        sc.write_text(SCENARIO)
        code = main(["load", "--target", f"http://127.0.0.1:{s.getsockname()[1]}",
                     "--scenario", str(sc), "--time-scale", "4", "--drain", "1", "--every",
                     "0", "--model", "m"])
    assert code == 1
    assert "no request was answered or shed" in capsys.readouterr().err


def test_an_interrupted_load_says_what_it_had_done(gateway_url, tmp_path, capsys,
                                                    monkeypatch):
    """Ctrl-C printed only "interrupted" (found by a new-user trial)."""
    import re

    from llmvalve.commands import load

    url, _ = gateway_url
    sc = tmp_path / "tiny.yaml"
    sc.write_text(SCENARIO)
    drive = load._drive

    async def interrupted(gen, every):  # Ctrl-C one second in
        task = asyncio.ensure_future(drive(gen, every))
        await asyncio.sleep(1.0)
        task.cancel()
        raise KeyboardInterrupt

    monkeypatch.setattr(load, "_drive", interrupted)
    code = main(["load", "--target", url, "--scenario", str(sc), "--every", "0"])
    assert code == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    found = re.fullmatch(r"interrupted at t=[\d.]+ s of 2 s: sent (\d+), answered (\d+), "
                         r"refused \d+ times, \d+ in flight", line)
    assert found, line
    assert int(found[1]) >= 3 and int(found[2]) >= 1
