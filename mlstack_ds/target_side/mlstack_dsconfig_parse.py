"""A DeepSpeed config file parsed as DeepSpeed parses it, in the *target* interpreter:
`python mlstack_dsconfig_parse.py FILE`.

hjson with DeepSpeed's duplicate-key hook (dsconfig/read.py says why there); the answer is one
`MLSTACK_DSCONFIG_JSON:` line: `{"hjson": false}` without hjson, else the config or hjson's error.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from typing import Any

MARKER = "MLSTACK_DSCONFIG_JSON:"


def dict_raise_error_on_duplicate_keys(ordered_pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """DeepSpeed 0.19.5's runtime/config_utils.py hook, verbatim in behaviour and message."""
    d = dict(ordered_pairs)
    if len(d) != len(ordered_pairs):
        counter = collections.Counter([pair[0] for pair in ordered_pairs])
        keys = [key for key, value in counter.items() if value > 1]
        raise ValueError(f"Duplicate keys in DeepSpeed config: {keys}")
    return d


def parse(path: str) -> dict[str, Any]:
    """The marked answer's document for the config file at `path`."""
    try:
        import hjson
    except ImportError:
        return {"hjson": False}
    try:
        with open(path) as stream:
            config = hjson.load(stream, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    except Exception as exc:
        return {"hjson": True, "error": f"{type(exc).__name__}: {exc}"}
    return {"hjson": True, "config": config}


def search_like_python_c() -> None:
    """Run by path, Python puts this file's directory first on sys.path; `python -c` (how this script ran
    before) puts the current directory there. Kept so: what `import hjson` finds must not depend on how the
    script was started."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main(argv: list[str]) -> int:
    search_like_python_c()
    print(MARKER + json.dumps(parse(argv[0]), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
