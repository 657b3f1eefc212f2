"""`install --offline DIR`: the bundle checked against this install before anything changes, then pip held to DIR.

Why check first: on an air-gapped node a missing wheel is otherwise found by pip after the build (minutes to an
hour), and its error names one requirement at a time. Here every missing piece is named at once, with the
`bundle` command that adds it. Why `--no-index`, `--find-links` per project and no configuration files: a
user's pip.conf can add indexes or find-links of its own; with `PIP_CONFIG_FILE=/dev/null` and every `PIP_*`
variable dropped, what pip sees is DIR and nothing else.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging import tags

from mlstack_ds.bundle.contents import BUILD_REQUIREMENTS, SIMPLE_DIR, file_digests, sdist_requirements
from mlstack_ds.bundle.coverage import Missing, Need, Target, bundle_command, missing, wrong_target
from mlstack_ds.bundle.manifest import BundleTarget, Manifest, read_manifest
from mlstack_ds.errors import FetchError, InstallError
from mlstack_ds.index.simple import PROJECT
from mlstack_ds.recipe import Recipe

# How both refusals end; what repeats the reason elsewhere (each node of --hostfile, doctor) leaves it off.
NOTHING_INSTALLED = "; nothing was installed"


@dataclass(frozen=True)
class OfflineBundle:
    """A bundle that covers this install: where its sdist is, and the pip options that hold pip to it."""

    directory: Path
    manifest: Manifest
    sdist: Path

    @property
    def simple(self) -> Path:
        """DIR/simple: the bundle's index, one directory of wheels per project."""
        return self.directory / SIMPLE_DIR

    def has_prebuilt(self) -> bool:
        """Whether DIR holds DeepSpeed wheels mlstack-ds built (`bundle --prebuilt`, `publish --to DIR`)."""
        return any((self.simple / PROJECT).glob("*.whl"))

    def pip_args(self) -> tuple[str, ...]:
        """`--no-index` and one `--find-links` per project directory of DIR/simple (flat directories of files)."""
        simple = self.simple
        links = sorted(str(d) for d in simple.iterdir() if d.is_dir()) if simple.is_dir() else []
        return ("--no-index", *[arg for d in links for arg in ("--find-links", d)])


def pip_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a pip that may read nothing but DIR: no configuration file, no `PIP_*` of the user's."""
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def here(python_version: str) -> Target:
    """This machine as a target: the target interpreter's major.minor, and the platform tags of this machine (the
    target runs here, so its architecture and libc are these)."""
    major_minor = ".".join(python_version.split(".")[:2])
    return Target(major_minor, tuple(tags.platform_tags()))


def check_offline(directory: Path, recipe: Recipe, series: Sequence[tuple[str, str]], target: Target
                  ) -> OfflineBundle:
    """The bundle in `directory` if it covers installing `recipe` with `series` on `target`; otherwise an
    `InstallError` (exit 7) naming what is missing, or the Python it was made for, and the bundle command."""
    directory = Path(os.path.abspath(directory))
    manifest = read_manifest(directory)
    fix = bundle_command(directory, manifest.target, recipe.name, clients=manifest.clients,
                         extra=("--torch", manifest.torch))
    reason = wrong_target(manifest, target)
    if reason is not None:
        platform = (manifest.target.platform if manifest.target.platform in target.platforms
                    else next((t for t in target.platforms if t.startswith("manylinux_")), target.platforms[0]))
        other = directory.with_name(f"{directory.name}-py{target.python_version}")
        raise InstallError(f"the bundle in {directory} does not fit this target: {reason}{NOTHING_INSTALLED}",
                           hint="make one for this target (each target has its own directory) on a machine with "
                           "network access: " + bundle_command(other, BundleTarget(target.python_version, platform),
                                                               recipe.name, clients=manifest.clients,
                                                               extra=("--torch", manifest.torch)))
    present = file_digests(directory, manifest)
    sdist = directory / "sources" / recipe.sdist.filename
    runtime = manifest.requested.get("runtime", ())
    sdist_rel = f"sources/{recipe.sdist.filename}"
    if present.get(sdist_rel) == recipe.sdist.sha256:
        with contextlib.suppress(FetchError):  # else reported below as the sdist's problem
            runtime = sdist_requirements(sdist)
    need = Need(recipe.name, recipe.version, recipe.sdist.sha256, tuple(series),
                {"runtime": tuple(runtime), "build": BUILD_REQUIREMENTS})
    gaps = missing(manifest, present, need, target)
    if gaps:
        modified = [item.path for item in manifest.files if item.path in present and present[item.path] != item.sha256]
        first = f"remove the modified {', '.join(modified)}, then " if modified else ""
        raise InstallError(f"the bundle in {directory} lacks what this install needs: "
                           f"{describe(gaps)}{NOTHING_INSTALLED}",
                           hint=f"on a machine with network access, {first}complete it (a bundle only adds files): "
                           f"{fix}; then copy it here again", details={"missing": [g.__dict__ for g in gaps]})
    return OfflineBundle(directory, manifest, sdist)


def describe(gaps: Sequence[Missing]) -> str:
    return "; ".join(g.describe() for g in gaps)
