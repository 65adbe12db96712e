"""The ``llmbatch`` command. Subcommands live beside the code they drive and load lazily."""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click command or group; loaded only when invoked so that
# `llmbatch validate` never pays for importing vLLM or the Kubernetes client.
_SUBCOMMANDS: dict[str, str] = {
    "validate": "llmbatch.commands.validate:validate",
    "dev": "llmbatch.commands.dev:dev",
    "run": "llmbatch.commands.run:run",
    "models": "llmbatch.commands.models:models",
    "operator": "llmbatch.commands.operator:operator",
    "gateway": "llmbatch.commands.gateway:gateway",
    "keys": "llmbatch.commands.keys:keys",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _SUBCOMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup)
@click.version_option(package_name="llm-batch-operator")
def main() -> None:
    """OpenAI-compatible batch inference on Kubernetes."""
