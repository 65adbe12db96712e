"""Private, encrypted storage (seed 000): the S3 store asks for server-side encryption on every
request that creates an object — PutObject (also conditional ones and the probes) and
CreateMultipartUpload, which sets it for the parts and server-side copies (UploadPart and
UploadPartCopy take no SSE-S3 / SSE-KMS headers in the S3 API) — recorded by an S3 endpoint of
our own; and the filesystem store writes files 0600 and directories 0700 whatever the umask."""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from llmbatch.storage import ObjectInfo, StoreSettings, open_store, parse_store_uri
from llmbatch.storage.filesystem import FilesystemStore
from tests.fixtures.recording_s3 import RecordingS3

MIB = 1 << 20
CREATING = ("PutObject", "CreateMultipartUpload")
SSE = "x-amz-server-side-encryption"
KMS_KEY = "x-amz-server-side-encryption-aws-kms-key-id"


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


def exercise(uri: str) -> None:
    """Every write path: small and multipart puts, if_absent, put_if_match, compose (copied
    and buffered parts), with the conditional-write probes of ``auto`` mode."""
    store = open_store(uri)
    store.put("a/small", b"x" * 100, if_absent=True)
    store.put_if_match("a/small", b"y" * 100, store.get_versioned("a/small").version)
    big = store.put("a/big", iter([b"b" * MIB] * 11))  # > one 8 MiB part: multipart
    store.compose("a/joined", [ObjectInfo(key="a/big", size=big.size), "a/small"])
    assert store.get("a/joined") == b"b" * 11 * MIB + b"y" * 100


def s3_uri(server: RecordingS3, **params: str) -> str:
    query = "".join(f"&{k}={quote(v, safe='')}" for k, v in params.items())
    endpoint = quote(server.url, safe="")
    return f"s3://bkt/pre?endpoint_url={endpoint}&path_style=true&region=us-east-1{query}"


def test_sse_kms_is_on_every_object_creating_request(recording_s3: RecordingS3) -> None:
    exercise(s3_uri(recording_s3, sse="aws:kms", sse_kms_key_id="alias/llmbatch"))
    creating = [r for r in recording_s3.requests if r.operation in CREATING]
    assert {r.operation for r in creating} == set(CREATING)
    assert len(recording_s3.of("PutObject")) >= 4  # probes, small, if_match
    for request in creating:
        assert request.headers.get(SSE) == "aws:kms", request.operation
        assert request.headers.get(KMS_KEY) == "alias/llmbatch", request.operation
    # parts and server-side copies inherit the upload's encryption; S3 refuses SSE headers there
    assert recording_s3.of("UploadPartCopy")
    for request in recording_s3.of("UploadPart") + recording_s3.of("UploadPartCopy"):
        assert SSE not in request.headers


def test_sse_s3_is_aes256_without_a_key_id(recording_s3: RecordingS3) -> None:
    exercise(s3_uri(recording_s3, sse="AES256"))
    creating = [r for r in recording_s3.requests if r.operation in CREATING]
    assert creating
    for request in creating:
        assert request.headers.get(SSE) == "AES256", request.operation
        assert KMS_KEY not in request.headers


def test_no_encryption_asked_sends_no_header(recording_s3: RecordingS3) -> None:
    exercise(s3_uri(recording_s3))
    assert all(SSE not in r.headers for r in recording_s3.requests)


def test_settings_and_uri_carry_the_encryption() -> None:
    settings = StoreSettings.model_validate(
        {"bucket": "bkt", "encryption": "sse-kms", "kmsKeyID": "arn:aws:kms:eu-west-1:1:key/k"}
    )
    config = parse_store_uri(settings.to_uri())
    assert config.encryption_args() == {  # type: ignore[union-attr]
        "ServerSideEncryption": "aws:kms",
        "SSEKMSKeyId": "arn:aws:kms:eu-west-1:1:key/k",
    }
    plain = parse_store_uri(StoreSettings(bucket="bkt", encryption="sse-s3").to_uri())
    assert plain.encryption_args() == {"ServerSideEncryption": "AES256"}  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="sse must be one of"):
        parse_store_uri("s3://bkt?sse=aes")
    with pytest.raises(ValueError, match="needs sse=aws:kms"):
        parse_store_uri("s3://bkt?sse=AES256&sse_kms_key_id=k")


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)  # the most permissive umask: modes must not depend on it
    try:
        yield
    finally:
        os.umask(previous)


def modes(root: pathlib.Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


@pytest.mark.usefixtures("open_umask")
def test_the_filesystem_store_writes_files_0600_and_directories_0700(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "new" / "store"
    store = FilesystemStore(root)
    store.put("t/files/f1", b"data", if_absent=True)
    store.put("t/files/f2", iter([b"a", b"b"]))
    store.put_if_match("t/files/f1", b"new", store.get_versioned("t/files/f1").version)
    store.compose("t/out/joined", ["t/files/f1", "t/files/f2"])
    seen = modes(root)
    assert seen, "nothing written"
    for path, mode in seen.items():
        expected = 0o700 if (root / path).is_dir() else 0o600
        assert mode == expected, f"{path}: {oct(mode)}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
