"""What the scripts share: the repository's paths, and this checkout's `mlstack_ds` and the tests' support
package (`support`: target venvs, the two-host harness, the torch and DeepSpeed pins) importable.

A script imports it before those (`from _repo import REPO`): Python puts scripts/ first on sys.path when
it runs a script there, so this module is found without any path set-up of the script's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

for _path in (TESTS, REPO):  # REPO first: the checkout's mlstack_ds before any installed copy
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
