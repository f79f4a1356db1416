"""A stand-in for a broker that offers SASL/PLAIN and refuses every login.

The embedded broker offers SASL/SCRAM only (``--authentication``) and no user can be
created on it, so nothing on this machine takes a PLAIN login, the mechanism in which the
client sends the password itself. This server speaks exactly the Kafka requests a client
sends before and during a SASL login (ApiVersions, SaslHandshake, SaslAuthenticate), with
aiokafka's own protocol classes, answers the login with SASL_AUTHENTICATION_FAILED and
hangs up on anything else. It is not a broker: it exists to put the real client, in the
real ``sidecar`` process, through a PLAIN exchange. The payloads it received are kept
(:attr:`received`), so that a test can check that the password did travel.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import struct
import threading
from typing import Any

from sidecar.local import free_port

_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 18, 17, 36
_SASL_AUTHENTICATION_FAILED = 58


def _response(api_key: int, version: int) -> Any:
    from aiokafka.protocol import admin

    if api_key == _API_VERSIONS:
        return admin.ApiVersionResponse_v0(
            error_code=0,
            api_versions=[
                (_API_VERSIONS, 0, 0),
                (_SASL_HANDSHAKE, 0, 1),
                (_SASL_AUTHENTICATE, 0, 0),
                (3, 0, 1),
            ],
        )
    if api_key == _SASL_HANDSHAKE:
        cls = admin.SaslHandShakeResponse_v1 if version else admin.SaslHandShakeResponse_v0
        return cls(error_code=0, enabled_mechanisms=["PLAIN"])
    if api_key == _SASL_AUTHENTICATE:
        return admin.SaslAuthenticateResponse_v0(
            error_code=_SASL_AUTHENTICATION_FAILED,
            error_message="Authentication failed: invalid username or password",
            sasl_auth_bytes=b"",
        )
    return None


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        with contextlib.suppress(OSError, struct.error):
            while True:
                size = struct.unpack(">i", _read(sock, 4))[0]
                frame = _read(sock, size)
                api_key, version, correlation_id = struct.unpack(">hhi", frame[:8])
                if api_key == _SASL_AUTHENTICATE:
                    self.server.received.append(frame)  # type: ignore[attr-defined]
                body = _response(api_key, version)
                if body is None:
                    return
                out = struct.pack(">i", correlation_id) + body.encode()
                sock.sendall(struct.pack(">i", len(out)) + out)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class PlainLoginRefuser:
    """``with PlainLoginRefuser() as b: ... b.url``: listens on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server = _Server(("127.0.0.1", self.port), _Handler)
        self.received: list[bytes] = []
        self._server.received = self.received  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"kafka://127.0.0.1:{self.port}"

    def __enter__(self) -> PlainLoginRefuser:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
