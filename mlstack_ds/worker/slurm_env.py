"""One Slurm task as one torch rank: `python -m mlstack_verify_worker.slurm_env MODULE ARGS...`.

`srun` starts one task per rank (the tool's `--slurm` launch, mlstack_ds/launch/srun.py); torch and
DeepSpeed read their rank from RANK/WORLD_SIZE/LOCAL_RANK, which Slurm does not set. This maps a task's
SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (and this node's share of SLURM_STEP_TASKS_PER_NODE) onto them and
execs `python -m MODULE ARGS` in the same process (Slurm keeps tracking, signalling and killing it).
MASTER_ADDR/MASTER_PORT come from the tool, which picked the allocation's first node and a port. In Python,
not in `sh -c`: no quoting of arguments, and the same code wherever the target interpreter is.
"""

import os
import re
import sys


def tasks_on_node(spec, node_index):
    """SLURM_STEP_TASKS_PER_NODE (`2(x3),1`) -> the count of node `node_index`; None when unreadable."""
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node_index] if 0 <= node_index < len(counts) else None


def rank_env(env):
    """The torch rank variables of this task, from its SLURM_* variables (KeyError if not in a step)."""
    node = int(env.get("SLURM_NODEID", "0"))
    local_world = tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")), node)
    mapped = {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"], "LOCAL_RANK": env["SLURM_LOCALID"],
              "NODE_RANK": str(node), "GROUP_RANK": str(node)}
    if local_world is not None:
        mapped["LOCAL_WORLD_SIZE"] = str(local_world)
    return mapped


def main(argv):
    if not argv:
        sys.stderr.write("mlstack_verify_worker.slurm_env: usage: MODULE [ARGS...]\n")
        return 2
    try:
        os.environ.update(rank_env(os.environ))
    except KeyError as missing:
        sys.stderr.write(f"mlstack_verify_worker.slurm_env: {missing.args[0]} is not set: not a Slurm task\n")
        return 2
    os.execv(sys.executable, [sys.executable, "-m", *argv])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
