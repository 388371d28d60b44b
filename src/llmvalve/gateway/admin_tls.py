"""TLS for the admin listeners (admin HTTP and admin gRPC): a certificate chain and its key in
PEM files, such as a Kubernetes TLS Secret that cert-manager renews.

The files are read again when they change (size, mtime or ctime: a Secret is replaced by a
symlink swap), on the next handshake: a renewed certificate is served from the next connection
on, without a restart. A pair that does not load (a key that is not the certificate's, a file
half written) keeps the last good one, and is logged once. Python's ssl for HTTP (each
handshake may swap in the newest context: `sni_callback`, called for every ClientHello, with or
without a server name) and gRPC's own TLS, whose certificate fetcher it asks before each
handshake.
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path

import grpc

from llmvalve.gateway.file_stamp import file_stamp

log = logging.getLogger("llmvalve.admin_tls")


class AdminTls:
    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()  # gRPC asks from its own threads
        self._stamp = self._stat()
        self._pem, self._context = self._load()  # ValueError: it cannot serve at all
        self._failed_stamp: tuple | None = None

    def _stat(self) -> tuple:
        """Both files' stamps; () when either cannot be read."""
        stamps = (file_stamp(self.cert), file_stamp(self.key))
        return () if None in stamps else stamps

    def _load(self) -> tuple[tuple[bytes, bytes], ssl.SSLContext]:
        try:
            pem = (self.cert.read_bytes(), self.key.read_bytes())
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            # no pass phrase: an encrypted key is refused, never prompted for (a prompt on a
            # terminal froze the event loop it was read on)
            context.load_cert_chain(self.cert, self.key, password=lambda: b"")
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--admin-tls-cert {self.cert} / --admin-tls-key {self.key}: "
                             f"{exc}") from None
        context.sni_callback = self._on_hello
        return pem, context

    def _current(self) -> tuple[tuple[bytes, bytes], ssl.SSLContext]:
        """The newest pair that loads (read again if the files changed since)."""
        with self._lock:
            stamp = self._stat()
            if not stamp and self._failed_stamp != ():
                self._failed_stamp = ()
                log.warning("admin TLS: %s or %s is gone; kept the last good certificate",
                            self.cert, self.key)
            if stamp and stamp != self._stamp and stamp != self._failed_stamp:
                try:
                    self._pem, self._context = self._load()
                    self._stamp, self._failed_stamp = stamp, None
                    log.info("admin TLS certificate read again from %s", self.cert)
                except ValueError as exc:
                    self._failed_stamp = stamp
                    log.warning("admin TLS: kept the last good certificate: %s", exc)
            return self._pem, self._context

    def _on_hello(self, conn: ssl.SSLObject, _server_name: str | None,
                  context: ssl.SSLContext) -> None:
        newest = self._current()[1]
        if newest is not context:
            conn.context = newest

    def http_context(self) -> ssl.SSLContext:
        return self._current()[1]

    def grpc_credentials(self) -> grpc.ServerCredentials:
        served = self._pem

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            nonlocal served
            pem = self._current()[0]
            if pem is served:
                return None  # unchanged: gRPC keeps what it has
            served = pem
            return grpc.ssl_server_certificate_configuration([(pem[1], pem[0])])

        return grpc.dynamic_ssl_server_credentials(
            grpc.ssl_server_certificate_configuration([(served[1], served[0])]), fetch)
