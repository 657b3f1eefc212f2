"""A compiler killed in the middle of a cold build (issue 28's load runs): three builds on one host, each
planned for the memory free when it began, together ran it out, and the kernel's OOM killer took cc1plus
from one of them ('c++: fatal error: Killed signal terminated program cc1plus'). The build now goes again
one compile at a time, keeping what it had compiled, and makes the same wheel.

Real: the DeepSpeed 0.19.5 sdist, the product's `build` with a site recipe of one small CPU op (shm_comm: two
files, which compile at once), g++ and ninja, ccache off so that every compile runs. What the OOM killer does is
done here by the test: SIGKILL to the first cc1plus of this build (exactly the kernel's action; running
this machine out of memory would hit the other tests too).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import zipfile
from pathlib import Path

from support.cli import run_cli

from mlstack_ds.recipe import find_recipe

SMALL_OPS = ("deepspeed_shm_comm",)  # the CPU platform's quickest op to compile
LEFT_OUT = ("cpu_adam", "fused_adam", "async_io", "pin_memory")


def two_op_recipe(site: Path) -> Path:
    """The shipped 0.19.5 recipe with only SMALL_OPS built on the CPU platform (like `--recipe FILE`)."""
    shipped = find_recipe()
    head, cpu = shipped.path.read_text().split("[platforms.cpu.ops]", 1)
    for op in LEFT_OUT:
        cpu, replaced = re.subn(rf"^({op} = {{.*?build = )true", r"\1false", cpu, count=1, flags=re.M)
        assert replaced == 1, op
    recipe = site / "recipes" / "site.toml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(head + "[platforms.cpu.ops]" + cpu)
    (site / "patches").symlink_to(shipped.path.resolve().parent.parent / "patches")
    return recipe


class CompilerKiller(threading.Thread):
    """SIGKILLs the first cc1plus working under `root` (its working directory is the build's tree)."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = str(root)
        self.killed: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and not self.killed:
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    if (entry / "comm").read_text().strip() != "cc1plus":
                        continue
                    if not os.readlink(entry / "cwd").startswith(self.root):
                        continue
                    os.kill(int(entry.name), signal.SIGKILL)
                except (OSError, ValueError):
                    continue
                self.killed.append(int(entry.name))
                return
            time.sleep(0.05)


def test_a_compiler_killed_for_memory_is_built_again_one_at_a_time(deepspeed_sdist: Path, tmp_path: Path) -> None:
    recipe = two_op_recipe(tmp_path / "site")
    cache = tmp_path / "cache"
    killer = CompilerKiller(cache)
    killer.start()
    try:
        result = run_cli("build", "--json", "--recipe", recipe, "--source", deepspeed_sdist,
                         "--python", sys.executable, "--cache-dir", cache, env={"CCACHE_DISABLE": "1"},
                         timeout=1800)
    finally:
        killer.stop.set()
        killer.join()
    assert killer.killed, f"no cc1plus of this build was seen: {result.stderr[-2000:]}"
    assert result.returncode == 0, result.stderr[-3000:]
    assert "its compiler was killed, most likely by the kernel for want of memory" in result.stderr
    assert "Killed signal terminated program cc1plus" in result.stderr
    assert "building again one compile at a time" in result.stderr
    first_logs = [p for p in (cache / "logs").glob("build-*.ops/*.log") if "one-at-a-time" not in p.parent.name]
    assert any("Killed signal terminated program cc1plus" in p.read_text() for p in first_logs)
    with zipfile.ZipFile(result.json["wheel"]) as wheel:
        built = {Path(name).name.split(".")[0] for name in wheel.namelist() if name.endswith(".so")}
    assert built == {f"{op}_op" for op in SMALL_OPS}, built
