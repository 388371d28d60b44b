"""TLS on the admin listeners (serve --admin-tls-cert/--admin-tls-key): both admin ports speak
it, the commands trust a given CA (--ca-file), and a renewed certificate (a Secret swapped in
place) is served from the next connection on, without a restart. Certificates are made here
with the openssl command line."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from llmvalve.cli import main
from llmvalve.core.policy import load_policy
from llmvalve.gateway.control_plane import ControlPlane, ControlPlaneConfig

POLICY = load_policy("""
queues:
  - {priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
limiter: {controller: static, static: {limit: 8}}
""")


def make_cert(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", f"/CN={name}", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
def certs(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    return {name: make_cert(tmp_path, name) for name in ("first", "renewed")}


@pytest.fixture
async def plane(tmp_path, certs):
    served = tmp_path / "secret"  # the files serve reads, as a mounted Secret
    served.mkdir()
    for src, dst in zip(certs["first"], ("tls.crt", "tls.key"), strict=True):
        shutil.copy(src, served / dst)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    plane = ControlPlane(POLICY, ControlPlaneConfig(
        admin_token_file=token, admin_tls=(served / "tls.crt", served / "tls.key")))
    await plane.start()
    try:
        yield plane, served, token
    finally:
        await plane.stop()


def served_cert(port: int, ca: Path) -> bytes:
    """The DER certificate the admin HTTP port presents, checked against `ca`."""
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5,
                                context=context) as response:
        assert response.status == 200
        return response.fp.raw._sock.getpeercert(binary_form=True)


def der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def status(plane: ControlPlane, token: Path, *extra: str) -> int:
    return main(["status", "--grpc", f"127.0.0.1:{plane.ports['admin_grpc']}",
                 "--token-file", str(token), "--timeout", "5", *extra])


async def test_both_admin_ports_speak_tls_and_the_commands_trust_the_ca(plane, certs, capsys):
    plane, _, token = plane
    first_ca = certs["first"][0]
    port = plane.ports["admin"]
    assert await asyncio.to_thread(served_cert, port, first_ca) == der(first_ca)
    with pytest.raises(OSError):  # plain HTTP is not spoken there
        await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/metrics",
                                timeout=5)
    assert await asyncio.to_thread(status, plane, token, "--ca-file", str(first_ca)) == 0
    assert "controller" in capsys.readouterr().out
    assert await asyncio.to_thread(status, plane, token) == 1  # plain gRPC: refused
    assert await asyncio.to_thread(main, [
        "status", "--admin", f"https://127.0.0.1:{port}", "--token-file", str(token),
        "--ca-file", str(first_ca)]) == 0
    os.environ["LLMVALVE_ADMIN_CA"] = str(first_ca)
    try:
        assert await asyncio.to_thread(status, plane, token, "--tls-server-name",
                                       "localhost") == 0
    finally:
        del os.environ["LLMVALVE_ADMIN_CA"]


async def test_a_renewed_certificate_is_served_from_the_next_connection_on(plane, certs):
    plane, served, token = plane
    renewed_ca = certs["renewed"][0]
    tmp = served.with_name("new")  # as the kubelet swaps a Secret: whole files, then a rename
    tmp.mkdir()
    for src, dst in zip(certs["renewed"], ("tls.crt", "tls.key"), strict=True):
        shutil.copy(src, tmp / dst)
    os.replace(tmp / "tls.crt", served / "tls.crt")
    os.replace(tmp / "tls.key", served / "tls.key")
    port = plane.ports["admin"]
    assert await asyncio.to_thread(served_cert, port, renewed_ca) == der(renewed_ca)
    assert await asyncio.to_thread(status, plane, token, "--ca-file", str(renewed_ca)) == 0
    assert await asyncio.to_thread(status, plane, token, "--ca-file",
                                   str(certs["first"][0])) == 1


async def test_a_pair_that_does_not_load_keeps_the_last_good_one(plane, certs):
    plane, served, _ = plane
    shutil.copy(certs["renewed"][1], served / "tls.key")  # a key that is not the cert's
    first_ca = certs["first"][0]
    assert await asyncio.to_thread(served_cert, plane.ports["admin"], first_ca) == der(first_ca)


def test_a_certificate_that_does_not_load_stops_serve_with_one_line(certs, tmp_path):
    cert, _ = certs["first"]
    with pytest.raises(ValueError, match="--admin-tls-cert"):
        ControlPlane(POLICY, ControlPlaneConfig(admin_tls=(cert, certs["renewed"][1])))
    assert main(["serve", "--admin-tls-cert", str(cert)]) == 2  # without its key


def test_an_encrypted_key_is_refused_without_a_prompt_and_a_bad_ca_is_named(certs, tmp_path):
    """Found by a review: an encrypted key made OpenSSL ask for a pass phrase (on a terminal
    it froze the event loop); a CA file that is no PEM gave gRPC's own errors, which never
    name the file."""
    cert, key = certs["first"]
    locked = tmp_path / "locked.key"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-out", str(locked), "-aes256",
                    "-passout", "pass:secret"], check=True, capture_output=True)
    with pytest.raises(ValueError, match="--admin-tls-cert"):
        ControlPlane(POLICY, ControlPlaneConfig(admin_tls=(cert, locked)))
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    done = subprocess.run([sys.executable, "-m", "llmvalve.cli", "status", "--grpc",
                           "127.0.0.1:1", "--ca-file", str(garbage)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 1 and f"--ca-file {garbage}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert main(["status", "--admin", "https://127.0.0.1:1", "--tls-server-name", "x"]) == 2
