"""`doctor --offline DIR`: the bundle does not cover installing the recipe here, or on some nodes.

The coverage itself is install --offline's own check (doctor/bundle.py); the rule only turns its answer into
a finding, so that doctor and install name the same missing pieces and the same `bundle` command.
"""

from __future__ import annotations

from typing import Any

from mlstack_ds.doctor.model import DoctorInput, Hit, Rule


def bundle_not_covering(inp: DoctorInput) -> Hit | None:
    coverage = inp.bundle
    if coverage is None or coverage.covered:
        return None
    return Hit(str(coverage.problem), fix=(coverage.fix,) if coverage.fix else ())


def bundle_not_covering_nodes(inp: Any) -> Hit | None:
    """Across `doctor --hostfile/--slurm`'s nodes (`ClusterInput.bundle`): every node not covered, by name."""
    bad = {host: c for host, c in inp.bundle.items() if not c.covered}
    if not bad:
        return None
    return Hit("; ".join(f"{host}: {c.problem}" for host, c in bad.items()),
               fix=tuple(dict.fromkeys(c.fix for c in bad.values() if c.fix)))


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-BUILD-008", severity="error", title="The offline bundle does not cover this install",
        symptom="`install --offline DIR` refuses (exit 7, nothing installed): the bundle was made for another "
        "Python or platform, or lacks the pinned sdist, a patch of the series, or a wheel of a requirement; "
        "or, across nodes, a node does not see DIR at the same path.",
        fix=("on a machine with network access, run the `mlstack-ds bundle --to DIR ...` command the finding "
             "names (a bundle only adds files), then copy DIR over again",),
        source="issue 41 (air-gapped installs): docs/air-gapped.md; the check is install --offline's own",
        check=bundle_not_covering,
        cluster_check=bundle_not_covering_nodes,
    ),
)
