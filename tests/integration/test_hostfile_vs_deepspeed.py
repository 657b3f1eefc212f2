"""`verify --hostfile` reads hostfiles exactly as DeepSpeed 0.19.5's launcher does.

The reference is DeepSpeed's own `fetch_hostfile`, run from the real 0.19.5 source tree in a subprocess
of the test interpreter on the very same files: every case must be accepted by both (with the same hosts
and slots, in order) or refused by both. Our refusals are one usage error naming the file and line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_cli

from mlstack_ds.cluster.hostfile import parse_hostfile
from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.launch import pdsh

# name -> (content, line our refusal names, or None when accepted or the whole file is at fault)
CASES: dict[str, tuple[bytes, int | None]] = {
    "plain": (b"node-a slots=8\nnode-b slots=8\n", None),
    "comments-and-blank-lines": (b"# cluster\n\nnode-a slots=8\n   \n  # indented comment\n", None),
    "trailing-comment": (b"node-a slots=8 # second\n", None),
    "trailing-junk-after-digits": (b"node-a slots=8junk\n", None),
    "second-slots-ignored": (b"node-a slots=2 slots=3\n", None),
    "tab-separator": (b"node-a\tslots=4\n", None),
    "many-spaces": (b"node-a     slots=4\n", None),
    "surrounding-whitespace": (b"   node-a slots=4   \n", None),
    "no-final-newline": (b"node-a slots=4", None),
    "hash-inside-hostname": (b"node#1 slots=2\n", None),
    "zero-slots": (b"node-a slots=0\nnode-b slots=2\n", None),
    "only-zero-slots": (b"node-a slots=0\n", None),
    "leading-zeros": (b"node-a slots=08\n", None),
    "crlf": (b"node-a slots=2\r\nnode-b slots=2\r\n", None),
    "cr-only": (b"node-a slots=2\rnode-b slots=3\r", None),
    "form-feed-is-no-line-break": (b"node-a slots=2\x0cnode-b slots=3\n", None),
    "no-break-space-separator": ("node-a\u00a0slots=2\n".encode(), None),
    "arabic-indic-digit": ("node-a slots=\u0663\n".encode(), None),
    "hosts-differing-in-case": (b"node-a slots=2\nNODE-A slots=2\n", None),
    "spaces-around-equals": (b"node-a slots = 8\n", 1),
    "space-after-equals": (b"node-a\nnode-b slots= 8\n", 1),
    "no-slots": (b"# c\nnode-a\n", 2),
    "slots-only": (b"slots=2\n", 1),
    "negative-slots": (b"node-a slots=-1\n", 1),
    "word-slots": (b"node-a slots=x\n", 1),
    "upper-case-key": (b"node-a SLOTS=2\n", 1),
    "duplicate-host": (b"node-a slots=2\nnode-b slots=2\nnode-a slots=4\n", 3),
    "duplicate-host-same-slots": (b"node-a slots=2\n\nnode-a slots=2\n", 3),
    "bom-before-comment": ("\ufeff# hosts\nnode-a slots=1\n".encode(), 1),
    "too-many-digits": (b"node-a slots=" + b"9" * 5000 + b"\n", 1),
    "empty": (b"", None),
    "only-comments": (b"# only\n\n#\n", None),
    "binary": (bytes(range(128, 256)), None),
}

DEEPSPEED_SIDE = """
import json, sys
from deepspeed.launcher.runner import fetch_hostfile
out = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        pool = fetch_hostfile(path)
        out[name] = {"accepted": [[h, n] for h, n in pool.items()]}
    except Exception as exc:
        out[name] = {"refused": f"{type(exc).__name__}: {exc}"[:200]}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def hostfiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("hostfiles")
    files = {}
    for name, (content, _line) in CASES.items():
        files[name] = directory / name
        files[name].write_bytes(content)
    return files


@pytest.fixture(scope="module")
def deepspeed_verdicts(pristine_tree_template: Path, hostfiles: dict[str, Path]) -> dict[str, dict]:
    """DeepSpeed's own parser on every case, in one subprocess (importing deepspeed takes ~15 s)."""
    env = {**os.environ, "PYTHONPATH": str(pristine_tree_template), "DS_ACCELERATOR": "cpu", "PYTHONUTF8": "1"}
    result = subprocess.run(
        [sys.executable, "-c", DEEPSPEED_SIDE, json.dumps({n: str(p) for n, p in hostfiles.items()})],
        capture_output=True, text=True, env=env, timeout=300, cwd=pristine_tree_template.parent,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("name", list(CASES))
def test_we_accept_and_refuse_exactly_what_deepspeed_does(
    name: str, hostfiles: dict[str, Path], deepspeed_verdicts: dict[str, dict]
) -> None:
    theirs = deepspeed_verdicts[name]
    path = hostfiles[name]
    try:
        ours = [[h.host, h.slots] for h in parse_hostfile(path)]
    except UsageError as exc:
        assert "refused" in theirs, f"we refused what DeepSpeed accepts ({theirs}): {exc.message}"
        assert exc.exit_code == ExitCode.USAGE and "\n" not in exc.message and exc.hint
        line = CASES[name][1]
        assert exc.message.startswith(f"--hostfile {path}" + (f":{line}:" if line else ""))
        return
    assert "accepted" in theirs, f"we accepted what DeepSpeed refuses: {theirs['refused']}"
    assert ours == theirs["accepted"]


def test_duplicate_host_error_names_both_lines(hostfiles: dict[str, Path]) -> None:
    with pytest.raises(UsageError) as caught:
        parse_hostfile(hostfiles["duplicate-host"])
    assert caught.value.message.endswith(":3: host node-a is listed twice (first on line 1)")


def test_master_is_the_first_host_with_a_slot(hostfiles: dict[str, Path]) -> None:
    """DeepSpeed gives rank 0 (the rendezvous server) to the first host that has slots."""
    hosts = parse_hostfile(hostfiles["zero-slots"])
    argv = pdsh.deepspeed_argv(Path("p"), hostfiles["zero-slots"], hosts, 1, [])
    assert argv[argv.index("--master_addr") + 1] == "node-b"


@pytest.mark.parametrize(("name", "message"), [
    ("duplicate-host", ":3: host node-a is listed twice (first on line 1)"),
    ("spaces-around-equals", ":1: bad entry 'node-a slots = 8': expected `hostname slots=N`"),
    ("only-zero-slots", ": every host has slots=0, so no rank would run"),
])
def test_verify_refuses_a_bad_hostfile_as_a_usage_error(hostfiles: dict[str, Path], name: str, message: str) -> None:
    """A duplicate host used to reach DeepSpeed's launcher and come back as failed checks (exit 8)."""
    result = run_cli("verify", "--hostfile", str(hostfiles[name]))
    assert result.returncode == 2, result.stderr
    error, hint = result.stderr.splitlines()
    assert error == f"error: --hostfile {hostfiles[name]}{message}"
    assert hint.startswith("hint: ") and result.stdout == ""
