"""Which published wheel fits this machine: the rules, as pure functions of two plans (no I/O).

A wheel fits when it was built from the same recipe, pin and patch series, for the same platform, torch
build, Python, ROCm major.minor and wavefront, for GPU targets that include every target this machine's
plan has (a "fat" wheel for gfx90a,gfx942 serves a gfx942 node), with every op this machine's plan would
build, on the same machine type, with CPU instructions this CPU has. Every rule a candidate breaks is
named, so "nothing matched" always says why, per candidate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from mlstack_ds.detect.versions import major_minor

PUBLISHED_SCHEMA = 1


@dataclass(frozen=True)
class Here:
    """This machine as the rules see it: its plan (`BuildPlan.to_dict()`), machine type and CPU flags."""

    plan: Mapping[str, Any]
    machine: str
    cpu_flags: tuple[str, ...]


def _plan(published: Mapping[str, Any]) -> Mapping[str, Any]:
    plan = published.get("plan")
    return plan if isinstance(plan, Mapping) else {}


def _built_ops(plan: Mapping[str, Any]) -> set[str]:
    return {str(op.get("name")) for op in plan.get("ops") or () if isinstance(op, Mapping) and op.get("build")}


def _patches(plan: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(str(p.get("name")), str(p.get("sha256"))) for p in plan.get("patches") or () if isinstance(p, Mapping)]


def _torch(plan: Mapping[str, Any]) -> str:
    extra = [f"HIP {plan['torch_hip']}" if plan.get("torch_hip") else "",
             f"CUDA {plan['torch_cuda']}" if plan.get("torch_cuda") else ""]
    return f"torch {plan.get('torch_version')}" + "".join(f" ({e})" for e in extra if e)


def mismatches(published: Mapping[str, Any], here: Here, *, facts_only: bool = False) -> list[str]:
    """Why the published wheel does not fit here; empty when it does. `facts_only` (doctor, which never
    plans a build): only what the machine decides (platform, torch, Python, ROCm, wavefront, targets, CPU),
    not the recipe, pin, series and ops a plan would add."""
    if published.get("schema") != PUBLISHED_SCHEMA:
        return [f"its plan file has schema {published.get('schema')!r}, not {PUBLISHED_SCHEMA}"]
    theirs, mine = _plan(published), here.plan
    reasons: list[str] = []

    def differs(key: str, what: str) -> None:
        if theirs.get(key) != mine.get(key):
            reasons.append(f"{what} {theirs.get(key)}, this machine's plan {mine.get(key)}")

    if not facts_only:
        differs("recipe", "recipe")
        differs("source_pin", "source pin")
        if _patches(theirs) != _patches(mine):
            names = sorted({n for n, _ in set(_patches(theirs)) ^ set(_patches(mine))})
            reasons.append(f"another patch series (differs in {', '.join(names) or 'order'})")
    differs("platform", "platform")
    if not facts_only:
        differs("accelerator", "DS_ACCELERATOR")
    if (theirs.get("torch_version"), theirs.get("torch_hip"), theirs.get("torch_cuda")) != (
            mine.get("torch_version"), mine.get("torch_hip"), mine.get("torch_cuda")):
        reasons.append(f"built for {_torch(theirs)}, the target has {_torch(mine)}")
    py_theirs, py_mine = (major_minor(str(p.get("python_version") or "")) for p in (theirs, mine))
    if py_theirs != py_mine:
        reasons.append(f"built for Python {py_theirs}, the target is Python {py_mine}")
    if mine.get("platform") == "rocm":
        rocm_theirs, rocm_mine = major_minor(str(theirs.get("rocm_version") or "")), major_minor(
            str(mine.get("rocm_version") or ""))
        if rocm_theirs != rocm_mine or rocm_mine is None:
            reasons.append(f"built against ROCm {rocm_theirs or 'unknown'}, this machine has ROCm "
                           f"{rocm_mine or 'unknown'}")
        differs("rocm_wheels", "ROCm wheels")
        if theirs.get("wavefront") != mine.get("wavefront"):
            reasons.append(f"built for wave{theirs.get('wavefront')} targets, this machine's are "
                           f"wave{mine.get('wavefront')}")
    lacking = [a for a in mine.get("archs") or () if a not in set(theirs.get("archs") or ())]
    if lacking:
        reasons.append(f"built for {', '.join(theirs.get('archs') or ()) or 'no GPU target'}; lacks "
                       f"{', '.join(lacking)}")
    ops = sorted(_built_ops(mine) - _built_ops(theirs))
    if ops:
        reasons.append(f"lacks op(s) {', '.join(ops)} that this machine's plan builds")
    host = published.get("host") if isinstance(published.get("host"), Mapping) else {}
    if host.get("machine") and host.get("machine") != here.machine:
        reasons.append(f"built on {host.get('machine')}, this is {here.machine}")
    flags = host.get("cpu_flags")
    if isinstance(flags, list) and here.cpu_flags:
        absent = sorted(set(map(str, flags)) - set(here.cpu_flags))
        if absent:
            reasons.append(f"its CPU ops were compiled for instructions this CPU lacks: {', '.join(absent)}")
    return reasons


def rank(published: Mapping[str, Any], here: Here) -> tuple[int, int]:
    """Among fitting wheels, the one built from exactly this plan first, then the fewest extra targets."""
    plan = _plan(published)
    return (0 if plan.get("cache_key") == here.plan.get("cache_key") else 1, len(plan.get("archs") or ()))


def _segment(text: str) -> str:
    text = text.lower().replace("xnack-", "xnackoff").replace("xnack+", "xnackon").replace(
        "sramecc-", "srameccoff").replace("sramecc+", "srameccon")
    return ".".join(part for part in re.split(r"[^a-z0-9]+", text) if part)


def label(plan: Mapping[str, Any]) -> str:
    """The local version label that tells a build apart and says what it is for:
    `rocm6.2.wave64.gfx90a.gfx942.torch2.5.1.k89b9bbe9`, `cpu.torch2.13.0.k1a2b3c4d`. The key's first 8
    hex digits keep builds apart that the readable part would not (another pin, series or op set)."""
    platform = str(plan.get("platform") or "unknown")
    parts: list[str] = [platform]
    if platform == "rocm":
        parts = [f"rocm{plan.get('rocm_version') or 'unknown'}"]
        if plan.get("wavefront"):
            parts.append(f"wave{plan['wavefront']}")
        parts += list(plan.get("archs") or ())
    elif platform == "cuda":
        parts = [f"cuda{plan.get('torch_cuda') or ''}"] + [f"sm{a}" for a in plan.get("archs") or ()]
    torch = str(plan.get("torch_version") or "").split("+")[0]
    parts += [f"torch{torch}", f"k{str(plan.get('cache_key') or '')[:8]}"]
    return ".".join(_segment(p) for p in parts if _segment(p))


def published_version(version: str, plan: Mapping[str, Any]) -> str:
    """The wheel's version in the index: its public version (a local label it had is dropped) + ours."""
    try:
        public = Version(version).public
    except InvalidVersion:
        public = version.split("+", maxsplit=1)[0]
    return f"{public}+{label(plan)}"
