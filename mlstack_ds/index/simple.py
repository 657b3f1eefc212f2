"""PEP 503 "simple" pages: written by `publish`, read (with the stdlib's html.parser) by `install --index`.

Why our own few lines and not pip's internals: pip has no public API for this, and the page is tiny. A page
is read strictly enough that junk (not HTML, links without a sha256) is one clear error, and loosely enough
that any PEP 503 server (devpi, a bucket listing made by another tool) with hashes works.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import quote, unquote, urldefrag, urljoin, urlsplit

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

PROJECT = "deepspeed"
PLAN_SUFFIX = ".plan.json"  # beside each wheel: the plan it was built from
PLAN_ATTRIBUTE = "data-mlstack-plan"  # on a wheel's link: "sha256=<hex>" of that plan file
_SHA256 = re.compile(r"^sha256=([0-9a-f]{64})$")


class PageError(ValueError):
    """The page is not a simple index page we can trust (the message says why)."""


@dataclass(frozen=True)
class Link:
    """One file a project page offers: its name, absolute URL, sha256 and (ours) its plan file's sha256."""

    filename: str
    url: str
    sha256: str
    plan_sha256: str | None = None

    @property
    def plan_url(self) -> str:
        return self.url + PLAN_SUFFIX


def project_page(project: str, files: Iterable[tuple[str, str, str | None]]) -> str:
    """The page of one project: a link per (filename, sha256, plan sha256 or None), sorted by name."""
    rows = []
    for filename, digest, plan_digest in sorted(files):
        extra = f' {PLAN_ATTRIBUTE}="sha256={plan_digest}"' if plan_digest else ""
        href = html.escape(quote(filename))
        rows.append(f'    <a href="{href}#sha256={digest}"{extra}>{html.escape(filename)}</a><br>')
    return _page(f"Links for {project}", rows)


def root_page(projects: Iterable[str]) -> str:
    """The index's root page: a link per project directory."""
    rows = [f'    <a href="{html.escape(p)}/">{html.escape(p)}</a><br>' for p in sorted(projects)]
    return _page("Simple index", rows)


def _page(title: str, rows: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            + "\n".join(rows) + ("\n" if rows else "") + "  </body>\n</html>\n")


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, str]] = []
        self.tags = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags += 1
        if tag == "a":
            self.anchors.append({k: v for k, v in attrs if v is not None})


def parse_project_page(text: str, page_url: str, project: str = PROJECT) -> list[Link]:
    """The wheels of `project` a page links to. Links to other files (sdists, other projects) are ignored;
    a page that is not HTML, or a wheel link without a valid `#sha256=`, is a `PageError`."""
    parser = _Anchors()
    try:
        parser.feed(text)
        parser.close()
    except (AssertionError, ValueError) as exc:  # html.parser gives up on some malformed markup
        raise PageError(f"unparsable HTML ({exc})") from None
    if parser.tags == 0:
        raise PageError("not an HTML page (no tags at all)")
    links = []
    for anchor in parser.anchors:
        href = anchor.get("href")
        if not href:
            continue
        url, fragment = urldefrag(urljoin(page_url, href))
        filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        if not filename.endswith(".whl"):
            continue
        try:
            name = parse_wheel_filename(filename)[0]
        except InvalidWheelFilename:
            continue  # not a wheel pip would take either
        if name != canonicalize_name(project):
            continue
        found = _SHA256.match(fragment)
        if not found:
            raise PageError(f"the link to {filename} has no sha256 (#sha256=<hex>; got {fragment or 'nothing'!r})")
        plan = _SHA256.match(anchor.get(PLAN_ATTRIBUTE, ""))
        links.append(Link(filename, url, found.group(1), plan.group(1) if plan else None))
    return links
