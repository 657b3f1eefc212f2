"""Train a 2-stage DeepSpeed PipelineModule with and without activation checkpointing; write each rank's losses.

Launched by torch.distributed.run with 2 processes, DeepSpeed imported from a source tree (PYTHONPATH),
DS_ACCELERATOR=cpu, gloo. The same model, data and seed train for 3 batches with
`activation_checkpoint_interval` 0, then 1 (every layer with parameters goes through
deepspeed.checkpointing.checkpoint). Each rank writes `{"0": losses, "1": losses}` (where a
run that raised is `{"error", "where"}` instead) into `<results dir>/rank<RANK>.json` (argv[1]): one file per
rank, because both ranks share torchrun's stdout and two prints can land on one line (seen in CI:
`RESULT {...}RESULT {...}`). A rank that failed exits at once so that torchrun stops the other. The only
thing changed in DeepSpeed is that its CPU shm comm op is marked incompatible, so the comm backend uses plain
gloo instead of JIT-building the op (minutes).
"""

import json
import os
import sys
import traceback
from pathlib import Path

import deepspeed
import torch
from deepspeed.pipe import PipelineModule

CONFIG = {
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "steps_per_print": 1000,
}
BATCHES = 3


def train(interval):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)]
    module = PipelineModule(layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform",
                            activation_checkpoint_interval=interval)
    engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=CONFIG)
    generator = torch.Generator().manual_seed(1)
    micro_batches = iter([(torch.randn(1, 8, generator=generator), torch.randn(1, 4, generator=generator))
                          for _ in range(BATCHES * CONFIG["gradient_accumulation_steps"])])
    return [engine.train_batch(data_iter=micro_batches).item() for _ in range(BATCHES)]


deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo")
results = {}
for interval in (0, 1):
    try:
        results[str(interval)] = train(interval)
    except Exception as exc:  # the probe reports whatever DeepSpeed raised
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        results[str(interval)] = {"error": f"{type(exc).__name__}: {exc}",
                                  "where": f"{frame.filename.rsplit('/deepspeed/', 1)[-1]}:{frame.lineno}"}
        break
result_file = Path(sys.argv[1]) / f"rank{os.environ['RANK']}.json"
result_file.with_suffix(".tmp").write_text(json.dumps(results))
result_file.with_suffix(".tmp").replace(result_file)  # the test never reads half a file
if any("error" in r for r in results.values() if isinstance(r, dict)):
    os._exit(1)
# The script ends right after train_batch's collectives: a gloo worker thread can still be waiting for the
# GIL when the interpreter finalizes, and the rank aborts with `terminate called without an active exception`
# (docs/abort-at-exit.md). destroy_process_group() alone did not prevent it: it aborted so once under load
# (rank 0, SIGABRT, with it) - the discarded pipeline engines keep their groups' workers alive until
# finalization's GC. So the rank leaves without finalization, its result written.
torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
