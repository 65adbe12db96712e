"""``llmbatch models``: the small real models shipped in PyPI packages (see executor.models)."""

from __future__ import annotations

import sys
import time

import click

from llmbatch.executor.models import MODELS, ModelNotAvailable, cache_dir, prepare


@click.group()
def models() -> None:
    """List and prepare the packaged models (smollm2, minilm)."""


@models.command("list")
def list_models() -> None:
    """Show each known model, its endpoints and whether it is prepared."""
    width = max(len(",".join(known.endpoints)) for known in MODELS.values())
    for known in MODELS.values():
        try:
            where = str(known.folder())
        except ModelNotAvailable as exc:
            where = f"({exc})"
        state = "ready" if known.is_prepared() else "not prepared"
        click.echo(f"{known.name:8} {state:13} {','.join(known.endpoints):{width}} {where}")


@models.command("prepare")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Convert again even when the folder exists.")
@click.option("--no-verify", is_flag=True, help="Skip the 'capital of France' check.")
def prepare_models(names: tuple[str, ...], force: bool, no_verify: bool) -> None:
    """Prepare NAMES (default: all) under $LLMBATCH_CACHE/models (once; later runs skip)."""
    selected = names or tuple(MODELS)
    unknown = [n for n in selected if n not in MODELS]
    if unknown:
        raise click.BadParameter(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
    click.echo(f"model cache: {cache_dir() / 'models'}")
    for name in selected:
        known = MODELS[name]
        already = known.is_prepared() and not force
        started = time.monotonic()
        try:
            folder = prepare(name, force=force, verify=not no_verify)
        except ModelNotAvailable as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        took = "" if already else f" ({time.monotonic() - started:.0f} s)"
        click.echo(f"{name}: {'already prepared' if already else 'prepared'}{took}: {folder}")
