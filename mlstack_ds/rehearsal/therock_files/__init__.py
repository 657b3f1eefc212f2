"""Files of the TheRock stand-in venv (rehearsal/therock.py), kept as real modules so ruff and the tests read them:
each is copied into the fake venv under the name TheRock's wheels give it, and reads what differs per venv
(versions, targets) from `_standin.json` beside it, which the stand-in writes. Nothing here is imported by the tool."""

from __future__ import annotations

from pathlib import Path

STANDIN_DIR = Path(__file__).parent
VALUES_FILE = "_standin.json"
