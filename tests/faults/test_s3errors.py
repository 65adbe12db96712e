"""The S3 error proxy of the fault suite (``s3errors``), on the session's versitygw: requests it
does not answer reach the server as signed (single puts, multipart with ``Expect:
100-continue``, server-side part copies, conditional writes, ranged reads, lists), and a planned
burst answers exactly its count with the S3 error, then lets requests through again."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import boto3
import botocore.config
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from llmbatch.storage import ObjectExists, open_store
from llmbatch.storage.s3 import S3Store
from llmbatch.storage.s3client import error_code
from tests.faults.s3errors import S3Errors, running_s3_errors
from tests.fixtures.ports import free_port
from tests.fixtures.s3server import S3Server

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MIB = 1 << 20


@pytest.fixture(scope="module")
def s3_errors(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Errors]:
    log = tmp_path_factory.mktemp("s3errors") / "s3errors.log"
    upstream = s3_server.endpoint_url.removeprefix("http://")
    with running_s3_errors(free_port(), upstream, log) as errors:
        yield errors


def _store(s3_server: S3Server, bucket: str, errors: S3Errors, **overrides: object) -> S3Store:
    uri = s3_server.uri(bucket, "p", endpoint_url=f"http://{errors.address}", **overrides)
    store = open_store(uri)
    assert isinstance(store, S3Store)
    return store


@pytest.mark.parametrize("checksum", ["when_required", "when_supported"])
def test_requests_it_does_not_answer_reach_the_server_unchanged(
    s3_server: S3Server, s3_bucket: str, s3_errors: S3Errors, checksum: str
) -> None:
    store = _store(s3_server, s3_bucket, s3_errors, checksum=checksum, part_size=5 * MIB)
    assert store.atomic_if_absent()  # the server's 412s pass through
    assert store.atomic_if_match()
    small = b'{"x": 1}\n'
    assert store.put("a/small", small, if_absent=True).sha256 == hashlib.sha256(small).hexdigest()
    with pytest.raises(ObjectExists):
        store.put("a/small", b"again", if_absent=True)
    big = bytes(range(256)) * (11 * MIB // 256)  # three parts, each sent with Expect
    store.put("a/big", iter([big[i : i + MIB] for i in range(0, len(big), MIB)]))
    assert store.get("a/big", 5 * MIB - 3, 5 * MIB + 3) == big[5 * MIB - 3 : 5 * MIB + 3]
    store.compose("a/both", ["a/big", "a/small"])  # UploadPartCopy for the large source
    assert store.get("a/both") == big + small
    assert [info.key for info in store.list("a/")] == ["a/big", "a/both", "a/small"]
    assert store.head("a/none") is None
    store.delete("a/big")
    assert store.head("a/big") is None
    assert s3_errors.plan(None) == 0


def _client(s3_server: S3Server, errors: S3Errors) -> S3Client:
    """A boto3 client through the proxy that sends each request once (no retries)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=f"http://{errors.address}",
        region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key_id,
        aws_secret_access_key=s3_server.secret_access_key,
        config=botocore.config.Config(
            s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}
        ),
    )


def _code(call: Callable[[], object]) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    return error_code(raised.value)


def test_a_burst_answers_its_count_then_lets_requests_through(
    s3_server: S3Server, s3_bucket: str, s3_errors: S3Errors
) -> None:
    client = _client(s3_server, s3_errors)
    before = s3_errors.plan(None)
    rule = {"status": 503, "code": "SlowDown", "methods": ["PUT"], "key": r"/burst$", "count": 2}
    s3_errors.plan([rule])
    client.put_object(Bucket=s3_bucket, Key="other", Body=b"x")  # another key: forwarded
    for _ in range(2):
        assert _code(lambda: client.put_object(Bucket=s3_bucket, Key="burst", Body=b"x")) == (
            "SlowDown"
        )
    # HEAD is not among the rule's methods: forwarded (the object is not there: never written).
    assert _code(lambda: client.head_object(Bucket=s3_bucket, Key="burst")) == "404"
    client.put_object(Bucket=s3_bucket, Key="burst", Body=b"x")
    assert client.get_object(Bucket=s3_bucket, Key="burst")["Body"].read() == b"x"
    assert s3_errors.plan(None) - before == 2


def test_an_error_answer_to_head_has_no_body(
    s3_server: S3Server, s3_bucket: str, s3_errors: S3Errors
) -> None:
    client = _client(s3_server, s3_errors)
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"v")
    s3_errors.plan([{"status": 500, "code": "InternalError", "methods": ["HEAD"], "count": 1}])
    assert _code(lambda: client.head_object(Bucket=s3_bucket, Key="k")) == "500"
    # The connection is still in step: the next request on it is answered normally.
    assert client.head_object(Bucket=s3_bucket, Key="k")["ContentLength"] == 1
    s3_errors.plan(None)


def test_the_stores_retries_outlive_a_short_burst(
    s3_server: S3Server, s3_bucket: str, s3_errors: S3Errors
) -> None:
    store = _store(s3_server, s3_bucket, s3_errors)  # the default retry budget
    before = s3_errors.plan(None)
    s3_errors.plan([{"status": 500, "code": "InternalError", "key": r"/p/k$", "count": 3}])
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert s3_errors.plan(None) - before == 3


def test_a_body_cut_by_the_client_is_never_forwarded(
    s3_server: S3Server, s3_bucket: str, s3_errors: S3Errors
) -> None:
    """A client that goes away mid-body (Toxiproxy's resets and stalls do that) must not have
    the proxy forward the part it got as a whole, shorter request: with an unsigned payload the
    server could not tell."""
    url = f"http://{s3_errors.address}/{s3_bucket}/cut"
    request = AWSRequest(method="PUT", url=url)  # Content-Length unsigned, as botocore's
    credentials = Credentials(s3_server.access_key_id, s3_server.secret_access_key)

    class _Unsigned(S3SigV4Auth):
        def payload(self, request: AWSRequest) -> str:
            return "UNSIGNED-PAYLOAD"

    _Unsigned(credentials, "s3", s3_server.region).add_auth(request)
    host, port = s3_errors.address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        head = "".join(
            f"{k}: {v.decode() if isinstance(v, bytes) else v}\r\n"
            for k, v in request.headers.items()
        )
        head += f"Host: {s3_errors.address}\r\nContent-Length: 100\r\n"
        conn.sendall(f"PUT /{s3_bucket}/cut HTTP/1.1\r\n{head}\r\n".encode() + b"x" * 10)
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(1024) == b""  # closed without an answer
    assert open_store(s3_server.uri(s3_bucket)).head("cut") is None
