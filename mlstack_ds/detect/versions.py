"""Parsers for ROCm version sources (pure). No single file is reliable across releases:
`.info/version` is absent on some ROCm 7 installs, `.info/version-dev` only on some distros."""

from __future__ import annotations

import re

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_info_version(text: str) -> str | None:
    """`6.2.0-66` -> `6.2.0` (the contents of `<root>/.info/version` or `version-dev`)."""
    match = _VERSION_RE.match(text.strip())
    if not match:
        return None
    major, minor, patch = match.groups()
    return f"{major}.{minor}.{patch or 0}"


def parse_rocm_version_header(text: str) -> str | None:
    """`#define ROCM_VERSION_MAJOR 6` ... from `<root>/include/rocm-core/rocm_version.h`."""
    parts = {}
    for key in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#\s*define\s+ROCM_VERSION_{key}\s+(\d+)", text)
        if match:
            parts[key] = match.group(1)
    if "MAJOR" not in parts or "MINOR" not in parts:
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts.get('PATCH', '0')}"


def parse_hip_version(text: str) -> tuple[str, str] | None:
    """A HIP version (`hipconfig --version`, `torch.version.hip`, or hipconfig's `HIP version :` line)
    -> (ROCm `major.minor`, raw string). HIP's third field is a build number, not ROCm's patch level."""
    labelled = re.search(r"HIP version\s*:\s*(\S+)", text)
    lines = text.strip().splitlines()
    candidate = labelled.group(1) if labelled else (lines[0].strip() if lines else "")
    match = re.match(r"^(\d+)\.(\d+)(?:\.\d+)?(?:-\S*)?$", candidate)
    if not match:
        return None
    return f"{match.group(1)}.{match.group(2)}", candidate


def parse_amd_smi_version(text: str) -> str | None:
    """`AMDSMI Tool: ... | ROCm version: 6.4.1 | ...` -> `6.4.1`."""
    match = re.search(r"ROCm version:\s*(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def major_minor(version: str | None) -> str | None:
    if not version:
        return None
    match = _VERSION_RE.match(version)
    return f"{match.group(1)}.{match.group(2)}" if match else None


# The last release of the legacy ROCm stream, whose HIP version numbers matched ROCm's (TheRock's 7.14 and
# ROCm 10.x number HIP apart: ROCm 10.1 reports HIP 7.16).
LAST_HIP_NAMED_ROCM = (7, 2)


def major_minor_key(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string, for comparing; None when it has none."""
    found = major_minor(version)
    if found is None:
        return None
    major, minor = found.split(".")
    return int(major), int(minor)


def hip_names_rocm(hip_major_minor: str) -> bool:
    """Whether a HIP `major.minor` is also the ROCm release's (the legacy stream, up to ROCm 7.2)."""
    key = major_minor_key(hip_major_minor)
    return key is not None and key <= LAST_HIP_NAMED_ROCM

