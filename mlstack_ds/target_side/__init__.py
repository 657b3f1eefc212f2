"""Python that runs where mlstack_ds is not importable: in the target interpreter, or on a node.

Why files and not strings: such code used to live in string literals (`python -c SCRIPT`), out of reach of
ruff, the layer test and unit tests (issue 42). Each module here is a script of its own, standard library
only and importing nothing of mlstack_ds (tests/unit/test_layers.py holds it to that): the tool runs it by
path (`[python, script(module), ARGS]`), or sends its text (`source(module)`) where it must travel over
ssh's stdin, and tests import it in-process. Every file name starts with `mlstack_`: a script run by path
puts this directory first on sys.path, where a `json.py` or `torch.py` would shadow the real one.
Importing a module here runs nothing (each acts only under `__main__`), so the tool imports them for
their markers and paths.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def script(module: ModuleType) -> Path:
    """The file to run as `[python, script(module), ARGS...]` in another interpreter."""
    if not module.__file__:
        raise ValueError(f"{module.__name__} has no file to run")
    return Path(module.__file__)


def source(module: ModuleType) -> str:
    """The module's text, for `python -` on a node (a here-document inside an `sh -s` script)."""
    return script(module).read_text(encoding="utf-8")


# Linux reads at most this much of a `#!` line (BINPRM_BUF_SIZE 128, with its newline).
SHEBANG_MAX = 127


def runnable_copy(module: ModuleType, path: Path, python: str) -> Path | None:
    """`module` written to `path` with `python` as its `#!` line, executable: for a tool that runs it by name
    (torch runs `ninja`, ccache its prefix command). None where `python` cannot be a `#!` line (too long, or
    with a space in it), and the caller goes on without."""
    shebang = f"#!{python}\n"
    if len(shebang) > SHEBANG_MAX or any(c.isspace() for c in python):
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(shebang + script(module).read_text(encoding="utf-8"), encoding="utf-8")
    path.chmod(0o755)
    return path
