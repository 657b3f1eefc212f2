"""The one probe of the target interpreter, run for real in this test venv (torch 2.13.0 CPU). A fake
`torch` package first on PYTHONPATH makes torch's import hang, crash or leave a trace, to show that the
first line (no torch) survives and that `quick` never imports torch."""

from __future__ import annotations

import os
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from support.doctor_inputs import make_env

from mlstack_ds.detect.model import PythonInfo
from mlstack_ds.detect.target_probe import (
    BASE_MARKER,
    TargetFacts,
    parse_target_output,
    probe_target,
)
from mlstack_ds.doctor.facts import SystemFacts, collect_facts
from mlstack_ds.errors import UsageError
from mlstack_ds.installed.health import installed_state
from mlstack_ds.patience import Patience

PYTHON = Path(sys.executable)


def fake_torch(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose `import torch` runs `body` instead of the real torch."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(body)
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_one_probe_answers_everything() -> None:
    facts = probe_target(PYTHON)
    assert facts.answered and facts.torch_probed and facts.warnings == []
    assert facts.python.prefix == sys.prefix and facts.python.version.startswith(f"{sys.version_info[0]}.")
    assert facts.torch_version == metadata.version("torch")  # from metadata, in the first line
    assert facts.torch is not None and facts.torch.version == facts.torch_version and facts.torch.build == "cpu"
    assert facts.deepspeed is None and facts.deepspeed_record is None  # the test venv has no DeepSpeed


def test_quick_stops_before_importing_torch(tmp_path: Path) -> None:
    trace = tmp_path / "imported"
    env = fake_torch(tmp_path, f"open({str(trace)!r}, 'w').close()\n")
    facts = probe_target(PYTHON, env, torch=False)
    assert facts.answered and facts.python.prefix == sys.prefix and facts.torch_version
    assert not facts.torch_probed and facts.torch is None and facts.warnings == []
    assert not trace.exists()


def test_a_hanging_torch_import_keeps_the_first_line(tmp_path: Path) -> None:
    """doctor's need: headers, prefix and RECORD even when `import torch` hangs on a broken driver."""
    env = fake_torch(tmp_path, "import time\ntime.sleep(300)\n")
    started = time.monotonic()
    facts = probe_target(PYTHON, env, patience=Patience(20, 60))  # room for the first line on a loaded machine
    assert time.monotonic() - started < 120  # the time-out, not the 300 s import
    assert facts.answered and facts.python.prefix == sys.prefix and facts.python.include_dir
    assert facts.torch is None and not facts.torch_probed
    assert facts.torch_error is not None and "did not finish within 20 s" in facts.torch_error
    found = collect_facts_for(facts)
    assert found.target_prefix == sys.prefix and found.python_include == facts.python.include_dir


def collect_facts_for(facts: TargetFacts) -> SystemFacts:
    """doctor's facts from a probe's answer (as `diagnose` passes detect's)."""
    env = make_env()
    return collect_facts(type(env)(**{**env.__dict__, "python": facts.python}), environ={"PATH": ""},
                         root=Path("/nonexistent"), target=facts)


def test_a_crashing_torch_import_keeps_the_first_line(tmp_path: Path) -> None:
    env = fake_torch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    facts = probe_target(PYTHON, env)
    assert facts.answered and facts.python.prefix == sys.prefix
    assert facts.torch is None and facts.torch_error is not None and "exited with -9" in facts.torch_error


def test_a_broken_torch_is_an_error_not_absent(tmp_path: Path) -> None:
    env = fake_torch(tmp_path, "raise OSError('libamdhip64.so: cannot open shared object file')\n")
    facts = probe_target(PYTHON, env)
    assert facts.torch_probed and facts.torch is None
    assert facts.torch_error == "import torch failed: OSError: libamdhip64.so: cannot open shared object file"


@pytest.mark.parametrize("stdout", ["", "junk\n", f"{BASE_MARKER}{{not json\n", f"{BASE_MARKER}[1, 2]\n",
                                    f'{BASE_MARKER}{{"python": {{"executable": "x"}}}}\n'])
def test_no_usable_first_line_is_no_answer(stdout: str) -> None:
    facts = parse_target_output(stdout, Path("/x/python"), interrupted=None)
    assert not facts.answered and facts.python == PythonInfo("/x/python", "unknown") and facts.problem


def test_install_refuses_an_interpreter_that_did_not_answer() -> None:
    facts = parse_target_output("", Path("/bin/true"))
    with pytest.raises(UsageError, match="--python /bin/true: not a working Python interpreter"):
        installed_state(facts, "/bin/true")


def test_installed_state_from_the_first_line() -> None:
    state = installed_state(probe_target(PYTHON, torch=False), str(PYTHON))
    assert state.prefix == sys.prefix and state.torch_version == metadata.version("torch")
    assert (state.deepspeed_version, state.deepspeed_location, state.record, state.prebuilt_ops) == (
        None, None, None, ())
