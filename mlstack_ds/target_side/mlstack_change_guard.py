"""The import guard of a change in progress: while pip replaces DeepSpeed's files, `import deepspeed` (and its
submodules) in the target fails with a message that says who is changing it and how to repair.

installed/journal.py writes one `.pth` line into the target's site-packages: site.py executes lines that start
with `import`, at every start of the target, where mlstack_ds cannot be imported. So the line carries this
file's text and one call, `import sys; exec(TEXT + "guard(MESSAGE, sys.meta_path)")`. Nothing else changes.
"""

from __future__ import annotations


def guard(message: str, meta_path: list[object]) -> None:
    """Put first on `meta_path` a finder that refuses `deepspeed` and its submodules with `message`. Everything
    it needs comes in as arguments: run by exec from a `.pth` line, this function sees site.py's globals."""

    class MlstackDsChangeInProgress:
        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> None:
            if name == "deepspeed" or name.startswith("deepspeed."):
                raise ImportError(message, name=name)

    meta_path.insert(0, MlstackDsChangeInProgress)
