"""Where the object store is: store URIs, the S3 connection settings, mounted credentials.

Pure (no boto3): parsing a URI or reading a secret directory never opens a connection.

URI grammar (see docs/storage.md)::

    file:///abs/path                     FilesystemStore rooted at /abs/path
    /abs/path                            the same, for command lines
    s3://bucket[/prefix][?param=value&...]

S3 query parameters: ``endpoint_url``, ``region``, ``path_style`` (true/false), ``secret_dir``,
``checksum`` (``when_required`` | ``when_supported``), ``conditional_writes`` (``auto`` |
``native`` | ``emulate``), ``max_attempts``, ``retry_mode`` (``standard`` | ``adaptive`` |
``legacy``), ``part_size`` (bytes, >= 5 MiB), ``connect_timeout`` and ``read_timeout``
(seconds), ``sse`` (``AES256`` for SSE-S3, ``aws:kms`` for SSE-KMS) and ``sse_kms_key_id`` (the
KMS key id, ARN or alias; only with ``sse=aws:kms``; empty: the account's default S3 KMS key).
An unknown parameter is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field

MIB = 1 << 20
#: S3's smallest part (every part of a multipart upload but the last).
MIN_PART_SIZE = 5 * MIB
#: S3's largest part, and the largest range one UploadPartCopy can copy.
MAX_PART_SIZE = 5 * 1024 * MIB
#: S3's most parts in one multipart upload.
MAX_PARTS = 10_000

ChecksumMode = Literal["when_required", "when_supported"]
ConditionalWrites = Literal["auto", "native", "emulate"]
RetryMode = Literal["standard", "adaptive", "legacy"]
ServerSideEncryption = Literal["AES256", "aws:kms"]

#: File names in a mounted secret directory, in order of preference: (key id, secret, token).
SECRET_FILE_NAMES: tuple[tuple[str, str, str], ...] = (
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    ("accessKeyID", "secretAccessKey", "sessionToken"),
)

# S3 bucket names (DNS rules, plus the '_' and upper case some S3-compatible stores allow).
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]$")


@dataclass(frozen=True)
class Credentials:
    """A static S3 key pair (and optional session token); never printed."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class FilesystemConfig:
    """A filesystem store rooted at an absolute directory."""

    root: pathlib.Path


@dataclass(frozen=True)
class S3Config:
    """Everything needed to open an S3 (or S3-compatible) store."""

    bucket: str
    #: Key prefix inside the bucket, empty or ending in ``/``; every key of the store is under it.
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    #: ``https://endpoint/bucket/key`` instead of ``https://bucket.endpoint/key`` (MinIO, Ceph...).
    path_style: bool = False
    #: Directory with mounted credential files (see :data:`SECRET_FILE_NAMES`).
    secret_dir: str | None = None
    #: Explicit credentials; otherwise ``secret_dir``, otherwise boto3's chain (env, profile, IRSA).
    credentials: Credentials | None = None
    #: botocore ``request_checksum_calculation`` / ``response_checksum_validation``.
    #: ``when_required`` by default: many S3-compatible stores reject the CRC checksums that
    #: botocore >= 1.36 sends otherwise. Puts still carry Content-MD5.
    checksum: ChecksumMode = "when_required"
    #: How ``if_absent`` is honoured: ``native`` (``If-None-Match: *``), ``emulate`` (head, then
    #: put: best effort, racy), ``auto`` (probe the server once, use native when it works).
    conditional_writes: ConditionalWrites = "auto"
    max_attempts: int = 5
    retry_mode: RetryMode = "standard"
    #: First part size of a streamed multipart put; doubles every 1000 parts.
    part_size: int = 8 * MIB
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    #: Server-side encryption asked for on every write (PutObject, CreateMultipartUpload, and so
    #: every compose and copy): ``AES256`` (SSE-S3) or ``aws:kms`` (SSE-KMS); None sends none.
    sse: ServerSideEncryption | None = None
    #: The KMS key of SSE-KMS (id, ARN or alias); None: the bucket's / account's default key.
    sse_kms_key_id: str | None = None

    def __post_init__(self) -> None:
        if not _BUCKET.match(self.bucket):
            raise ValueError(f"invalid bucket name {self.bucket!r}")
        if self.prefix and (not self.prefix.endswith("/") or self.prefix.startswith("/")):
            raise ValueError(f"prefix must be relative and end with '/': {self.prefix!r}")
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ValueError(f"part_size must be in [{MIN_PART_SIZE}, {MAX_PART_SIZE}]")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.endpoint_url is not None and not re.match(r"^https?://[^/]", self.endpoint_url):
            raise ValueError(f"endpoint_url must be http(s)://host[:port]: {self.endpoint_url!r}")
        if self.sse_kms_key_id is not None and self.sse != "aws:kms":
            raise ValueError("sse_kms_key_id needs sse=aws:kms")

    def encryption_args(self) -> dict[str, str]:
        """The boto3 arguments every object-creating request carries (none without ``sse``)."""
        if self.sse is None:
            return {}
        args: dict[str, str] = {"ServerSideEncryption": self.sse}
        if self.sse_kms_key_id:
            args["SSEKMSKeyId"] = self.sse_kms_key_id
        return args

    def to_uri(self) -> str:
        """The ``s3://`` URI that :func:`parse_store_uri` turns back into this config.

        Explicit :attr:`credentials` are never written into a URI.
        """
        params: dict[str, str] = {}
        defaults = S3Config(bucket=self.bucket)
        for name in (
            "endpoint_url",
            "region",
            "path_style",
            "secret_dir",
            "checksum",
            "conditional_writes",
            "max_attempts",
            "retry_mode",
            "part_size",
            "connect_timeout",
            "read_timeout",
            "sse",
            "sse_kms_key_id",
        ):
            value = getattr(self, name)
            if value != getattr(defaults, name):
                params[name] = str(value).lower() if isinstance(value, bool) else str(value)
        path = quote(self.prefix.rstrip("/"), safe="/")
        uri = f"s3://{self.bucket}" + (f"/{path}" if path else "")
        return uri + (f"?{urlencode(params)}" if params else "")


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _parse_s3(uri: str) -> S3Config:
    parts = urlsplit(uri)
    if parts.fragment:
        raise ValueError(f"store URI must not have a fragment: {uri!r}")
    if not parts.netloc:
        raise ValueError(f"s3 URI needs a bucket: {uri!r}")
    if "@" in parts.netloc:
        raise ValueError("s3 URI must not carry credentials; use secret_dir or AWS_* env vars")
    prefix = unquote(parts.path).strip("/")
    if prefix:
        if any(seg in ("", ".", "..") for seg in prefix.split("/")):
            raise ValueError(f"invalid key prefix in {uri!r}")
        prefix += "/"
    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    kwargs: dict[str, object] = {}
    for name, values in query.items():
        if len(values) != 1:
            raise ValueError(f"store URI parameter {name!r} given {len(values)} times")
        value = values[0]
        if name in ("endpoint_url", "region", "secret_dir", "sse_kms_key_id"):
            kwargs[name] = value or None
        elif name == "sse":
            kwargs[name] = _choice(name, value, ("AES256", "aws:kms")) if value else None
        elif name == "path_style":
            kwargs[name] = _parse_bool(name, value)
        elif name == "checksum":
            kwargs[name] = _choice(name, value, ("when_required", "when_supported"))
        elif name == "conditional_writes":
            kwargs[name] = _choice(name, value, ("auto", "native", "emulate"))
        elif name == "retry_mode":
            kwargs[name] = _choice(name, value, ("standard", "adaptive", "legacy"))
        elif name in ("max_attempts", "part_size"):
            try:
                kwargs[name] = int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {value!r}") from None
        elif name in ("connect_timeout", "read_timeout"):
            try:
                kwargs[name] = float(value)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {value!r}") from None
        else:
            raise ValueError(f"unknown s3 store URI parameter {name!r}")
    return S3Config(bucket=parts.netloc, prefix=prefix, **kwargs)  # type: ignore[arg-type]


def _parse_file(uri: str) -> FilesystemConfig:
    if uri.startswith("/"):
        path = uri
    else:
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI must be file:///abs/path, got {uri!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"file URI takes no parameters: {uri!r}")
        path = unquote(parts.path)
    if not path.startswith("/"):
        raise ValueError(f"filesystem store root must be absolute: {uri!r}")
    return FilesystemConfig(root=pathlib.Path(path))


def parse_store_uri(uri: str) -> FilesystemConfig | S3Config:
    """Parse a store URI (grammar in the module docstring); raise ValueError when it is invalid."""
    if uri.startswith(("/", "file:")):
        return _parse_file(uri)
    if uri.startswith("s3://"):
        return _parse_s3(uri)
    raise ValueError(f"unsupported store URI {uri!r}: expected file:///abs/path or s3://bucket")


def read_credentials(secret_dir: str | pathlib.Path) -> Credentials:
    """Read a key pair from a mounted secret directory (files per :data:`SECRET_FILE_NAMES`).

    Values are stripped of surrounding whitespace (``kubectl create secret --from-file`` keeps the
    trailing newline). Raises ValueError when no complete pair is present.
    """
    directory = pathlib.Path(secret_dir)
    for key_name, secret_name, token_name in SECRET_FILE_NAMES:
        key_file, secret_file = directory / key_name, directory / secret_name
        if key_file.is_file() and secret_file.is_file():
            token_file = directory / token_name
            token = token_file.read_text().strip() if token_file.is_file() else None
            return Credentials(
                access_key_id=key_file.read_text().strip(),
                secret_access_key=secret_file.read_text().strip(),
                session_token=token or None,
            )
    names = " or ".join(f"{k}+{s}" for k, s, _ in SECRET_FILE_NAMES)
    raise ValueError(f"no credentials in {directory}: expected files {names}")


class StoreSettings(BaseModel):
    """The object store the operator, gateway and executors share (the Helm ``store`` values)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    backend: Literal["s3", "filesystem"] = Field(
        default="s3", description="Which backend: an S3-compatible service or a local directory."
    )
    path: str | None = Field(
        default=None,
        max_length=4096,
        description="Filesystem backend only: absolute root directory of the store.",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        description="S3 endpoint URL (http(s)://host:port); empty means AWS S3.",
    )
    bucket: str | None = Field(default=None, max_length=63, description="S3 bucket name.")
    prefix: str = Field(
        default="", max_length=512, description="Key prefix inside the bucket, e.g. 'llmbatch/'."
    )
    region: str | None = Field(default=None, max_length=64, description="S3 region.")
    path_style: bool = Field(
        default=False,
        alias="pathStyle",
        description="Path-style addressing (MinIO, Ceph RGW and most S3-compatible stores).",
    )
    credentials_secret: str | None = Field(
        default=None,
        alias="credentialsSecret",
        max_length=253,
        description=(
            "Name of a Secret with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or accessKeyID/"
            "secretAccessKey) mounted at secretMountPath, for callers that build a store from "
            "these settings; the Helm chart passes its store.secretName as environment "
            "variables instead (docs/storage.md). Empty: the pod's AWS identity / env."
        ),
    )
    secret_mount_path: str = Field(
        default="/var/run/secrets/llmbatch/store",
        alias="secretMountPath",
        max_length=4096,
        description="Where the credentialsSecret is mounted (the chart mounts none).",
    )
    checksum: ChecksumMode = Field(
        default="when_required",
        description="botocore request/response checksum mode; when_supported only for AWS S3.",
    )
    conditional_writes: ConditionalWrites = Field(
        default="auto",
        alias="conditionalWrites",
        description="If-None-Match support: auto (probe), native, or emulate (best effort).",
    )

    encryption: Literal["", "sse-s3", "sse-kms"] = Field(
        default="",
        description=(
            "Server-side encryption of every object written: sse-s3 (AES256, keys managed by "
            "the store) or sse-kms (AWS KMS); empty: none asked for (the bucket default applies)."
        ),
    )
    kms_key_id: str | None = Field(
        default=None,
        alias="kmsKeyID",
        max_length=2048,
        description="sse-kms only: the KMS key id, ARN or alias; empty: the default KMS key.",
    )

    def to_uri(self) -> str:
        """The store URI for these settings (what ``open_store`` takes)."""
        if self.backend == "filesystem":
            if not self.path or not self.path.startswith("/"):
                raise ValueError("filesystem store needs an absolute path")
            return pathlib.Path(self.path).as_uri()
        if not self.bucket:
            raise ValueError("s3 store needs a bucket")
        prefix = self.prefix.strip("/")
        config = S3Config(
            bucket=self.bucket,
            prefix=f"{prefix}/" if prefix else "",
            endpoint_url=self.endpoint or None,
            region=self.region or None,
            path_style=self.path_style,
            secret_dir=self.secret_mount_path if self.credentials_secret else None,
            checksum=self.checksum,
            conditional_writes=self.conditional_writes,
            sse=_SSE_OF[self.encryption],
            sse_kms_key_id=self.kms_key_id or None,
        )
        return config.to_uri()


_SSE_OF: dict[str, ServerSideEncryption | None] = {
    "": None,
    "sse-s3": "AES256",
    "sse-kms": "aws:kms",
}
