"""Each task's stdout through `srun --label`, whole: the wrapper run for real by `sh` here, and the decoder fed
what srun prints when slurmstepd cuts a task's output into messages of at most 1024 bytes (srun labels each
message and ends one that does not end a line with a newline of its own: Slurm's write_labelled_message.c).
tests/multinode/test_slurm_doctor.py proves it on the real two-node cluster."""

from __future__ import annotations

import itertools
import subprocess

from mlstack_ds.cluster import labelled

MAX_MSG_LEN = 1024


def srun_label(task: int, stdout: bytes, message_sizes: list[int]) -> str:
    """What `srun --label` prints for one task whose stdout slurmstepd sent in messages of these sizes."""
    out, at = [], 0
    for size in [*message_sizes, len(stdout)]:
        message = stdout[at:at + size]
        at += len(message)
        for line in message.decode().splitlines(keepends=True):
            out.append(f"{task}: {line}" + ("" if line.endswith("\n") else "\n"))
        if at >= len(stdout):
            break
    return "".join(out)


def run_wrapped(argv: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(labelled.wrapped(argv), input=stdin, capture_output=True, text=True, timeout=60)


def test_a_line_longer_than_a_message_comes_back_whole() -> None:
    line = "MLSTACK_TARGET_BASE:" + '{"python": "' + "/p" * 800 + '"}'
    done = run_wrapped(["python3", "-c", f"print({line!r}); print('end')"])
    assert done.returncode == 0, done.stderr
    printed = done.stdout.encode()
    assert max(len(text) for text in done.stdout.splitlines()) <= 76  # far below a message: never cut mid-line
    # slurmstepd's cuts at any byte (1024 in buffered mode, smaller pieces with --unbuffered):
    for sizes in ([MAX_MSG_LEN] * 10, [7, 300, 1, 1000], [1] * 50):
        assert labelled.task_outputs(srun_label(0, printed, sizes)) == {0: line + "\nend\n"}
    # the labelled lines as they were read before: a raw long line cut in two is two lines
    raw = srun_label(0, (line + "\n").encode(), [MAX_MSG_LEN])
    assert raw.splitlines()[0] == "0: " + line[:MAX_MSG_LEN]


def test_tasks_are_kept_apart_and_a_silent_task_is_absent() -> None:
    a = run_wrapped(["sh", "-c", "echo node-a; echo second"]).stdout.encode()
    b = run_wrapped(["sh", "-c", "printf 'no newline at the end'"]).stdout.encode()
    silent = run_wrapped(["true"])
    assert silent.stdout == ""
    interleaved = "".join(x + y for x, y in itertools.zip_longest(srun_label(0, a, [3, 5]).splitlines(keepends=True),
                                                                   srun_label(10, b, [4]).splitlines(keepends=True),
                                                                   fillvalue=""))
    assert labelled.task_outputs(interleaved) == {0: "node-a\nsecond\n", 10: "no newline at the end"}


def test_the_task_keeps_its_exit_status_stdin_and_stderr() -> None:
    done = run_wrapped(["sh", "-c", "read line; echo \"got $line\"; echo oops >&2; exit 3"], stdin="input\n")
    assert done.returncode == 3
    assert done.stderr == "oops\n"
    assert labelled.task_outputs(srun_label(0, done.stdout.encode(), [])) == {0: "got input\n"}
    missing = run_wrapped(["/nonexistent/tool"])
    assert missing.returncode == 127 and "nonexistent" in missing.stderr


def test_text_that_was_not_encoded_is_kept_as_it_came() -> None:
    assert labelled.task_outputs("0: sh: 1: base64: not found\nsrun: error\n") == {0: "sh: 1: base64: not found"}
