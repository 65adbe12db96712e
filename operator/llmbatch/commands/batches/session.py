"""How a client command reaches the gateway: the OpenAI SDK configured like the SDK itself
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, or the flags), where its output goes, and the SDK's
errors mapped once to messages and exit codes."""

from __future__ import annotations

import contextlib
import enum
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
import openai
from rich.console import Console

from llmbatch.commands.batches.outcome import ExitCode
from llmbatch.core.ids import batch_id_from_name

F = TypeVar("F", bound=Callable[..., Any])


class Format(enum.StrEnum):
    """What a command prints on stdout."""

    TABLE = "table"
    JSON = "json"


@dataclass
class Session:
    """One command's connection and consoles."""

    base_url: str | None
    api_key: str | None
    output: Format
    out: Console = field(default_factory=lambda: _console(sys.stdout))
    err: Console = field(default_factory=lambda: Console(stderr=True, soft_wrap=True))

    @functools.cached_property
    def client(self) -> openai.OpenAI:
        """The SDK client; a missing key is the SDK's own error, mapped by :func:`api_errors`."""
        with api_errors(self):
            return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=3)


def _console(stream: Any) -> Console:
    """Stdout: in a pipe, tables as wide as they need (not cut to 80 columns)."""
    return Console(file=stream, soft_wrap=True, width=None if stream.isatty() else 200)


def choose_format(requested: str, stdout_is_terminal: bool) -> Format:
    """``auto``: a table on a terminal, JSON in a pipe."""
    if requested == "auto":
        return Format.TABLE if stdout_is_terminal else Format.JSON
    return Format(requested)


def session_options(command: F) -> F:
    """Add ``--base-url``, ``--api-key`` and ``--output`` to a command; it gets a Session."""

    @click.option(
        "--base-url",
        envvar="OPENAI_BASE_URL",
        show_envvar=True,
        help="The gateway's API root, e.g. https://llmbatch.example.com/v1.",
    )
    @click.option(
        "--api-key",
        envvar="OPENAI_API_KEY",
        show_envvar=True,
        help="The tenant's API key (`llmbatch keys create`).",
    )
    @click.option(
        "-o",
        "--output",
        type=click.Choice(["auto", "table", "json"]),
        default="auto",
        show_default=True,
        help="auto: a table on a terminal, JSON in a pipe.",
    )
    @functools.wraps(command)
    def wrapper(base_url: str | None, api_key: str | None, output: str, **kwargs: Any) -> Any:
        chosen = choose_format(output, sys.stdout.isatty())
        return command(Session(base_url, api_key, chosen), **kwargs)

    return wrapper  # type: ignore[return-value]


class CommandError(click.ClickException):
    """A command that could not do its work: printed as ``Error: ...``, exit code 1."""

    exit_code = ExitCode.ERROR


@contextlib.contextmanager
def api_errors(session: Session, batch_hint: str = "") -> Iterator[None]:
    """Turn the SDK's errors into one line each (and exit code 1)."""
    try:
        yield
    except openai.NotFoundError as exc:
        raise CommandError(f"{_message(exc)}{batch_hint}") from exc
    except openai.APIStatusError as exc:
        raise CommandError(f"{exc.status_code}: {_message(exc)}") from exc
    except openai.APIConnectionError as exc:
        where = session.base_url or "the base URL (OPENAI_BASE_URL)"
        raise CommandError(f"cannot reach {where}: {exc}") from exc
    except openai.OpenAIError as exc:  # e.g. no API key: the SDK's own message
        raise CommandError(str(exc)) from exc


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or exc.message)


def batch_id(reference: str) -> str:
    """A batch id from an id (``batch_…``) or a Batch object's name (``batch-…``, kubectl's)."""
    return batch_id_from_name(reference) if reference.startswith("batch-") else reference


def not_found_hint(reference: str, namespace: str | None) -> str:
    """What to check when the gateway does not know a batch."""
    if namespace:
        return (
            f" (Batch {namespace}/{reference}: the API key must be one of namespace {namespace},"
            " where the gateway looks for it)"
        )
    return ""
