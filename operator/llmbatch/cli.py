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
    "batches": "llmbatch.commands.batches:batches",
}
#: Subcommands that need an optional extra: name -> (the module it needs, the extra).
_EXTRAS: dict[str, tuple[str, str]] = {"batches": ("openai", "client")}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _SUBCOMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if cmd_name not in _EXTRAS or exc.name != _EXTRAS[cmd_name][0]:
                raise
            return _needs_extra(cmd_name, *_EXTRAS[cmd_name])
        command = getattr(module, attr)
        assert isinstance(command, click.Command)
        return command


def _needs_extra(name: str, module: str, extra: str) -> click.Command:
    """A stand-in for a subcommand whose optional dependency is not installed: listed in the
    help, and saying what to install when run."""
    install = f"pip install 'llm-batch-operator[{extra}]'"

    def refuse() -> None:
        raise click.ClickException(f"`llmbatch {name}` needs the {module} package: {install}")

    return click.Command(
        name,
        callback=refuse,
        help=f"(needs {install})",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@click.group(cls=_LazyGroup)
@click.version_option(package_name="llm-batch-operator")
def main() -> None:
    """OpenAI-compatible batch inference on Kubernetes."""
