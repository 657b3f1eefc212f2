"""The `mlstack-ds` application: builds the typer app and turns errors into exit codes.

Command modules each expose `register(app)`; this module only wires them together and owns the
one place where exceptions become a one-line message, a hint and an exit code.
"""

from __future__ import annotations

import os
import sys

import typer

# Click's exception classes: vendored inside newer typers, the click package in older ones.
try:
    from typer._click import exceptions as click_exceptions
except ImportError:  # a typer that still depends on click
    from click import exceptions as click_exceptions  # type: ignore[no-redef]
from rich.console import Console
from rich.markup import escape

from mlstack_ds import __version__
from mlstack_ds.cli import detect_cmd, doctor_cmd, fetch_cmd, install_cmd, patches_cmd, recipes_cmd, verify_cmd
from mlstack_ds.errors import ExitCode, MlstackError

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 bug, 2 usage, 3 environment, 4 fetch, 5 patch, 6 build, 7 install, "
    "8 verify failed, 130 interrupted. Set MLSTACK_DEBUG=1 to see tracebacks."
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"mlstack-ds {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="mlstack-ds",
        help="Install upstream DeepSpeed on AMD GPUs (ROCm), patched and prebuilt for your GPUs, "
        "and prove it works.\n\n" + EXIT_CODES_HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="markdown",
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        """Root options."""

    for module in (detect_cmd, install_cmd, verify_cmd, doctor_cmd, recipes_cmd, fetch_cmd, patches_cmd):
        module.register(app)
    return app


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, map every failure to a documented exit code."""
    err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    debug = os.environ.get("MLSTACK_DEBUG", "") not in ("", "0")
    app = build_app()
    try:
        # Not standalone: usage errors come here, so they get our one-line form instead of click's box.
        result = app(args=argv, prog_name="mlstack-ds", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:  # a bare group (`mlstack-ds patches`): its help
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except click_exceptions.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "mlstack-ds"
        err.print(f"[bold red]error:[/] {escape(_one_line(exc.format_message()))}")
        err.print(f"[dim]hint:[/] see '{escape(command)} --help'")
        sys.exit(int(ExitCode.USAGE))
    except click_exceptions.ClickException as exc:  # e.g. a file option that cannot be opened
        err.print(f"[bold red]error:[/] {escape(_one_line(exc.format_message()))}")
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("[bold red]interrupted[/]")
        sys.exit(int(ExitCode.INTERRUPTED))
    except MlstackError as exc:
        if debug:
            err.print_exception()
        err.print(f"[bold red]error:[/] {escape(exc.message)}")
        if exc.hint:
            err.print(f"[dim]hint:[/] {escape(exc.hint)}")
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]")
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:
        if debug:
            raise
        err.print(f"[bold red]error:[/] unexpected {type(exc).__name__}: {escape(str(exc))}")
        err.print("[dim]hint:[/] this is a bug in mlstack-ds; rerun with MLSTACK_DEBUG=1 and report it")
        sys.exit(int(ExitCode.BUG))
    # typer.Exit(code), --help and --version return their exit code; a finished command returns None.
    # Ctrl-C inside a command also arrives here: typer turns it into exit code 130.
    code = result if isinstance(result, int) else 0
    if code == ExitCode.INTERRUPTED:
        err.print("[bold red]interrupted[/]")
    sys.exit(code)
