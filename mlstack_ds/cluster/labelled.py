"""Each task's stdout, byte for byte, through one `srun --label` step of one task per node.

Why not the labelled lines as they come: slurmstepd sends a task's output in messages of at most 1024 bytes
(Slurm's MAX_MSG_LEN), and in `--label` mode srun ends every message that does not end a line with a newline
of its own and labels the next one (write_labelled_message.c). So a line longer than 1024 bytes arrives as
two lines, indistinguishable from two real ones. The target probe's first line names the interpreter's
paths several times: under a venv with a long path (a project directory on a cluster file system) it passed
1024 bytes, and `doctor --slurm` read every node as "unreadable target probe result (... char 1004)".

So each task's stdout is sent base64-encoded (`base64`, coreutils: 76 characters a line, far below any
message) and decoded here; a split can only cut an encoded line, and decoding ignores the cut. The task's
exit status is kept (`TASK_WRAPPER`), and its stderr is left as it was (srun's own stderr, for messages).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

# `sh -c TASK_WRAPPER sh ARGV...`: ARGV's stdout through base64, ARGV's exit status as the task's (POSIX sh has
# no pipefail: the status comes back on fd 3 of a command substitution). ARGV's stdin is the task's.
TASK_WRAPPER = """exec 4>&1
status=$( { { "$@" 3>&- 4>&-; echo $? >&3; } | base64 >&4; } 3>&1 )
exit "${status:-127}"
"""


def wrapped(argv: Sequence[str]) -> list[str]:
    """The task command that carries `argv`'s stdout encoded."""
    return ["sh", "-c", TASK_WRAPPER, "sh", *argv]


def task_outputs(stdout: str) -> dict[int, str]:
    """srun's `--label`ed stdout of wrapped tasks as {task number: what the task printed}. A task that printed
    nothing is absent; text that is not base64 (a task that did not run the wrapper) is kept as it came."""
    parts: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        task, sep, rest = line.partition(": ")
        if sep and task.strip().isdigit():
            parts.setdefault(int(task), []).append(rest)
    return {task: _decoded(lines) for task, lines in parts.items()}


def _decoded(lines: list[str]) -> str:
    encoded = "".join(line.strip() for line in lines)
    complete = len(encoded) - len(encoded) % 4  # a task stopped mid-way: what it finished
    try:
        return base64.b64decode(encoded[:complete], validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return "\n".join(lines)
