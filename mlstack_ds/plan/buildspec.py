"""Per-platform build tables of a recipe: which DeepSpeed ops to build ahead of time, and why.

The recipe loader keeps `[platforms.<name>]` opaque; this module owns their schema:

    [platforms.rocm]
    accelerator = "cuda"                      # DS_ACCELERATOR during the build
    [platforms.rocm.ops.fused_adam]           # key = the op's NAME (as in installed_ops)
    flag = "DS_BUILD_FUSED_ADAM"              # DeepSpeed's build variable for it
    build = true
    requires = "libaio"                       # optional: build only when this prerequisite exists
    reason = "one line: why on, or why off"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlstack_ds.errors import UsageError

KNOWN_REQUIREMENTS = frozenset({"libaio"})
_FLAG_RE = re.compile(r"^DS_BUILD_[A-Z0-9_]+$")


@dataclass(frozen=True)
class OpSpec:
    name: str
    flag: str
    build: bool
    reason: str
    requires: str | None = None


@dataclass(frozen=True)
class PlatformBuild:
    platform: str
    accelerator: str
    ops: tuple[OpSpec, ...]


def parse_platform(platform: str, table: Mapping[str, Any], where: str) -> PlatformBuild:
    """Validate one `[platforms.<platform>]` table; errors name the file and dotted key."""

    def fail(key: str, why: str) -> UsageError:
        return UsageError(f"{where}: platforms.{platform}{key} {why}", hint="fix the recipe file")

    unknown = set(table) - {"accelerator", "ops"}
    if unknown:
        raise fail("." + sorted(unknown)[0], "is not a known key (allowed: accelerator, ops)")
    accelerator = table.get("accelerator")
    if accelerator not in ("cuda", "cpu"):
        raise fail(".accelerator", f"must be \"cuda\" or \"cpu\", not {accelerator!r}")
    ops_table = table.get("ops")
    if not isinstance(ops_table, Mapping) or not ops_table:
        raise fail(".ops", "must be a non-empty table of ops")
    ops = []
    for name, spec in ops_table.items():
        key = f".ops.{name}"
        if not isinstance(spec, Mapping):
            raise fail(key, "must be a table")
        extra = set(spec) - {"flag", "build", "reason", "requires"}
        if extra:
            raise fail(f"{key}.{sorted(extra)[0]}", "is not a known key (allowed: flag, build, reason, requires)")
        flag, build, reason = spec.get("flag"), spec.get("build"), spec.get("reason")
        requires = spec.get("requires")
        if not isinstance(flag, str) or not _FLAG_RE.match(flag):
            raise fail(f"{key}.flag", f"must be a DS_BUILD_* variable name, not {flag!r}")
        if not isinstance(build, bool):
            raise fail(f"{key}.build", "must be true or false")
        if not isinstance(reason, str) or not reason.strip():
            raise fail(f"{key}.reason", "is missing: every op needs a one-line reason")
        if requires is not None and requires not in KNOWN_REQUIREMENTS:
            raise fail(f"{key}.requires", f"must be one of {sorted(KNOWN_REQUIREMENTS)}, not {requires!r}")
        ops.append(OpSpec(name=name, flag=flag, build=build, reason=reason.strip(), requires=requires))
    return PlatformBuild(platform=platform, accelerator=accelerator, ops=tuple(ops))
