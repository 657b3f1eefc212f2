"""The verify worker: one rank of the check suite, run inside the *target* interpreter.

Self-contained on purpose: this package imports only the standard library, torch and deepspeed (never
the rest of mlstack_ds, and only relative imports inside), because the target environment need not have the
tool installed. The tool copies the package into the launch's directory as `mlstack_verify_worker` and
starts it with `-m` under a standard launcher (`python -m torch.distributed.run ... -m
mlstack_verify_worker --checks a,b --out DIR`, or DeepSpeed's launcher with `--module`).

Layout: `protocol` (what a rank writes, faults for tests), `context` (imports, process group, receipt),
`training` (the model and the paired DeepSpeed/torch run), one module per family of checks, `registry`
(the check table, in run order; the tool reads it too), `__main__` (one rank's run).
"""
