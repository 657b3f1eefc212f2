"""The wheel carries what the installed tool needs: patches, recipes, the requirement files (`bundle
--with-clients` reads clients.txt) and the GPU catalog."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
                   check=True)
    (built,) = out.glob("mlstack_ds-*.whl")
    return built


def test_wheel_ships_patches_recipes_and_catalog(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mlstack_ds/gfx_targets.toml" in names
    for kind in ("patches", "recipes", "requirements"):
        shipped = {f.relative_to(REPO / kind).as_posix() for f in (REPO / kind).rglob("*") if f.is_file()}
        assert shipped, kind
        assert {f"mlstack_ds/_data/{kind}/{rel}" for rel in shipped} <= names


def test_wheel_declares_no_torch_or_deepspeed_dependency(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip().lower() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [r for r in requires if r.startswith(("torch", "deepspeed"))], requires
    assert {r.split(">")[0].split(";")[0].strip() for r in requires} == {
        "typer", "rich", "unidiff", "requests", "packaging", "tomli"}
