"""Client library versions known to fail with a DeepSpeed version: `known_bad_clients.toml`, read.

Data with its evidence, reviewed like data: a new bad pair, found by a user or a verify run, is one entry and no
code. doctor makes a rule of each (`doctor/rules/client_rules.py`: findings, `--log` matching, the
troubleshooting page) and verify names the pair beside a failed check whose reason carries its error text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from mlstack_ds import tomlcompat

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class BadPair:
    """One client version range that fails with one DeepSpeed version range, unless our patch is in."""

    id: str
    client: str
    client_versions: SpecifierSet
    deepspeed: SpecifierSet
    fixed_by_patch: str | None
    severity: str
    title: str
    symptom: str
    log_pattern: re.Pattern[str]
    fix: tuple[str, ...]
    evidence: str

    def applies(self, client_version: str | None, deepspeed_version: str | None,
                patches: tuple[str, ...] = ()) -> bool:
        """Both versions fall in their ranges and DeepSpeed was not built with the patch that fixes it."""
        if client_version is None or deepspeed_version is None or self.fixed_by_patch in patches:
            return False
        try:
            client, ds = Version(client_version), Version(deepspeed_version)
        except InvalidVersion:
            return False
        # Local and pre-release versions (0.19.5+rocm, 5.18.0.dev0) belong to their release's range.
        return (self.client_versions.contains(client, prereleases=True)
                and self.deepspeed.contains(Version(ds.base_version), prereleases=True))


def load_pairs(text: str) -> tuple[BadPair, ...]:
    """The pairs of a `known_bad_clients.toml` text; a malformed entry is a ValueError naming it."""
    pairs = []
    for entry in tomlcompat.loads(text).get("pair", []):
        try:
            pairs.append(BadPair(
                id=entry["id"], client=entry["client"], client_versions=SpecifierSet(entry["client_versions"]),
                deepspeed=SpecifierSet(entry["deepspeed"]), fixed_by_patch=entry.get("fixed_by_patch"),
                severity=entry["severity"], title=entry["title"], symptom=entry["symptom"],
                log_pattern=re.compile(entry["log_pattern"]), fix=tuple(entry["fix"]), evidence=entry["evidence"]))
            if entry["severity"] not in SEVERITIES:
                raise ValueError(f"severity {entry['severity']!r} is not one of {', '.join(SEVERITIES)}")
        except (KeyError, TypeError, ValueError, InvalidSpecifier, re.error) as exc:
            raise ValueError(f"known_bad_clients.toml: entry {entry.get('id', '?')} is malformed: {exc!r}") from exc
    return tuple(pairs)


def known_bad_pairs() -> tuple[BadPair, ...]:
    text = resources.files("mlstack_ds.detect").joinpath("known_bad_clients.toml").read_text(encoding="utf-8")
    return load_pairs(text)



def known_cause(reason: str, pairs: tuple[BadPair, ...]) -> BadPair | None:
    """The pair whose error text a failure reason carries (verify names it beside a failed client check)."""
    return next((pair for pair in pairs if pair.log_pattern.search(reason)), None)
