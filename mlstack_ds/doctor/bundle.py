"""`doctor --offline DIR`: does the bundle in DIR cover installing the recipe here, or on each node?

Why in doctor too: on an air-gapped cluster one bundle serves many nodes, and a node whose Python or platform it
does not serve should be found before an install is started, with the `bundle` command that completes it. The
answer is install's own check (`bundle.offline.check_offline`, the same function and message): doctor says what
`install --offline DIR` would refuse, never a guess of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.bundle.coverage import Target
from mlstack_ds.bundle.offline import NOTHING_INSTALLED, check_offline
from mlstack_ds.cluster.nodeprobe import NodeFacts
from mlstack_ds.errors import InstallError
from mlstack_ds.recipe import Recipe

SHARED_HINT = "put the bundle on a file system every node sees, at the same path (or copy it to each node there)"


@dataclass(frozen=True)
class BundleQuestion:
    """What `doctor --offline DIR` asks: does DIR cover installing `recipe` with its patch `series` (name,
    sha256)? The caller reads the series (the patches stage, which doctor never imports: tests/unit/test_layers)."""

    directory: Path
    recipe: Recipe
    series: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class BundleCoverage:
    """install --offline's answer for one target: covered (no `problem`), or what is missing and the fix."""

    directory: Path
    python_version: str | None  # the target's major.minor; None: the node does not see DIR
    problem: str | None = None
    fix: str | None = None
    missing: tuple[dict[str, Any], ...] = ()

    @property
    def covered(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "python_version": self.python_version, "covered": self.covered,
                "problem": self.problem, "fix": self.fix, "missing": list(self.missing)}


def bundle_coverage(question: BundleQuestion, target: Target) -> BundleCoverage:
    """Whether `install --offline DIR` of the recipe and its series is covered on `target`."""
    directory = question.directory
    try:
        check_offline(directory, question.recipe, question.series, target)
    except InstallError as exc:
        missing = exc.details.get("missing")
        return BundleCoverage(directory, target.python_version, exc.message.removesuffix(NOTHING_INSTALLED), exc.hint,
                              tuple(missing) if isinstance(missing, list) else ())
    return BundleCoverage(directory, target.python_version)


def nodes_coverage(nodes: Sequence[NodeFacts], question: BundleQuestion) -> dict[str, BundleCoverage]:
    """Each node's coverage, for its own Python and platform tags (the node probe's). Nodes that share both are
    checked once (the files are read here, on the shared file system). A node that does not see DIR at this
    path is not covered; a node whose Python or tags are unknown (unreachable, no interpreter) is left out:
    other findings name it."""
    directory = question.directory
    checked: dict[tuple[str, tuple[str, ...]], BundleCoverage] = {}
    found: dict[str, BundleCoverage] = {}
    for node in nodes:
        if node.bundle_seen is False:
            found[node.host] = BundleCoverage(directory, None, f"{directory} is not a bundle there (no bundle.json "
                                              "at that path)", SHARED_HINT)
            continue
        target = node.target
        if target is None or not target.answered or not node.platform_tags:
            continue
        key = (".".join(target.python.version.split(".")[:2]), node.platform_tags)
        if key not in checked:
            checked[key] = bundle_coverage(question, Target(*key))
        found[node.host] = checked[key]
    return found


def covered_note(coverage: BundleCoverage, recipe: Recipe, where: str) -> str:
    return (f"bundle {coverage.directory}: covers installing {recipe.name} (DeepSpeed {recipe.version}) {where} "
            f"(Python {coverage.python_version}): install --offline {coverage.directory} takes everything from it")
