"""Check selection and launch grouping."""

from __future__ import annotations

import pytest

from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.verify.checks import CHECK_NAMES, CHECKS, CheckSpec, launch_groups, select_checks


def test_default_selection_is_every_default_check_in_table_order() -> None:
    assert [s.name for s in select_checks()] == [s.name for s in CHECKS if s.default]


def test_issue_checks_are_all_in_the_table() -> None:
    wanted = {"environment", "prebuilt_ops", "fused_adam", "cpu_adam", "fused_lamb", "fused_lion", "zero1",
              "zero2", "zero3", "zero2_offload", "zero3_offload", "precision", "checkpoint", "amd_specific"}
    assert wanted <= set(CHECK_NAMES)


def test_only_keeps_table_order_not_argument_order() -> None:
    assert [s.name for s in select_checks(only="zero3,zero1")] == ["zero1", "zero3"]


def test_only_accepts_a_list_and_spaces() -> None:
    assert [s.name for s in select_checks(only=["zero2 , zero1", "checkpoint"])] == ["zero1", "zero2",
                                                                                     "checkpoint"]


def test_skip_removes_from_defaults() -> None:
    names = [s.name for s in select_checks(skip="zero3,checkpoint")]
    assert "zero3" not in names and "checkpoint" not in names and "zero1" in names


def test_unknown_check_is_a_usage_error_naming_it() -> None:
    with pytest.raises(UsageError) as info:
        select_checks(only="zero1,zero4")
    assert "zero4" in info.value.message and "zero1" in info.value.hint
    assert info.value.exit_code == ExitCode.USAGE


def test_skipping_everything_selected_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no checks left"):
        select_checks(only="zero1", skip="zero1")


def test_one_launch_by_default() -> None:
    groups = launch_groups(select_checks())
    assert len(groups) == 1 and [s.name for s in groups[0]] == [s.name for s in select_checks()]


def test_isolate_gives_one_launch_per_check() -> None:
    specs = select_checks(only="zero1,zero3")
    assert [[s.name for s in g] for g in launch_groups(specs, isolate=True)] == [["zero1"], ["zero3"]]


def test_a_check_with_its_own_launch_group_runs_apart() -> None:
    specs = (CheckSpec("a", "", ()), CheckSpec("b", "", (), launch="alone"), CheckSpec("c", "", ()))
    assert [[s.name for s in g] for g in launch_groups(specs)] == [["a", "c"], ["b"]]
