"""S3 errors for the fault suite: an HTTP proxy in front of the S3 server that answers planned
requests with an S3 error (``503 SlowDown``, ``500 InternalError``...), as a real S3 does under
load, and forwards every other request unchanged.

versitygw, the suite's S3 server, has no way to inject errors, and Toxiproxy only breaks TCP;
this proxy sits between the two (components → Toxiproxy → this proxy → versitygw). Requests
reach the server byte for byte as the client signed them (the ``Host`` header and the body are
kept), so the server still checks every signature.

The plan: ``POST /__llmbatch_faults__`` with ``{"rules": [{"status": 503, "code": "SlowDown",
"methods": ["PUT"], "key": "<regex searched in the path>", "count": 3, "probability": 1.0}]}``;
``DELETE`` clears it; each answers ``{"injected": <faults answered so far>, "rules": [...]}``.
A rule answers at most ``count`` requests; the first rule that matches a request answers it.

Run as a script (standard library only): ``python s3errors.py --port P --upstream host:port``;
tests use :func:`running_s3_errors`.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import pathlib
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTROL_PATH = "/__llmbatch_faults__"
_REASONS = {500: "Internal Server Error", 503: "Slow Down"}
# Headers of one hop, not of the request: this proxy frames its own messages. botocore signs
# none of them (SigV4 leaves out Expect and Transfer-Encoding), so dropping them keeps the
# signature valid.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}
)
_COPY_SIZE = 1 << 16
_LOG_LOCK = threading.Lock()


class ErrorPlan:
    """The rules in force and the number of requests answered with an error so far."""

    def __init__(self, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._rules: list[dict[str, Any]] = []
        self._random = random.Random(seed)
        self.injected = 0

    def replace(self, rules: list[dict[str, Any]]) -> None:
        with self._lock:
            self._rules = [dict(rule) for rule in rules]

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"injected": self.injected, "rules": [dict(rule) for rule in self._rules]}

    def fault_for(self, method: str, path: str) -> dict[str, Any] | None:
        """The rule that answers this request (its count taken), or None to forward it."""
        with self._lock:
            for rule in self._rules:
                if rule.get("count", 1) <= 0:
                    continue
                if rule.get("methods") and method not in rule["methods"]:
                    continue
                if not re.search(rule.get("key", ""), path):
                    continue
                if self._random.random() >= rule.get("probability", 1.0):
                    continue
                rule["count"] = rule.get("count", 1) - 1
                self.injected += 1
                return dict(rule)
        return None


def error_body(code: str) -> bytes:
    return (
        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
        f"<Message>injected fault</Message></Error>"
    ).encode()


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive with the clients, as the S3 server's own
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would fill the log; faults are counted in the plan

    def _upstream(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self, "_conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.server.upstream, timeout=60)
            self._conn = conn
        return conn

    def _read_exactly(self, size: int) -> bytes:
        data = self.rfile.read(size)
        if len(data) != size:
            # The client went away mid-body (a reset or stalled connection through Toxiproxy):
            # never forward a cut body as if it were whole.
            raise ConnectionError(f"request body cut at {len(data)} of {size} bytes")
        return data

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                line = self.rfile.readline()
                if not line:
                    raise ConnectionError("request body cut in a chunk header")
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self._read_exactly(size))
                self.rfile.readline()
        return self._read_exactly(int(self.headers.get("Content-Length") or 0))

    def _answer(
        self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        self.send_response_only(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _control(self, body: bytes) -> None:
        if self.command == "POST":
            self.server.plan.replace(list(json.loads(body or b"{}").get("rules", [])))
        elif self.command == "DELETE":
            self.server.plan.replace([])
        state = json.dumps(self.server.plan.state()).encode()
        self._answer(200, "OK", [("Content-Type", "application/json")], state)

    def _handle(self) -> None:
        try:
            body = self._read_body()
        except ConnectionError:
            self.close_connection = True
            return
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path == CONTROL_PATH:
            self._control(body)
            return
        rule = self.server.plan.fault_for(self.command, path)
        if rule is not None:
            status = int(rule.get("status", 503))
            self._answer(
                status,
                _REASONS.get(status, "Error"),
                [("Content-Type", "application/xml")],
                error_body(str(rule.get("code", "SlowDown"))),
            )
            return
        self._forward(body)

    def _forward(self, body: bytes) -> None:
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        try:
            response = self._send_upstream(headers, body)
        except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
            # An idle keep-alive connection that the server closed: once more on a new one.
            self._upstream().close()
            response = self._send_upstream(headers, body)
        self._relay(response)

    def _send_upstream(
        self, headers: list[tuple[str, str]], body: bytes
    ) -> http.client.HTTPResponse:
        conn = self._upstream()
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            if name.lower() != "content-length":
                conn.putheader(name, value)
        if body or self.command in ("PUT", "POST"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        return conn.getresponse()

    def _relay(self, response: http.client.HTTPResponse) -> None:
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        length = response.getheader("Content-Length")
        self.send_response_only(response.status, response.reason)
        for name, value in headers:
            self.send_header(name, value)
        if length is None:  # chunked or read-to-close: buffer it to give it a length
            data = response.read()
            if self.command != "HEAD" and response.status not in (204, 304):
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.end_headers()
        while chunk := response.read(_COPY_SIZE):  # HEAD: http.client reads no body
            self.wfile.write(chunk)
        response.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    def finish(self) -> None:
        super().finish()
        conn: http.client.HTTPConnection | None = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    upstream: str
    plan: ErrorPlan

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Resets and stalls are what Toxiproxy is there for: one line, not a traceback each.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            with _LOG_LOCK:
                print(f"s3errors: {client_address[1]}: {type(exc).__name__}: {exc}", flush=True)
            return
        super().handle_error(request, client_address)


class S3Errors:
    """The control API of a running proxy."""

    def __init__(self, address: str) -> None:
        self.address = address
        """host:port where the proxy listens (Toxiproxy's upstream)."""

    def plan(self, rules: list[dict[str, Any]] | None) -> int:
        """Set (or with None clear) the rules; the number of faults answered so far."""
        method = "DELETE" if rules is None else "POST"
        data = None if rules is None else json.dumps({"rules": rules}).encode()
        url = f"http://{self.address}{CONTROL_PATH}"
        request = urllib.request.Request(url, data=data, method=method)
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(json.loads(resp.read())["injected"])


@contextlib.contextmanager
def running_s3_errors(port: int, upstream: str, log_path: pathlib.Path) -> Iterator[S3Errors]:
    """The proxy as its own process (its own interpreter: it carries every store request of
    the stack) on ``127.0.0.1:port`` in front of ``upstream``; stopped on exit."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--port", str(port), "--upstream", upstream],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    errors = S3Errors(f"127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                errors.plan(None)
                break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"s3errors did not start: {log_path.read_text()}") from None
                time.sleep(0.05)
        yield errors
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="host:port of the S3 server")
    args = parser.parse_args(argv)
    server = _Server(("127.0.0.1", args.port), _Proxy)
    server.upstream = args.upstream
    server.plan = ErrorPlan()
    server.serve_forever()


if __name__ == "__main__":
    main()
