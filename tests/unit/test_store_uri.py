"""Store URIs, settings and mounted credentials: pure parsing, no server."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch.storage import FilesystemStore, StoreSettings, open_store
from llmbatch.storage.config import (
    Credentials,
    FilesystemConfig,
    S3Config,
    parse_store_uri,
    read_credentials,
)


@pytest.mark.parametrize(
    ("uri", "root"),
    [
        ("file:///var/lib/llmbatch", "/var/lib/llmbatch"),
        ("file://localhost/var/lib/llmbatch", "/var/lib/llmbatch"),
        ("file:///with%20space/x", "/with space/x"),
        ("/plain/path", "/plain/path"),
    ],
)
def test_file_uris(uri: str, root: str) -> None:
    assert parse_store_uri(uri) == FilesystemConfig(root=pathlib.Path(root))


@pytest.mark.parametrize(
    "uri",
    [
        "file://host/x",
        "file:relative/x",
        "file:///x?query=1",
        "relative/path",
        "gs://bucket",
        "http://127.0.0.1:9000/bucket",
        "",
    ],
)
def test_invalid_uris(uri: str) -> None:
    with pytest.raises(ValueError):
        parse_store_uri(uri)


def test_s3_uri_minimal() -> None:
    assert parse_store_uri("s3://my-bucket") == S3Config(bucket="my-bucket")
    assert parse_store_uri("s3://my-bucket/") == S3Config(bucket="my-bucket")


def test_s3_uri_everything() -> None:
    config = parse_store_uri(
        "s3://data.bucket/opt/prefix/?endpoint_url=http://127.0.0.1:9000&region=eu-west-1"
        "&path_style=true&secret_dir=/var/run/secrets/store&checksum=when_supported"
        "&conditional_writes=emulate&max_attempts=3&retry_mode=adaptive&part_size=16777216"
        "&connect_timeout=2.5&read_timeout=30"
    )
    assert config == S3Config(
        bucket="data.bucket",
        prefix="opt/prefix/",
        endpoint_url="http://127.0.0.1:9000",
        region="eu-west-1",
        path_style=True,
        secret_dir="/var/run/secrets/store",
        checksum="when_supported",
        conditional_writes="emulate",
        max_attempts=3,
        retry_mode="adaptive",
        part_size=16 << 20,
        connect_timeout=2.5,
        read_timeout=30.0,
    )


def test_s3_defaults_are_compatible_with_s3_clones() -> None:
    config = S3Config(bucket="bkt")
    assert config.checksum == "when_required"
    assert config.conditional_writes == "auto"
    assert config.part_size >= 5 << 20


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3://", "needs a bucket"),
        ("s3://b?typo=1", "unknown s3 store URI parameter"),
        ("s3://bucket?path_style=maybe", "true or false"),
        ("s3://bucket?checksum=always", "checksum must be one of"),
        ("s3://bucket?part_size=1024", "part_size"),
        ("s3://bucket?max_attempts=x", "integer"),
        ("s3://bucket?max_attempts=0", "max_attempts"),
        ("s3://bucket?region=a&region=b", "given 2 times"),
        ("s3://bucket?endpoint_url=127.0.0.1:9000", "endpoint_url"),
        ("s3://key:secret@bucket", "credentials"),
        ("s3://bucket/a/../b", "prefix"),
        ("s3://x", "bucket name"),
        ("s3://Bad Bucket", "bucket name"),
        ("s3://bucket#frag", "fragment"),
    ],
)
def test_invalid_s3_uris(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_store_uri(uri)


_configs = st.builds(
    S3Config,
    bucket=st.from_regex(r"[a-z0-9][a-z0-9.-]{1,20}[a-z0-9]", fullmatch=True),
    prefix=st.lists(st.from_regex(r"[A-Za-z0-9_ %+&=-]{1,8}", fullmatch=True), max_size=3).map(
        lambda segs: "".join(s + "/" for s in segs)
    ),
    endpoint_url=st.sampled_from([None, "http://127.0.0.1:9000", "https://s3.example.com"]),
    region=st.sampled_from([None, "us-east-1", "eu-central-1"]),
    path_style=st.booleans(),
    secret_dir=st.sampled_from([None, "/var/run/secrets/store", "/a b/&c"]),
    checksum=st.sampled_from(["when_required", "when_supported"]),
    conditional_writes=st.sampled_from(["auto", "native", "emulate"]),
    max_attempts=st.integers(1, 20),
    part_size=st.integers(5 << 20, 64 << 20),
)


@given(_configs)
def test_s3_config_uri_round_trip(config: S3Config) -> None:
    assert parse_store_uri(config.to_uri()) == config


def test_to_uri_never_contains_credentials() -> None:
    config = S3Config(bucket="bkt", credentials=Credentials("AKIA", "very-secret"))
    assert "very-secret" not in config.to_uri()
    assert "very-secret" not in repr(config)


def test_read_credentials_aws_names(tmp_path: pathlib.Path) -> None:
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("AKIA123\n")
    (tmp_path / "AWS_SECRET_ACCESS_KEY").write_text("s3cr3t\n")
    assert read_credentials(tmp_path) == Credentials("AKIA123", "s3cr3t", None)
    (tmp_path / "AWS_SESSION_TOKEN").write_text("tok\n")
    assert read_credentials(tmp_path).session_token == "tok"


def test_read_credentials_kubernetes_names(tmp_path: pathlib.Path) -> None:
    (tmp_path / "accessKeyID").write_text("minio")
    (tmp_path / "secretAccessKey").write_text("minio123")
    assert read_credentials(tmp_path) == Credentials("minio", "minio123")


def test_read_credentials_missing(tmp_path: pathlib.Path) -> None:
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("only half")
    with pytest.raises(ValueError, match="no credentials"):
        read_credentials(tmp_path)


def test_store_settings_to_uri() -> None:
    settings = StoreSettings.model_validate(
        {
            "endpoint": "http://minio.storage:9000",
            "bucket": "llmbatch",
            "prefix": "/prod/",
            "region": "us-east-1",
            "pathStyle": True,
            "credentialsSecret": "store-creds",
        }
    )
    assert parse_store_uri(settings.to_uri()) == S3Config(
        bucket="llmbatch",
        prefix="prod/",
        endpoint_url="http://minio.storage:9000",
        region="us-east-1",
        path_style=True,
        secret_dir="/var/run/secrets/llmbatch/store",
    )
    no_secret = settings.model_copy(update={"credentials_secret": None})
    assert parse_store_uri(no_secret.to_uri()).secret_dir is None  # type: ignore[union-attr]


def test_store_settings_filesystem_and_errors(tmp_path: pathlib.Path) -> None:
    settings = StoreSettings(backend="filesystem", path=str(tmp_path))
    store = open_store(settings.to_uri())
    assert isinstance(store, FilesystemStore)
    assert store.root == tmp_path.resolve()
    with pytest.raises(ValueError, match="bucket"):
        StoreSettings().to_uri()
    with pytest.raises(ValueError, match="absolute"):
        StoreSettings(backend="filesystem", path="rel").to_uri()
    with pytest.raises(ValueError, match="Extra inputs"):
        StoreSettings.model_validate({"bucket": "b", "endpiont": "typo"})


def test_open_store_s3_makes_no_network_call() -> None:
    store = open_store("s3://bucket/p?endpoint_url=http://127.0.0.1:9&region=us-east-1")
    assert type(store).__name__ == "S3Store"
    assert "s3://bucket/p" in repr(store)
