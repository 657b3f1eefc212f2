"""The `git` source: a shallow clone of the pinned tag, refused unless it is the pinned commit.

Why check the commit: tags can be moved or re-pushed (or a mirror can be stale); the commit id is the
pin. A local path or `file://` mirror is accepted for air-gapped sites; plain paths are turned into
`file://` URLs because git ignores `--depth` for plain local paths.
"""

from __future__ import annotations

from pathlib import Path

from mlstack_ds.errors import FetchError, ToolMissing, ToolTimedOut
from mlstack_ds.patience import WAITS, Patience
from mlstack_ds.runner import run
from mlstack_ds.source.cache import Cache, publish, short_key
from mlstack_ds.source.gitrepo import git, git_env


def normalize_git_url(url: str) -> str:
    """`/srv/mirror/DeepSpeed.git` -> `file:///srv/mirror/DeepSpeed.git`; URLs pass through."""
    if "://" in url or url.startswith("git@"):
        return url
    path = Path(url).expanduser()
    if not path.exists():
        raise FetchError(f"git mirror {url} does not exist",
                         hint="pass an existing path or a URL to --git-url")
    return path.resolve().as_uri()


def git_cache_entry(cache: Cache, url: str, tag: str, commit: str) -> Path:
    return cache.repo_path(f"git-{short_key(normalize_git_url(url))}-{tag}-{commit[:12]}")


# The clone is the one network git call. It runs through the runner (own process group, killed on
# time-out or Ctrl-C/SIGTERM), with git's own stall
# detection, so a dead connection fails in a minute while a slow but moving clone goes on.
STALL_SETTINGS = ("http.lowSpeedLimit=1000", "http.lowSpeedTime=60")


def clone_pinned_tag(cache: Cache, url: str, tag: str, commit: str,
                     patience: Patience = WAITS["git clone"]) -> Path:
    """Return a cached clone whose HEAD is `commit`, cloning `tag` from `url` on a miss."""
    entry = git_cache_entry(cache, url, tag, commit)
    url = normalize_git_url(url)
    if repo_head(entry) == commit:
        return entry
    with cache.staging_dir("clone") as staging:
        clone = staging / "repo"
        # User git config is kept for the network step (proxies, insteadOf mirrors).
        argv = ["git", *(a for setting in STALL_SETTINGS for a in ("-c", setting)), "clone", "--quiet", "--depth",
                "1", "--branch", tag, "--no-tags", "--", url, str(clone)]
        hint = "check the URL and your network, or use --source pypi / a tarball URL / a local path"
        try:
            result = run(argv, cwd=staging, env=git_env(isolated=False), patience=patience)
        except ToolMissing as exc:
            raise ToolMissing("git: not found", hint="install git (e.g. apt-get install git), or use --source pypi"
                              ) from exc
        except ToolTimedOut as exc:
            raise FetchError(f"git clone of {tag} from {url} did not finish within {patience.ceiling_s:g} s",
                             hint=hint) from exc
        if not result.ok:
            raise FetchError(f"git clone of {tag} from {url} failed: {_git_failure(result.stderr)}", hint=hint)
        found = repo_head(clone)
        if found != commit:
            raise FetchError(
                f"tag moved: {tag} at {url} is commit {found}, but the pin is {commit}",
                hint="the tag was re-pointed or the mirror is wrong; refusing to build unpinned code",
            )
        return publish(clone, entry)


def repo_head(repo_dir: Path) -> str | None:
    """The commit checked out in the repository at `repo_dir`, or None when it is not a usable repo."""
    if not (repo_dir / ".git").exists():  # never fall through to an enclosing repository
        return None
    result = git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=repo_dir, error=FetchError,
                 what="git rev-parse", check=False)
    return result.stdout.strip() if result.ok else None


def _git_failure(stderr: str) -> str:
    """git's own last `fatal:`/`error:` line (a `stderr: '...'` wrapping removed)."""
    text = stderr.strip().removeprefix("stderr:").strip().strip("'").strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    wanted = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    return (wanted or lines or ["no output"])[-1][:300]
