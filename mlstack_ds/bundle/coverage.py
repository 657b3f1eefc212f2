"""Does a bundle cover an install? A pure function of the manifest, the files found in DIR, what the plan needs
and the target's tags: the list of what is missing, each with its reason, and the `bundle` command that adds it.

Why pure: `install --offline` must refuse *before* anything changes, and name every missing piece at once (not
the first pip happens to trip over an hour into a build); as a function of data it is tested file by file
without pip. The target's wheel tags are packaging's (the same rules pip applies).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging import tags
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from mlstack_ds.bundle.manifest import BundleFile, BundleTarget, Manifest


@dataclass(frozen=True)
class Target:
    """The machine installing: its Python (major.minor) and the platform tags its pip accepts, best first."""

    python_version: str
    platforms: tuple[str, ...]

    @property
    def python_tag(self) -> str:
        return "cp" + self.python_version.replace(".", "")

    def supported(self) -> frozenset[tags.Tag]:
        """Every wheel tag this target installs (CPython's own, abi3, then pure Python), as pip computes them."""
        version = tuple(int(p) for p in self.python_version.split("."))
        return frozenset([*tags.cpython_tags(version, platforms=list(self.platforms)),
                          *tags.compatible_tags(version, self.python_tag, platforms=list(self.platforms))])


@dataclass(frozen=True)
class Need:
    """What the plan needs from a bundle: the pin (recipe, sdist sha256), the series (name, sha256), the
    requirements (DeepSpeed's runtime ones, the build's, the clients' when asked) as requirement strings."""

    recipe: str
    deepspeed_version: str
    sdist_sha256: str
    series: tuple[tuple[str, str], ...]
    requirements: Mapping[str, tuple[str, ...]]  # kind ("runtime", "build", "clients") -> requirements


@dataclass(frozen=True)
class Missing:
    """One thing the bundle lacks for this install: a name a user recognises and why it is missing."""

    name: str
    kind: str
    reason: str

    def describe(self) -> str:
        return f"{self.name} ({self.kind}: {self.reason})"


def wrong_target(manifest: Manifest, target: Target) -> str | None:
    """Why the bundle was made for another machine (another Python, a platform this one does not accept), or
    None. A bundle for 3.12 holds cp312 wheels (pydantic-core, numpy...): not one of them installs on 3.11."""
    made = manifest.target
    if made.python_version != target.python_version:
        return (f"the bundle was made for {made.describe()}, and this target is Python {target.python_version} "
                f"({target.python_tag}): its compiled wheels do not install here")
    if made.platform not in target.platforms:
        return (f"the bundle was made for {made.describe()}, and this machine does not accept {made.platform} "
                f"wheels (it takes {', '.join(target.platforms[:3])}, ...)")
    return None


def missing(manifest: Manifest, present: Mapping[str, str], need: Need, target: Target) -> list[Missing]:
    """Everything `need` lacks in the bundle. `present` maps each file found under DIR (relative path) to its
    sha256. A file the manifest lists must be there with its sha256; the pin and every patch of the series must be
    the plan's; every requirement needs a file in DIR of that project, of a version it accepts, for this target."""
    found: list[Missing] = []
    intact = {f.path: f for f in manifest.files if present.get(f.path) == f.sha256}
    for item in manifest.files:
        if item.path not in intact:
            state = "modified" if item.path in present else "missing"
            found.append(Missing(_file_name(item), item.kind,
                                 f"{item.path} is listed in the manifest but {state} in the bundle"))
    sdists = [f for f in intact.values() if f.kind == "sdist"]
    gone = any(f.kind == "sdist" and f.sha256 == need.sdist_sha256 and f.path not in intact for f in manifest.files)
    if not gone and not any(f.sha256 == need.sdist_sha256 for f in sdists):  # a removed sdist is said above
        found.append(Missing(f"deepspeed {need.deepspeed_version} sdist", "sdist",
                             f"the pinned sdist (sha256 {need.sdist_sha256[:16]}...) of recipe {need.recipe} is not in "
                             f"the bundle (it was made for {manifest.recipe})"))
    patches = {(f.path.rsplit("/", 1)[-1], f.sha256) for f in intact.values() if f.kind == "patch"}
    for name, digest in need.series:
        if (name, digest) not in patches and not _named(found, name):
            why = ("another version of it" if any(n == name for n, _ in patches) else "not in the bundle")
            found.append(Missing(name, "patch", f"the series of {need.recipe} needs this patch: {why}"))
    wheels = [f for f in intact.values() if f.path.endswith(".whl")]
    supported = target.supported()
    for kind, requirements in need.requirements.items():
        for text in requirements:
            problem = _requirement_problem(text, wheels, supported)
            if problem is not None and not _named(found, problem[0]):
                found.append(Missing(problem[0], kind, problem[1]))
    return found


def _file_name(item: BundleFile) -> str:
    """How a user names a file of the bundle: its project (`hjson`), or a patch's file name."""
    return item.path.rsplit("/", 1)[-1] if item.kind == "patch" else item.project or item.path


def _named(found: Sequence[Missing], name: str) -> bool:
    """Already reported (a file of the manifest gone): said once, with its first reason."""
    return any(m.name == name for m in found)


def _requirement_problem(text: str, wheels: Sequence[BundleFile], supported: frozenset[tags.Tag]
                         ) -> tuple[str, str] | None:
    """(name, why) when no wheel of the bundle satisfies requirement `text` on a target with `supported` tags."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return text, "not a requirement pip reads"
    name = canonicalize_name(requirement.name)
    candidates = [w for w in wheels if canonicalize_name(w.project) == name]
    if not candidates:
        return name, f"required ({text}) and not in the bundle"
    fitting = [w for w in candidates if _accepts(requirement, w.version)]
    if not fitting:
        return name, (f"required ({text}); the bundle has only "
                      + ", ".join(sorted(w.version for w in candidates)))
    if not any(_wheel_tags(w.path) & supported for w in fitting):
        return name, (f"required ({text}); the bundle's {', '.join(w.path.rsplit('/', 1)[-1] for w in fitting)} "
                      "is not for this target")
    return None


def _accepts(requirement: Requirement, version: str) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _wheel_tags(path: str) -> frozenset[tags.Tag]:
    try:
        return parse_wheel_filename(path.rsplit("/", 1)[-1])[3]
    except InvalidWheelFilename:
        return frozenset()


def bundle_command(directory: Path, target: BundleTarget, recipe: str, *, clients: bool = False,
                   extra: Iterable[str] = ()) -> str:
    """The `mlstack-ds bundle` command (run on a machine with network access) that makes or completes the bundle
    for this target: a bundle only adds files, so running it again over DIR fills in what is missing."""
    argv = ["mlstack-ds", "bundle", "--to", str(directory), "--python-version", target.python_version,
            "--platform", target.platform, "--recipe", recipe, *(["--with-clients"] if clients else []), *extra]
    return shlex.join(argv)
