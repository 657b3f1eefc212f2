"""`--source` and its companion options are interpreted, or refused as usage errors (exit 2)."""

from __future__ import annotations

import pytest

from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.source import parse_source_spec
from mlstack_ds.source.url import filename_from_url

SHA = "ab" * 32
COMMIT = "cd" * 20


@pytest.mark.parametrize(
    ("source", "kind", "location"),
    [
        ("git", "git", None),
        ("pypi", "pypi", None),
        ("https://example.org/x/deepspeed-0.19.5.tar.gz", "url", "https://example.org/x/deepspeed-0.19.5.tar.gz"),
        ("http://127.0.0.1:8000/a.tgz", "url", "http://127.0.0.1:8000/a.tgz"),
        ("/srv/DeepSpeed", "path", "/srv/DeepSpeed"),
        ("file:///srv/sdists/deepspeed-0.19.5.tar.gz", "path", "/srv/sdists/deepspeed-0.19.5.tar.gz"),
        ("./relative", "path", "./relative"),
    ],
)
def test_source_kinds(source: str, kind: str, location: str | None) -> None:
    spec = parse_source_spec(source)
    assert (spec.kind, spec.location) == (kind, location)


def test_overrides_are_normalised() -> None:
    spec = parse_source_spec("git", git_url="/mirror", git_commit=COMMIT.upper())
    assert spec.git_commit == COMMIT
    assert parse_source_spec("https://h/x.tar.gz", sha256=SHA.upper()).sha256 == SHA


@pytest.mark.parametrize(
    ("source", "options", "message"),
    [
        ("ftp://host/x.tar.gz", {}, "unsupported URL scheme"),
        ("pypi", {"git_url": "/m"}, "only apply to --source git"),
        ("https://h/x.tar.gz", {"git_commit": COMMIT}, "only apply to --source git"),
        ("git", {"sha256": SHA}, "does not apply to --source git"),
        ("pypi", {"sha256": SHA}, "does not apply to --source pypi"),
        ("https://h/x.tar.gz", {"sha256": "abc"}, "not 64 hex"),
        ("git", {"git_commit": "cf44300"}, "full 40-character"),
    ],
)
def test_bad_combinations_are_usage_errors(source: str, options: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_source_spec(source, **options)
    assert info.value.exit_code == ExitCode.USAGE
    assert info.value.hint


def test_filename_from_url() -> None:
    assert filename_from_url("https://h/p/deepspeed-0.19.5.tar.gz?x=1") == "deepspeed-0.19.5.tar.gz"
    assert filename_from_url("https://h/a%20b.tgz") == "a b.tgz"
    assert filename_from_url("https://h/") == "download.tar.gz"
