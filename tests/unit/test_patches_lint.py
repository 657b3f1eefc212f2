"""Patch lint and series loading: every shipped patch directory is clean; broken inputs are named."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlstack_ds.errors import ExitCode, PatchError
from mlstack_ds.patches import LintProblem, lint_patch, lint_patch_dir, load_series
from mlstack_ds.patches.series import parse_patch_file, unsafe_path_problem
from mlstack_ds.resources import data_dir

DESCRIPTION = (
    "Without this patch, building the op on ROCm fails with:\n"
    '    RuntimeError: Error building extension "cpu_adam"\n'
)
DIFF = """\
diff --git a/deepspeed/example.py b/deepspeed/example.py
index 1111111..2222222 100644
--- a/deepspeed/example.py
+++ b/deepspeed/example.py
@@ -1,3 +1,3 @@
 a = 1
-b = 2
+b = 3
 c = 4
"""


def patch_text(subject: str = "example: change b", diff: str = DIFF, *, description: str = DESCRIPTION,
               fields: dict[str, str] | None = None) -> str:
    values = {"Origin": "mlstack-ds", "Forwarded": "not-needed", "Last-Update": "2026-11-22"}
    values.update(fields or {})
    field_lines = "".join(f"{k}: {v}\n" for k, v in values.items() if v is not None)
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: mlstack-ds tests <tests@mlstack-ds.invalid>\n"
        "Date: Sat, 1 Jan 2000 00:00:00 +0000\n"
        f"Subject: [PATCH] {subject}\n\n{description}\n{field_lines}---\n{diff}"
    )


def make_dir(tmp_path: Path, patches: dict[str, str], series: list[str] | None = None) -> Path:
    directory = tmp_path / "series-dir"
    directory.mkdir()
    for name, text in patches.items():
        (directory / name).write_text(text)
    names = series if series is not None else list(patches)
    (directory / "series").write_text("# test series\n" + "".join(f"{n}  # comment\n" for n in names))
    return directory


def shipped_patch_dirs() -> list[Path]:
    return sorted(p.parent for p in data_dir("patches").glob("*/series"))


def test_there_is_a_shipped_series() -> None:
    assert any(d.name == "deepspeed-0.19.5" for d in shipped_patch_dirs())


@pytest.mark.parametrize("directory", shipped_patch_dirs(), ids=lambda p: p.name)
def test_every_shipped_patch_dir_lints_clean(directory: Path) -> None:
    assert [str(p) for p in lint_patch_dir(directory)] == []
    load_series(directory / "series")  # and loads, with every patch parsed


def test_clean_series_loads_with_subjects_and_files(tmp_path: Path) -> None:
    directory = make_dir(tmp_path, {"0001-change-b.patch": patch_text()})
    assert lint_patch_dir(directory) == []
    series = load_series(directory / "series")
    (patch,) = series.patches
    assert patch.subject == "example: change b"
    assert patch.files == ("deepspeed/example.py",)
    assert patch.fields["Origin"] == "mlstack-ds"
    assert "RuntimeError" in patch.description
    assert len(patch.sha256) == 64


def test_empty_series_is_valid(tmp_path: Path) -> None:
    directory = make_dir(tmp_path, {})
    assert lint_patch_dir(directory) == []
    assert load_series(directory / "series").patches == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (patch_text(fields={"Origin": None}), "header field Origin: is missing"),
        (patch_text(fields={"Forwarded": ""}), "header field Forwarded: is missing"),
        (patch_text(fields={"Last-Update": "22 Nov 2026"}), "is not YYYY-MM-DD"),
        (patch_text(description=""), "what breaks without this patch"),
        (patch_text(diff=DIFF.replace("a/deepspeed/example.py", "a/../outside")
                    .replace("b/deepspeed/example.py", "b/../outside")),
         "'../outside': path leaves the tree"),
        (patch_text(diff=DIFF.replace("deepspeed/example.py", ".git/config")), "path inside .git"),
        (patch_text(diff="diff --git a/x.bin b/x.bin\nnew file mode 100644\nindex 0000000..e69de29\n"
                         "GIT binary patch\nliteral 3\nKcmZ>Y0000100000\n\nliteral 0\nHcmV?d00001\n\n"),
         "binary change"),
        (patch_text(diff=DIFF.replace("@@ -1,3 +1,3 @@", "@@ -1,3 +1,9 @@")), "does not parse"),
        (patch_text(diff="just words\n"), "contains no diff"),
    ],
)
def test_lint_reports_each_problem(tmp_path: Path, text: str, expected: str) -> None:
    directory = make_dir(tmp_path, {"0001-x.patch": text})
    problems = [str(p) for p in lint_patch_dir(directory)]
    assert any(expected in p for p in problems), problems


def test_lint_checks_the_series_against_the_directory(tmp_path: Path) -> None:
    directory = make_dir(
        tmp_path,
        {"0001-a.patch": patch_text(), "0003-b.patch": patch_text(), "0002-unlisted.patch": patch_text(),
         "bad_name.patch": patch_text()},
        series=["0003-b.patch", "0001-a.patch", "0001-a.patch", "0009-missing.patch", "bad_name.patch"],
    )
    problems = [str(p) for p in lint_patch_dir(directory)]
    assert "0002-unlisted.patch: patch file is not listed in the series" in problems
    assert "series: 0001-a.patch is out of numeric order" in problems
    assert "series: 0001-a.patch is listed twice" in problems
    assert "series: lists 0009-missing.patch, which does not exist" in problems
    assert "series: 'bad_name.patch' is not named NNNN-short-name.patch" in problems


def test_loading_refuses_broken_series(tmp_path: Path) -> None:
    directory = make_dir(tmp_path, {"0001-a.patch": patch_text()}, series=["0001-a.patch", "0002-gone.patch"])
    with pytest.raises(PatchError, match=r"names 0002-gone\.patch, which does not exist") as info:
        load_series(directory / "series")
    assert info.value.exit_code == ExitCode.PATCH

    outside = patch_text(diff=DIFF.replace("a/deepspeed/example.py", "a/../outside")
                         .replace("b/deepspeed/example.py", "b/../outside"))
    (directory / "0002-gone.patch").write_text(outside)
    with pytest.raises(PatchError, match=r"0002-gone.patch touches '\.\./outside': path leaves the tree"):
        load_series(directory / "series")

    (directory / "series").write_text("../elsewhere.patch\n")
    with pytest.raises(PatchError, match="not a file name in the series directory"):
        load_series(directory / "series")
    with pytest.raises(PatchError, match="cannot read patch series"):
        load_series(directory / "absent")


def test_relative_series_path_gives_absolute_patch_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_dir(tmp_path, {"0001-a.patch": patch_text()})
    monkeypatch.chdir(tmp_path)
    series = load_series(Path("series-dir/series"))
    assert series.patches[0].path == tmp_path / "series-dir" / "0001-a.patch"
    assert series.series_file.is_absolute()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*"abc /+-@\n\t:.", "diff --git a/x b/x\n", "--- a/x\n", "+++ b/x\n",
                                  "--- a/../y\n", "@@ -1,2 +1,2 @@\n", "Subject: s\n", "\\ No newline\n"]),
                max_size=60).map("".join))
def test_parsing_junk_raises_only_patch_errors(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "0001-junk.patch"
        path.write_text(text)
        try:
            patch = parse_patch_file(path)
        except PatchError as exc:
            assert exc.message and exc.exit_code == ExitCode.PATCH
        else:
            assert all(unsafe_path_problem(f) is None for f in patch.files)
        assert all(isinstance(p, LintProblem) for p in lint_patch(path))


def test_lint_reports_a_conflict_note_left_by_refresh(tmp_path: Path) -> None:
    directory = make_dir(tmp_path, {"0001-a.patch": patch_text()}, series=["0001-a.patch"])
    assert lint_patch_dir(directory) == []
    (directory / "0001-a.patch.rej").write_text("# 0001-a.patch does not apply to the new tree\n")
    assert [str(p) for p in lint_patch_dir(directory)] == [
        "0001-a.patch.rej: unresolved conflict note; finish the patch and delete it"]
