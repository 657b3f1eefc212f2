"""The pure parts of `install --hostfile`: targets across nodes, the node's argv, errors, plan differences."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

import mlstack_ds
from mlstack_ds.cluster.tool import ToolRun, tool_argv
from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.install.nodes import gpu_archs, node_failure, node_install_args, union_archs
from mlstack_ds.install.pipeline import InstallRequest
from mlstack_ds.plan.buildplan import plan_differences


def test_gpu_archs_prefers_discrete_gpus_like_a_single_node_install() -> None:
    gpus = [{"vendor": "amd", "arch": "gfx1036", "integrated": True},
            {"vendor": "amd", "arch": "gfx1100", "integrated": False},
            {"vendor": "amd", "arch": "gfx1100", "integrated": False},
            {"vendor": "nvidia", "arch": "", "integrated": False}]
    assert gpu_archs(gpus) == ("gfx1100",)
    assert gpu_archs([{"vendor": "amd", "arch": "gfx1036", "integrated": True}]) == ("gfx1036",)
    assert gpu_archs([]) == ()


def test_union_archs_keeps_hostfile_order_and_drops_repeats() -> None:
    assert union_archs({"a": ("gfx90a",), "b": ("gfx942", "gfx90a"), "c": ()}) == ("gfx90a", "gfx942")
    assert union_archs({"a": (), "b": ()}) == ()  # CPU nodes: no targets, the CPU plan


def test_union_archs_refuses_mixed_wavefronts_naming_the_nodes() -> None:
    with pytest.raises(UsageError) as caught:
        union_archs({"mi250": ("gfx90a",), "navi": ("gfx1100",), "mi300": ("gfx942",)})
    assert caught.value.message == "the nodes' GPUs mix wavefront sizes: wave32: navi; wave64: mi250, mi300"
    assert caught.value.exit_code == ExitCode.USAGE


def test_node_install_args_carry_the_heads_choices_and_never_build() -> None:
    request = InstallRequest(source="git", git_url="file:///m/DeepSpeed", git_commit="abc", patches=False,
                             force=True, rebuild=True, jobs=3)
    args = node_install_args(request, Path("/v/bin/python"), Path("/c"), ("gfx90a", "gfx942"), "k" * 24)
    assert args == ["install", "--python", "/v/bin/python", "--cache-dir", "/c", "--recipe", "0.19.5",
                    "--source", "git", "--cached-wheel", "k" * 24, "--no-verify", "--git-url", "file:///m/DeepSpeed",
                    "--git-commit", "abc", "--arch", "gfx90a,gfx942", "--no-patches", "--force"]
    assert "--rebuild" not in args and "--jobs" not in args  # the node builds nothing


def test_node_install_args_carry_the_lock_timeout() -> None:
    """Each node's install waits for (or refuses, with 0) another change of its environment as the head's
    would: `--lock-timeout` goes to every node."""
    def passed(timeout: float | None) -> list[str]:
        args = node_install_args(InstallRequest(lock_timeout=timeout), Path("/v/bin/python"), Path("/c"), (),
                                 "k" * 24)
        return args[args.index("--lock-timeout"):][:2] if "--lock-timeout" in args else []

    assert [passed(t) for t in (0.0, 2.5, None)] == [["--lock-timeout", "0"], ["--lock-timeout", "2.5"], []]


def test_with_an_index_each_node_installs_from_it_and_still_never_builds() -> None:
    args = node_install_args(InstallRequest(), Path("/v/bin/python"), Path("/c"), ("gfx942",), "k" * 24,
                             index="http://idx:8080/simple")
    assert args == ["install", "--python", "/v/bin/python", "--cache-dir", "/c", "--recipe", "0.19.5",
                    "--source", "pypi", "--index", "http://idx:8080/simple", "--index-only", "--no-verify",
                    "--arch", "gfx942"]


def test_with_a_bundles_prebuilt_wheel_each_node_takes_it_from_the_bundle_and_never_builds() -> None:
    """`--offline DIR` holding a fitting prebuilt wheel: DIR is the index; naming it again with `--index` would be
    refused by the node's install (`--offline` with `--index` is a usage error)."""
    args = node_install_args(InstallRequest(offline=Path("/shared/bundle")), Path("/v/bin/python"), Path("/c"), (),
                             "k" * 24, index="/shared/bundle")
    assert args == ["install", "--python", "/v/bin/python", "--cache-dir", "/c", "--recipe", "0.19.5",
                    "--offline", "/shared/bundle", "--index-only", "--no-verify"]


def test_tool_argv_runs_this_interpreter_with_this_package_and_the_plan_variables() -> None:
    argv = tool_argv(["--version"], {"DS_ACCELERATOR": "cpu", "HIP_VISIBLE_DEVICES": "0", "CXX": ""})
    package_parent = Path(mlstack_ds.__file__).resolve().parent.parent
    assert argv == ["env", "DS_ACCELERATOR=cpu", f"PYTHONPATH={package_parent}", sys.executable, "-m",
                    "mlstack_ds", "--version"]
    assert shlex.split(shlex.join(argv)) == argv  # what ssh hands the remote shell splits back the same


def test_node_failure_names_the_node_and_keeps_its_exit_code() -> None:
    run = ToolRun(3, {"error": {"message": "torch is not importable", "hint": "install torch", "exit_code": 3}}, "")
    error = node_failure("b", run, ["a"], {})
    assert error.message == "node b: install failed: torch is not importable; rolled back on a"
    assert (error.exit_code, error.hint) == (ExitCode.ENVIRONMENT, "install torch")
    crashed = node_failure("b", ToolRun(1, None, "Traceback ...\nKeyError: 'x'\n"), [], {"a": "no receipt"})
    assert crashed.exit_code == ExitCode.INSTALL  # a node's bug is not passed on as exit 1
    assert crashed.message == "node b: install failed: KeyError: 'x'; rollback failed on a: no receipt"


def test_plan_differences_name_what_changes_the_build_only() -> None:
    head = {"torch_version": "2.13.0", "python_version": "3.11.9", "archs": [], "built_ops": ["cpu_adam"],
            "env": {"MAX_JOBS": "64", "DS_BUILD_AIO": "1"}, "notes": ["x"], "target_python": "/a/python"}
    here = {**head, "python_version": "3.11.2", "env": {"MAX_JOBS": "2", "DS_BUILD_AIO": "0"}, "notes": [],
            "target_python": "/b/python", "torch_version": "2.12.0"}
    assert plan_differences(here, head) == ['env DS_BUILD_AIO: "0" here, "1" on the head',
                                            'torch_version: "2.12.0" here, "2.13.0" on the head']
    assert plan_differences(here, None) == []
