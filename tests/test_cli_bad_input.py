"""Bad command-line values get one line and a non-zero exit, never a traceback, and are
refused before a run whose results they would lose (found by a review that probed every
subcommand)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llmvalve import cli
from llmvalve.processes import port_free


def run(args: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmvalve.cli", *args], input=stdin,
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("args, code", [
    (["simulate", "--scenario", "steady", "--plot", "/no/such/dir/x.png"], 2),
    (["simulate", "--scenario", "steady", "--oracle", "--oracle-window", "1e-9"], 2),
    (["load", "--scenario", "steady", "--target", "notaurl"], 2),
    (["load", "--scenario", "steady", "--json", "/no/such/dir/x.json"], 2),
    (["sim-backend", "--port", "70000"], 2),
    (["sim-backend", "--port", "65535", "--count", "3"], 2),
    (["up", "--admin-grpc-port", "70000"], 2),
    (["serve", "--http", "nonsense"], 2),
    (["serve", "--log-level", "bogus"], 2),
    (["status", "--grpc", "127.0.0.1:70000"], 2),
    (["status", "--timeout", "nan"], 2),
    (["serve", "--drain-timeout", "-1"], 2),
    (["serve", "--watch-interval", "nan"], 2),
    (["bench", "--scenario", "steady", "--time-scale", "0"], 2),  # was taken for the default
    (["load", "--scenario", "steady", "--drain", "-1"], 2),
    (["load", "--scenario", "steady", "--every", "nan"], 2),
    (["top", "--interval", "0"], 2),
    (["top", "--iterations", "-1"], 2),
    (["override", "--limit", "nan"], 2),
    (["load", "--scenario", "steady", "--load-scale", "nan"], 2),  # it hung
    (["bench", "--scenario", "steady", "--load-scale", "-1"], 2),
    (["simulate", "--scenario", "steady", "--seeds", "1-1000000000"], 2),  # filled the memory
    (["simulate", "--scenario", "steady", "--gateways", "100000"], 2),
    # a scrape bound the file passes, the flags not (would run for hours)
    (["simulate", "--scenario", "steady", "--backends", "4096", "--gateways", "64"], 2),
    # up checks what it can before it starts a process (they failed in a child's log)
    (["up", "--controller", "bogus"], 2),
    (["up", "--profile", "huge"], 2),
    (["up", "--time-scale", "0"], 2),
    (["up", "--backends", "500"], 2),
    (["up", "--policy", "/no/such/policy.yaml"], 2),
    (["serve", "--controller", "static:0"], 2),
    (["serve", "--metrics-url", "nonsense"], 2),  # it was scraped, and failed, forever
    # found by a review: a traceback, a whole run against a URL that could not work, a run
    # that filled the memory, a backend whose clock was NaN, a benchmark that started anyway
    (["load", "--scenario", "steady", "--target", "http://127.0.0.1:abc"], 2),
    (["load", "--scenario", "steady", "--target", "http://127.0.0.1:99999"], 2),
    (["load", "--scenario", "steady", "--target", "http://127.0.0.1:8080/?x=1"], 2),
    (["load", "--scenario", "steady", "--path", "v1/chat/completions"], 2),
    (["load", "--scenario", "steady", "--load-scale", "1e6"], 2),
    (["sim-backend", "--time-scale", "nan"], 2),
    (["sim-backend", "--ports", "8001,8002", "--count", "3"], 2),  # --count was ignored
    (["load", "--scenario", "steady", "--key", ""], 2),  # it sent the demo key
    (["bench", "--scenario", "overhead", "--json", "/no/such/dir/x.json"], 2),
    (["bench", "--scenario", "overhead", "--rates", "abc"], 2),
    (["bench", "--scenario", "overhead", "--duration", "0"], 2),
    (["bench", "--scenario", "overhead", "--plot", "x.png"], 2),
    (["bench", "--scenario", "overload-sweep", "--sweep-loads", "1,nan"], 2),
    # found by a trial of simulate's input: a traceback from matplotlib, options ignored or
    # read as their default without a word
    (["simulate", "--scenario", "steady", "--plot", "x.txt"], 2),
    (["bench", "--scenario", "steady", "--plot", "x.txt"], 2),
    (["simulate", "--scenario", "steady", "--controllers", ""], 2),
    (["simulate", "--scenario", "steady", "--seeds", ""], 2),
    (["simulate", "--scenario", "steady", "--oracle-window", "5"], 2),
    (["simulate", "--scenario", "steady", "--no-hindsight"], 2),
    (["simulate", "--scenario", "steady", "--judge", "--oracle"], 2),
    (["simulate", "--scenario", "steady", "--capacity", "--oracle"], 2),
    # found by a trial of the other commands' input: an empty file or name read as the
    # current folder or as the default; options taken and ignored; up started everything
    # before Envoy refused its listen address or a port given twice
    (["serve", "--policy", ""], 2),
    (["serve", "--admin-token-file", ""], 2),
    (["up", "--policy", ""], 2),
    (["load", "--scenario", ""], 2),
    (["load", "--scenario", "steady", "--model", ""], 2),
    (["status", "--ca-file", ""], 2),  # it fell back to plain gRPC
    (["status", "--token-file", ""], 2),
    (["override", "--pool", "", "--clear"], 2),
    (["sim-backend", "--model", ""], 2),
    (["bench", "--scenario", "steady", "--modes", ""], 2),
    (["bench", "--scenario", "overhead", "--modes", "adaptive"], 2),  # exit 0, no results
    (["bench", "--scenario", "steady", "--rates", "100"], 2),
    (["bench", "--scenario", "steady", "--duration", "3"], 2),
    (["bench", "--scenario", "steady", "--no-simulate", "--sim-draws", "3"], 2),
    (["up", "--listen", "not a host", "--port", "0", "--admin-port", "0"], 2),
    (["up", "--port", "47311", "--admin-port", "47311"], 2),
    (["override", "--limit", "5", "--for", "0"], 2),  # the server's field named, not --for
    (["override", "--clear", "--for", "5m"], 2),
    (["sim-backend", "--ports", "47201,47201"], 2),
    (["sim-backend", "--ports", "47201,,47202"], 2),
    (["load", "--scenario", "steady", "--keys", "nosuch=sk-x"], 2),
    (["load", "--scenario", "steady", "--policy", "/no/such/policy.yaml"], 2),
    (["serve", "--replicas-interval", "5"], 2),
    (["serve", "--envoy-admin", "http://127.0.0.1:9901"], 2),  # read as the host http
    (["status", "--admin", "localhost:9100"], 2),
    (["status", "--admin", "http://127.0.0.1:9100/?x=1"], 2),  # a base URL: no query
    (["status", "--grpc", "[::1"], 2),
])
def test_a_bad_value_is_one_line_and_exit_2(args, code, capsys):
    # in this process, as `llmvalve` runs it (cli.main), not in a child each: 79 interpreters
    # started and imported took half a minute of the suite; a traceback here is an exception
    # out of main, and the child's own path is tested below
    try:
        returned = cli.main(args)
    except SystemExit as exc:  # argparse's own errors
        returned = exc.code
    err = capsys.readouterr().err
    assert returned == code, err
    assert "Traceback" not in err  # nothing caught and printed whole on the way out
    assert "--" in err.strip().splitlines()[-1]  # it names the flag


def test_an_empty_file_name_token_file_or_several_keys_is_refused(tmp_path: Path):
    """Found by a trial: `policy check ""` read the current folder; `status --token-file
    EMPTY` called without a token (serve refuses such a file, and the docs said the commands
    did); `hash-key -` printed the first of two piped keys' hash alone."""
    done = run(["policy", "check", ""])  # it read the current folder
    assert done.returncode == 2 and b"argument file: must not be empty" in done.stderr
    empty = tmp_path / "token"
    empty.write_text("\n")
    done = run(["status", "--token-file", str(empty), "--grpc", "127.0.0.1:1"])
    assert done.returncode == 1 and b"empty" in done.stderr, done.stderr
    done = run(["policy", "hash-key", "-"], b"sk-a\nsk-b\n")
    assert done.returncode == 1 and done.stdout == b"", done.stdout
    assert b"one key at a time" in done.stderr
    done = run(["policy", "hash-key", "-"], b"sk-a\n")
    assert done.returncode == 0 and done.stdout.startswith(b"sha256:")
    done = run(["policy", "hash-key", "-"], b"sk\ta\n")
    assert done.returncode == 1 and b"control character" in done.stderr


def test_an_unreadable_token_file_or_key_is_a_message(tmp_path: Path):
    binary = tmp_path / "token"
    binary.write_bytes(b"\xff\xfe")
    for args, stdin in ((["top", "--token-file", str(binary), "--iterations", "1"], b""),
                        (["override", "--clear", "--token-file", str(binary)], b""),
                        (["policy", "hash-key", "-"], b"\xff\xfe\n")):
        done = run(args, stdin)
        assert done.returncode == 1 and b"Traceback" not in done.stderr, args
        assert b"UTF-8" in done.stderr, args


@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
def test_up_on_a_port_in_use_says_so_before_it_starts_anything(flag: str):
    """A second `llmvalve up` on the first one's ports printed its banner (the first stack
    answered its readiness checks), then stopped as its own processes failed, and exited 0
    (found by a new-user trial)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        others = {"--port": "0", "--admin-port": "0"}
        done = run(["up", *(a for f, v in {**others, flag: str(port)}.items() for a in (f, v))])
    assert done.returncode == 1, done.stderr
    assert f"{flag} {port} in use".encode() in done.stderr
    assert b"is up" not in done.stdout and b"starting" not in done.stdout


def test_a_port_left_only_in_time_wait_reads_free():
    """A stopped stack leaves its accepted connections in TIME-WAIT for a minute: `llmvalve up`
    run again at once said "--port 8080 in use" with nothing listening there (found by a
    new-user trial). The servers bind with SO_REUSEADDR, which TIME-WAIT does not stop."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Envoy's listener
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME-WAIT
            client.recv(1)
        assert not port_free(port)  # listening
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the case: a bind without SO_REUSEADDR fails
    assert port_free(port)


def test_a_reader_that_stops_early_gets_no_traceback():
    """`llmvalve status | head`: a BrokenPipeError traceback (found by a new-user trial)."""
    proc = subprocess.Popen([sys.executable, "-m", "llmvalve.cli", "simulate", "--scenario",
                             "steady", "--controllers", "none", "--seeds", "1-3", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(60) == 141 and stderr == b"", stderr


def test_every_option_of_every_command_says_what_it_is():
    """`--help` had options without a word (load --path, sim-backend --host, …; found by a
    review of the docs against the code)."""
    import argparse

    from llmvalve.cli import build_parser

    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [f"{name} {action.option_strings[0]}"
              for name, parser in commands.choices.items() for action in parser._actions
              if action.option_strings and action.help is None
              and not isinstance(action, argparse._HelpAction)]
    assert silent == []


def test_load_keys_name_the_tenants_the_requests_are_sent_as(tmp_path: Path):
    """A trace's priority without named tenants sends as CLASS-pN: `--keys` is checked
    against the tenants of the generated requests (a check built from the file's classes
    took `r`, which sends nothing, and refused `r-p0`, which does)."""
    scenario = tmp_path / "t.yaml"
    scenario.write_text("duration: 20s\nclasses:\n  - {name: r, trace: {file: azure-conv, "
                        "split: {0: 0.5, 1: 0.5}}}\n")
    done = run(["load", "--scenario", str(scenario), "--keys", "r=sk-x"])
    assert done.returncode == 2, done.stderr
    assert b"its tenants: r-p0, r-p1" in done.stderr
