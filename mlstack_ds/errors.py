"""Expected failures and their exit codes.

Every failure a user can cause or meet (bad input, missing tool, broken download, conflicting patch)
is an `MlstackError`: the CLI prints its message and hint on one line each and exits with its code,
never with a traceback. Anything else is a bug (exit 1).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The documented exit codes (README, `--help`)."""

    OK = 0
    BUG = 1
    USAGE = 2
    ENVIRONMENT = 3
    FETCH = 4
    PATCH = 5
    BUILD = 6
    INSTALL = 7
    VERIFY = 8
    DOES_NOT_FIT = 9  # `config`: the model does not fit these GPUs, even with offload
    BENCH = 10  # `bench`: a stage failed (crashed, timed out, needed a JIT compile); OOM is a result
    INTERRUPTED = 130
    PIPE = 141  # stdout's reader went away (128 + SIGPIPE, as other Unix tools)


class MlstackError(Exception):
    """An expected failure: what went wrong, what to do about it, and the exit code.

    `details` is data a `--json` caller gets with the error (e.g. the checks an interrupted verify
    finished); plain output shows only the message and the hint.
    """

    exit_code: ExitCode = ExitCode.BUG

    def __init__(self, message: str, hint: str = "", exit_code: ExitCode | None = None,
                 details: dict[str, object] | None = None, reported: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or {}
        # The command already printed its --json document, and it says what failed (a verify report,
        # a patch check): the error adds its line on stderr, never a second document on stdout.
        self.reported = reported
        if exit_code is not None:
            self.exit_code = exit_code

    def to_json(self) -> dict[str, object]:
        """The one JSON document a `--json` run prints on stdout when it fails."""
        return {"error": {"message": self.message, "hint": self.hint, "exit_code": int(self.exit_code),
                          **self.details}}


class UsageError(MlstackError):
    exit_code = ExitCode.USAGE


class EnvironmentProblem(MlstackError):
    exit_code = ExitCode.ENVIRONMENT


class FetchError(MlstackError):
    exit_code = ExitCode.FETCH


class PatchError(MlstackError):
    exit_code = ExitCode.PATCH


class BuildError(MlstackError):
    exit_code = ExitCode.BUILD


class InstallError(MlstackError):
    exit_code = ExitCode.INSTALL


class VerifyFailed(MlstackError):
    exit_code = ExitCode.VERIFY


class ConfigDoesNotFit(MlstackError):
    """`config`: no placement fits, even with everything offloaded; the refusal carries the numbers."""

    exit_code = ExitCode.DOES_NOT_FIT


class BenchFailed(MlstackError):
    exit_code = ExitCode.BENCH


class ToolError(EnvironmentProblem):
    """A subprocess could not run: missing executable, time-out, or start failure."""


class ToolMissing(ToolError):
    pass


class ToolTimedOut(ToolError):
    pass


class ToolStalled(ToolTimedOut):
    """Stopped by a stall rule: it made no progress for its stall time (before its ceiling)."""


class Interrupted(MlstackError):
    """Ctrl-C or SIGTERM: reported like any other stop, with what state things were left in."""

    exit_code = ExitCode.INTERRUPTED
