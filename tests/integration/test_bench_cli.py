"""`mlstack-ds bench` refuses bad input before anything runs: one error line, a hint, the usage (2) or
environment (3) exit code, nothing written. Runs with the test venv's own torch (no DeepSpeed needed)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from support.cli import CliResult, run_cli

bench = partial(run_cli, "bench", columns=200)  # `mlstack-ds bench ARGS`


def one_error(result: CliResult, code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines


@pytest.mark.parametrize(("args", "needles"), [
    (["--model", "70b"], ["--model '70b'"]),
    (["--stages", "ddp,4"], ["--stages", "4 is not a stage"]),
    (["--stages", "ddp,,3"], ["an empty entry"]),
    (["--world-size", "0"], ["--world-size", "0 ranks"]),
    (["--world-size", "two"], ["two is not a whole number"]),
    (["--steps", "0"], ["--steps 0"]),
    (["--warmup", "-1"], ["--warmup -1"]),
    (["--micro-batch", "0"], ["--micro-batch 0"]),
    (["--seq-len", "-5"], ["--seq-len -5"]),
    (["--timeout", "0"], ["--timeout 0"]),
    (["--memory-cap", "lots"], ["--memory-cap 'lots'"]),
    (["--memory-cap", "0GiB"], ["--memory-cap 0GiB"]),
    (["--precision", "fp8"], ["--precision 'fp8'"]),
    (["--world-size", "2", "--hostfile", "hosts"], ["--world-size cannot be combined with --hostfile"]),
    (["--plot", "bench.svg"], ["the plot is a PNG"]),
    (["--plot", "no/such/dir/bench.png"], ["does not exist"]),
])
def test_bad_input_is_one_usage_error(args: list[str], needles: list[str], tmp_path: Path) -> None:
    one_error(bench(*args, cwd=tmp_path), 2, *needles)
    assert list(tmp_path.iterdir()) == []


def test_plot_without_matplotlib_says_how_to_get_it_before_running(tmp_path: Path) -> None:
    hidden = tmp_path / "hide"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    result = bench("--plot", str(tmp_path / "b.png"), env={"PYTHONPATH": str(hidden)})
    one_error(result, 3, "--plot needs matplotlib")
    assert "mlstack-ds[plot]" in result.stderr
    assert not (tmp_path / "b.png").exists()


def test_a_config_deepspeed_cannot_read_is_refused_naming_the_option(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text("{not json")
    result = bench("--config", str(config))
    assert result.returncode == 2 and "--config" in result.stderr.splitlines()[0], result.stderr


def test_a_target_without_torch_is_an_environment_error(bare_python: Path) -> None:
    result = bench("--python", str(bare_python), "--stages", "ddp")
    one_error(result, 3, "torch is not importable")
