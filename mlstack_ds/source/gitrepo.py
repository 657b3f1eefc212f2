"""Running git for the fetch and patch stages, isolated from the user's git configuration.

Why isolated: the tree hash and commit ids we promise to reproduce depend on line-ending conversion,
hooks, signing and identity. Local operations therefore ignore the global and system git config and
use a fixed identity and date; only network operations (clone) keep the user's config, so proxies and
`insteadOf` mirrors still work.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlstack_ds.errors import MlstackError
from mlstack_ds.patience import WAITS
from mlstack_ds.runner import RunResult, run

# One fixed identity and date for every commit the tool makes (import commits and patch commits).
FIXED_IDENTITY: Mapping[str, str] = {
    "GIT_AUTHOR_NAME": "mlstack-ds",
    "GIT_AUTHOR_EMAIL": "mlstack-ds@invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "mlstack-ds",
    "GIT_COMMITTER_EMAIL": "mlstack-ds@invalid",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# Settings that would otherwise change bytes, run user code, or prompt.
_LOCAL_CONFIG = (
    "core.autocrlf=false", "core.safecrlf=false", "core.fileMode=true", "core.symlinks=true",
    "commit.gpgsign=false", "tag.gpgsign=false", "core.hooksPath=/dev/null", "advice.detachedHead=false",
    "init.defaultBranch=main", "gc.auto=0", "i18n.commitEncoding=UTF-8", "core.precomposeUnicode=false",
)
PRISTINE_REF = "refs/mlstack-ds/pristine"
WORK_BRANCH = "mlstack-ds"


def git_env(extra: Mapping[str, str] | None = None, isolated: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"LC_ALL": "C", "LANGUAGE": "C", "GIT_TERMINAL_PROMPT": "0"})
    if isolated:
        env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
        env.update(FIXED_IDENTITY)
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    if extra:
        env.update(extra)
    return env


def git(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path,
    error: type[MlstackError],
    what: str,
    hint: str = "",
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> RunResult:
    """Run `git -c ... <args>` in `cwd`; on failure (when `check`) raise `error` saying `what` failed."""
    argv: list[str | os.PathLike[str]] = ["git"]
    for setting in _LOCAL_CONFIG:
        argv += ["-c", setting]
    argv += list(args)
    result = run(argv, cwd=cwd, env=git_env(env), patience=WAITS["git"])
    if check and not result.ok:
        detail = result.tail(3).replace("\n", " | ")
        raise error(f"{what} failed: {detail}", hint=hint)
    return result


def rev_parse(repo: Path, rev: str, error: type[MlstackError]) -> str:
    return git(["rev-parse", "--verify", "--quiet", rev], cwd=repo, error=error,
               what=f"git rev-parse {rev} in {repo}").stdout.strip()


def is_git_worktree(path: Path) -> bool:
    """True when `path` is the top of a git working tree (not merely inside one)."""
    return (path / ".git").exists()


def import_tree(tree: Path, message: str, error: type[MlstackError]) -> str:
    """Turn a plain directory into a git repo with one commit of everything in it; return the commit.

    Ignore rules are bypassed (`add -f`): an sdist's own `.gitignore` must not drop shipped files.
    """
    git(["init", "-q"], cwd=tree, error=error, what="git init")
    git(["add", "-A", "-f", "."], cwd=tree, error=error, what="git add")
    git(["commit", "-q", "--no-verify", "-m", message], cwd=tree, error=error, what="git commit")
    return rev_parse(tree, "HEAD", error)
