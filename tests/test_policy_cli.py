"""`llmvalve policy check` and `llmvalve policy hash-key`, run as real processes."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

HERE = Path(__file__).parent
SEED_CM = HERE / "data" / "seed-policy-configmap.yaml"
DEFAULT_POLICY = Path(str(resources.files("llmvalve") / "data" / "default-policy.yaml"))


def llmvalve(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmvalve.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, encoding="utf-8")


def test_check_seed_configmap_ok():
    proc = llmvalve("policy", "check", str(SEED_CM))
    assert proc.returncode == 0, proc.stderr
    bare = (HERE / "data" / "seed-policy.yaml").read_text()
    version = hashlib.sha256(bare.encode()).hexdigest()[:12]
    assert proc.stdout == (
        f"{SEED_CM}: ok — 3 queues (P0 realtime-interactive, P1 agent-workflow, "
        "P2 batch-extraction), 0 tenants, anonymous P1 (max P0), controller adaptive, "
        f"version {version}\n")
    assert proc.stderr == ""


def test_check_default_policy_ok():
    proc = llmvalve("policy", "check", str(DEFAULT_POLICY))
    assert proc.returncode == 0, proc.stderr
    assert ": ok — 3 queues" in proc.stdout
    assert "2 tenants, anonymous off, controller adaptive" in proc.stdout


def test_check_broken_policy_prints_every_issue_and_exits_1():
    path = HERE / "policy_cases" / "many-errors.yaml"
    proc = llmvalve("policy", "check", str(path))
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    issues = [ln for ln in lines if re.match(rf"^{re.escape(str(path))}:\d+: \S+: .+", ln)]
    assert len(issues) == 6
    assert issues[0] == f"{path}:10: queues[0].timeout: must be > 0, got 0s"
    assert lines[-1] == f"{path}: 6 errors"


def test_check_configmap_error_lines_are_outer_lines(tmp_path):
    broken = tmp_path / "cm.yaml"
    text = SEED_CM.read_text().replace("maxQueueSize: 1000", "maxQueueSize: many")
    broken.write_text(text)
    proc = llmvalve("policy", "check", str(broken))
    assert proc.returncode == 1
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "maxQueueSize: many" in ln)
    assert proc.stderr.splitlines()[0] == (
        f"{broken}:{line}: queues[2].maxQueueSize: expected an integer, got a string")


def test_check_missing_file():
    proc = llmvalve("policy", "check", "/nonexistent/policy.yaml")
    assert proc.returncode == 1
    assert "/nonexistent/policy.yaml: cannot read" in proc.stderr


def test_check_a_file_saved_in_another_encoding(tmp_path):
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("# équipe\nqueues: []\n".encode("latin-1"))
    proc = llmvalve("policy", "check", str(latin))
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"{latin}: cannot read: not UTF-8 text (byte 2); save it as UTF-8"


def test_hash_key_argument_and_stdin():
    expected = "sha256:" + hashlib.sha256(b"sk-llmvalve-demo-p0").hexdigest()
    proc = llmvalve("policy", "hash-key", "sk-llmvalve-demo-p0")
    assert (proc.returncode, proc.stdout) == (0, expected + "\n")
    proc = llmvalve("policy", "hash-key", "-", stdin="sk-llmvalve-demo-p0\n")
    assert (proc.returncode, proc.stdout) == (0, expected + "\n")
    assert expected in DEFAULT_POLICY.read_text()


def test_policy_needs_a_subcommand():
    proc = llmvalve("policy")
    assert proc.returncode == 2
    assert "check" in proc.stderr


def test_check_does_not_import_heavy_modules():
    code = (
        "import sys, argparse\n"
        "from llmvalve.commands import policy as policy_cli\n"
        "p = argparse.ArgumentParser(); policy_cli.add_arguments(p)\n"
        f"rc = policy_cli.run(p.parse_args(['check', {str(SEED_CM)!r}]))\n"
        "heavy = [m for m in ('grpc', 'aiohttp', 'matplotlib') if m in sys.modules]\n"
        "print(rc, heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.splitlines()[-1] == "0 []", proc.stderr


def test_the_policy_reference_quotes_the_default_policys_check():
    """docs/policy.md opens with `policy check` on the packaged default: the line it shows is
    the command's own (the version changes with every edit of the file)."""
    out = llmvalve("policy", "check", str(DEFAULT_POLICY)).stdout.strip()
    line = out.replace(str(DEFAULT_POLICY), "default-policy.yaml")
    docs = Path(__file__).parent.parent / "docs"
    assert line in (docs / "policy.md").read_text()
    version = re.search(r"version ([0-9a-f]{12})", line).group(1)
    assert f'"policy_version": "{version}"' in (docs / "metrics.md").read_text()
