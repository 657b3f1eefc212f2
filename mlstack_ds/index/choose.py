"""`install --index`: the one wheel of an index that fits this machine, then that wheel checked through and
through before anything of it is installed (nothing in it is imported or run to check it).

Checks, in order: the download's sha256 against the index page; the plan file's sha256 against the page and
its wheel hash against the page; every file of the wheel against its RECORD; its version and DeepSpeed's own
build record inside it (ops, accelerator, torch and HIP/CUDA, the extensions' Python) against the plan file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlstack_ds.detect.versions import major_minor
from mlstack_ds.errors import FetchError
from mlstack_ds.index.match import Here, mismatches, rank
from mlstack_ds.index.read import Index, download, list_wheels, locate, read_file
from mlstack_ds.index.simple import Link
from mlstack_ds.index.wheelfile import (
    WheelProblem,
    check_record,
    compiled_tags,
    deepspeed_build_info,
    wheel_metadata_version,
)
from mlstack_ds.plan.buildplan import BuildPlan, OpDecision


@dataclass(frozen=True)
class Offer:
    """One DeepSpeed wheel of the index and why it does not fit (empty `reasons`: it fits)."""

    link: Link
    published: Mapping[str, Any] | None
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"wheel": self.link.filename, "url": self.link.url, "sha256": self.link.sha256,
                "fits": not self.reasons, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class IndexChoice:
    """What the index offered, and the wheel chosen (None: nothing fits)."""

    index: Index
    offers: tuple[Offer, ...]
    chosen: Offer | None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index.spec, "chosen": self.chosen.link.filename if self.chosen else None,
                "candidates": [offer.to_json() for offer in self.offers]}

    def why_not(self) -> str:
        """`wheel: reason; reason` per candidate, for the message that nothing fits."""
        if not self.offers:
            return f"the index {self.index.spec} has no DeepSpeed wheels"
        return "; ".join(f"{o.link.filename}: {', '.join(o.reasons)}" for o in self.offers)


@dataclass(frozen=True)
class VerifiedWheel:
    path: Path
    sha256: str
    url: str
    published: Mapping[str, Any]


def choose(spec: str, here: Here, *, facts_only: bool = False) -> IndexChoice:
    """Read the index and pick the best fitting wheel (reads plan files only, no wheel); `facts_only`: see
    `mismatches`."""
    index = locate(spec)
    offers = []
    for link in list_wheels(index):
        if link.plan_sha256 is None:
            offers.append(Offer(link, None, ("no plan file (not published by mlstack-ds publish)",)))
            continue
        published = _plan_file(index, link)
        offers.append(Offer(link, published, tuple(mismatches(published, here, facts_only=facts_only))))
    fitting = [o for o in offers if not o.reasons and o.published is not None]
    chosen = min(fitting, key=lambda o: (rank(o.published or {}, here), o.link.filename)) if fitting else None
    return IndexChoice(index, tuple(offers), chosen)


def _plan_file(index: Index, link: Link) -> Mapping[str, Any]:
    body = read_file(index, link.plan_url, link.plan_sha256, f"the plan file of {link.filename}")
    try:
        published = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        published = None
    if not isinstance(published, dict) or not isinstance(published.get("plan"), dict):
        raise FetchError(f"the plan file of {link.filename} in the index {index.spec} is not a plan",
                         hint="republish the wheel (mlstack-ds publish)")
    return published


def fetch_verified(choice: IndexChoice, directory: Path) -> VerifiedWheel:
    """The chosen wheel downloaded into `directory` and checked; a wheel that fails a check is removed and
    named (`FetchError`, exit 4): nothing was installed."""
    offer = choice.chosen
    assert offer is not None and offer.published is not None
    published, link = offer.published, offer.link
    if published.get("wheel_sha256") != link.sha256 or published.get("wheel") != link.filename:
        raise FetchError(f"the plan file of {link.filename} in the index {choice.index.spec} describes another "
                         "wheel; nothing was installed", hint="republish the wheel (mlstack-ds publish)")
    wheel = download(choice.index, link, directory)
    try:
        problem = contents_problem(wheel, published)
    except (OSError, WheelProblem) as exc:
        problem = str(exc)
    if problem:
        wheel.unlink(missing_ok=True)
        raise FetchError(f"{link.filename} from the index {choice.index.spec} is not what its plan says: "
                         f"{problem}; nothing was installed",
                         hint="republish it from a good build (mlstack-ds publish), or install without --index "
                         "to build here")
    return VerifiedWheel(wheel, link.sha256, link.url, published)


def contents_problem(wheel: Path, published: Mapping[str, Any]) -> str | None:
    """What in the wheel disagrees with its plan file (None: nothing). RECORD first: a file changed after
    the wheel was made is named as such."""
    check_record(wheel)
    plan = published["plan"]
    version = wheel_metadata_version(wheel)
    if version != published.get("version"):
        return f"its METADATA says version {version}, the plan file {published.get('version')}"
    info = deepspeed_build_info(wheel)
    ops = info.get("installed_ops")
    built = sorted(n for n, on in ops.items() if on and n != "deepspeed_not_implemented") if isinstance(
        ops, dict) else None
    planned = sorted(str(op["name"]) for op in plan.get("ops") or () if op.get("build"))
    if built != planned:
        return f"its prebuilt ops are {built}, the plan's {planned}"
    if info.get("accelerator_name") != plan.get("accelerator"):
        return f"it was built for accelerator {info.get('accelerator_name')}, the plan's is {plan.get('accelerator')}"
    torch = info.get("torch_info") if isinstance(info.get("torch_info"), dict) else {}
    assert isinstance(torch, dict)
    if str(torch.get("version")) != major_minor(str(plan.get("torch_version") or "")):
        return f"it was built against torch {torch.get('version')}, the plan's is {plan.get('torch_version')}"
    if plan.get("torch_hip") and str(torch.get("hip_version")) != major_minor(str(plan["torch_hip"])):
        return f"it was built against HIP {torch.get('hip_version')}, the plan's torch has {plan['torch_hip']}"
    python = major_minor(str(plan.get("python_version") or ""))
    expected = f"cpython-{python.replace('.', '')}" if python else None
    other = sorted(tag for tag in compiled_tags(wheel) if tag != expected)
    if other:
        return f"its compiled ops are for {', '.join(other)}, the plan's Python is {python}"
    return None


# Notes about how a build here would run (buildplan._concurrency): moot when nothing is built.
_BUILD_ONLY = ("ninja not found", "ops build one after another", "--jobs")


def adopt(plan: BuildPlan, offer: Offer) -> BuildPlan:
    """This machine's plan, as the chosen wheel was built: its targets (a superset of this machine's), ops,
    flags and cache key, and where it comes from. The interpreter and the notes stay this machine's."""
    theirs = offer.published["plan"] if offer.published else {}
    ops = tuple(OpDecision(str(op["name"]), str(op["flag"]), bool(op["build"]), str(op["reason"]))
                for op in theirs.get("ops") or ())
    note = (f"prebuilt wheel {offer.link.filename} from the index: nothing is compiled here, no compiler needed"
            + (f" (targets {', '.join(theirs.get('archs') or ())} cover {', '.join(plan.archs)})"
               if plan.archs and tuple(theirs.get("archs") or ()) != plan.archs else ""))
    return replace(plan, archs=tuple(theirs.get("archs") or ()), wavefront=theirs.get("wavefront"), ops=ops,
                   env={str(k): str(v) for k, v in (theirs.get("env") or {}).items()},
                   cache_key=str(theirs["cache_key"]), targets_source="index" if plan.archs else "",
                   prebuilt=offer.link.url, notes=(*(n for n in plan.notes if not n.startswith(_BUILD_ONLY)), note))
