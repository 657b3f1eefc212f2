"""The `mlstack-ds` application: builds the typer app and turns errors into exit codes.

Command modules each expose `register(app)`; this module only wires them together and owns the
one place where exceptions become a one-line message, a hint and an exit code.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
from typing import Annotated, NoReturn

import typer

# Click's exception classes: vendored inside newer typers, the click package in older ones.
try:
    from typer._click import exceptions as click_exceptions
except ImportError:  # a typer that still depends on click
    from click import exceptions as click_exceptions  # type: ignore[no-redef]
from rich.console import Console
from rich.markup import escape

from mlstack_ds import __version__
from mlstack_ds.cli import (
    bench_cmd,
    bundle_cmd,
    config_cmd,
    detect_cmd,
    doctor_cmd,
    fetch_cmd,
    index_cmd,
    install_cmd,
    patches_cmd,
    recipes_cmd,
    verify_cmd,
)
from mlstack_ds.errors import ExitCode, Interrupted, MlstackError, UsageError

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 bug, 2 usage, 3 environment, 4 fetch, 5 patch, 6 build, 7 install, "
    "8 verify failed, 9 the model does not fit (config), 10 a bench stage failed, 130 interrupted (Ctrl-C or SIGTERM), "
    "141 the reader of stdout went away. "
    "With --json a failure prints one {\"error\": ...} document on stdout. Set MLSTACK_DEBUG=1 to see tracebacks."
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
        version: Annotated[bool, typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")] = False,
    ) -> None:
        """Root options."""

    for module in (detect_cmd, install_cmd, index_cmd, bundle_cmd, verify_cmd, doctor_cmd, config_cmd, bench_cmd,
                   recipes_cmd, fetch_cmd, patches_cmd):
        module.register(app)
    return app


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _sigterm_as_interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM stops every command the way Ctrl-C does: running probes, builds and launches are killed
    (the runner kills their process groups on the way out), temporary directories are removed."""
    raise KeyboardInterrupt


def _stop_on_interrupt_and_terminate() -> None:
    """Ctrl-C and SIGTERM both stop the command cleanly, however the tool was started.

    A background job of a script (`mlstack-ds install & wait`, a CI step, a batch script) starts with
    SIGINT ignored: bash sets that for `&` jobs of a non-interactive shell, and Python keeps an ignored
    SIGINT ignored. Ctrl-C then killed the script around the tool and left the tool, its build or its
    ranks running, and `kill -INT` did nothing. The tool runs long jobs and whatever starts it (a
    terminal, srun, a job controller) must be able to stop them, so SIGINT is always ours to handle.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


# Errors of writing the output itself (`> /dev/full`, a disk quota): the environment, not a bug.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, map every failure to a documented exit code.

    With `--json`, a failure also prints exactly one JSON document on stdout (`{"error": {...}}`), so a
    caller parsing stdout always gets a document.
    """
    args = sys.argv[1:] if argv is None else argv
    json_mode = "--json" in args
    err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    debug = os.environ.get("MLSTACK_DEBUG", "") not in ("", "0")
    _stop_on_interrupt_and_terminate()
    stdout_at_start = _stdout_identity()
    app = build_app()
    try:
        # Not standalone: usage errors come here, so they get our one-line form instead of click's box.
        result = app(args=args, prog_name="mlstack-ds", standalone_mode=False)
        sys.stdout.flush()
    except click_exceptions.NoArgsIsHelpError as exc:  # a bare group (`mlstack-ds patches`): its help
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except click_exceptions.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "mlstack-ds"
        _fail(err, UsageError(_one_line(exc.format_message()), hint=f"see '{command} --help'"), json_mode)
    except click_exceptions.ClickException as exc:  # e.g. a file option that cannot be opened
        _fail(err, MlstackError(_one_line(exc.format_message()), exit_code=ExitCode(exc.exit_code)), json_mode)
    except (typer.Abort, KeyboardInterrupt):
        _fail(err, Interrupted("interrupted", hint="nothing was left running; run the command again to resume"),
              json_mode)
    except MlstackError as exc:
        if debug:
            err.print_exception()
        _fail(err, exc, json_mode)
    except BrokenPipeError:
        _output_closed(ExitCode.PIPE)
    except SystemExit as exc:
        # rich answers a broken pipe by pointing stdout at /dev/null and exiting 1; that is no bug.
        if exc.code == 1 and _stdout_identity() != stdout_at_start and _stdout_identity() == _devnull_identity():
            os._exit(int(ExitCode.PIPE))
        raise
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS or debug:
            _bug(err, exc, json_mode, debug)
        _output_closed(ExitCode.ENVIRONMENT, err, f"cannot write the output: {exc.strerror}")
    except Exception as exc:
        _bug(err, exc, json_mode, debug)
    # typer.Exit(code), --help and --version return their exit code; a finished command returns None.
    # Ctrl-C inside a command also arrives here: typer turns it into exit code 130.
    code = result if isinstance(result, int) else 0
    if code == ExitCode.INTERRUPTED:
        _fail(err, Interrupted("interrupted", hint="run the command again to resume"), json_mode)
    sys.exit(code)


def _stdout_identity() -> tuple[int, int] | None:
    try:
        info = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _devnull_identity() -> tuple[int, int]:
    info = os.stat(os.devnull)
    return info.st_dev, info.st_ino


def _fail(err: Console, exc: MlstackError, json_mode: bool) -> NoReturn:
    """One `error:` line, one `hint:` line on stderr; with --json also the error document on stdout."""
    err.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.hint:
        err.print(f"[dim]hint:[/] {escape(exc.hint)}")
    if json_mode and not exc.reported:
        try:
            sys.stdout.write(json.dumps(exc.to_json(), indent=2, default=str) + "\n")
            sys.stdout.flush()
        except OSError:
            _output_closed(exc.exit_code)
    sys.exit(int(exc.exit_code))


def _bug(err: Console, exc: BaseException, json_mode: bool, debug: bool) -> NoReturn:
    if debug:
        raise exc
    _fail(err, MlstackError(f"unexpected {type(exc).__name__}: {exc}",
                            hint="this is a bug in mlstack-ds; rerun with MLSTACK_DEBUG=1 and report it"), json_mode)


def _output_closed(code: ExitCode, err: Console | None = None, message: str = "") -> NoReturn:
    """stdout cannot take more (the reader left, or the device is full): say so on stderr if there is
    something to say, and point stdout at /dev/null so Python's own exit-time flush stays quiet."""
    if err is not None and message:
        err.print(f"[bold red]error:[/] {escape(message)}")
        err.print("[dim]hint:[/] free some space, or send the output elsewhere")
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    os._exit(int(code))
