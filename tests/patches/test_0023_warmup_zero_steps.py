"""Patch 0023: WarmupLR, WarmupDecayLR and WarmupCosineLR accept `warmup_num_steps: 0` again, as until 0.19.2.

Since 0.19.3 (upstream PR #8126) the three schedulers refuse 0 with `ValueError: warmup_num_steps must be a
positive integer, got 0`, and transformers 5.17 fills the DeepSpeed guide's `"warmup_num_steps": "auto"` with
`warmup_steps`, 0 by default, so such a run stops in `deepspeed.initialize`. Until 0.19.2 they raised 0 to
two warm-up steps, max(2, n), as 0.19.3+ still does for the 1 that transformers 5.18+ passes; patched, 0 means
that again, so the same config trains the same with either transformers. One probe per tree makes
DeepSpeed's real schedulers on a torch optimizer (the learning rate each optimizer step runs at: the one set
when the scheduler is made, then the one after each `step()`), and runs `deepspeed.initialize` plus three
steps (CPU accelerator, one process, gloo, torch's AdamW: nothing is built) with the scheduler section as
transformers 5.17 writes it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

from mlstack_ds.launch.launcher import free_port

STEPS = 8  # step() calls per scheduler; the decaying schedulers run over TOTAL steps
TOTAL = 8
MAX_LR = 1e-3  # WarmupLR/WarmupDecayLR's warmup_max_lr (warmup_min_lr is 0)
OPTIMIZER_LR = 0.1  # the optimizer's lr, which WarmupCosineLR scales
COS_MIN_RATIO = 1e-4
ENGINE_LR = 5e-5  # transformers' default learning_rate, which it writes as warmup_max_lr
ENGINE_TOTAL = 4
PRISTINE_ERROR = "ValueError: warmup_num_steps must be a positive integer, got 0"

PROBE = """
import json, os, sys
import deepspeed, torch
from deepspeed.runtime.lr_schedules import WarmupCosineLR, WarmupDecayLR, WarmupLR

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # plain gloo, no JIT build of the shm op
steps, total, max_lr, optimizer_lr, cos_min_ratio, engine_lr, engine_total = json.loads(sys.argv[1])
KWARGS = {"WarmupLR": dict(warmup_min_lr=0.0, warmup_max_lr=max_lr),
          "WarmupDecayLR": dict(total_num_steps=total, warmup_min_lr=0.0, warmup_max_lr=max_lr),
          "WarmupCosineLR": dict(total_num_steps=total, cos_min_ratio=cos_min_ratio)}
CLASSES = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR}

def error(exc):
    return f"{type(exc).__name__}: {exc}"

schedulers = {}
for name, cls in CLASSES.items():
    for warmup, warmup_type in [(0, "log"), (0, "linear"), (1, "log"), (1, "linear"), (10, "log"), (-1, "log"),
                                (2.5, "log")]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optimizer_lr)
        key = f"{name} {warmup} {warmup_type}"
        try:
            scheduler = cls(optimizer, warmup_num_steps=warmup, warmup_type=warmup_type, **KWARGS[name])
        except Exception as exc:  # the outcome under test, reported as data
            schedulers[key] = {"error": error(exc)}
            continue
        lrs = [optimizer.param_groups[0]["lr"]]  # what the first optimizer step runs at
        for _ in range(steps):
            scheduler.step()
            lrs.append(optimizer.param_groups[0]["lr"])
        schedulers[key] = {"lrs": lrs}

# The guide's sections as transformers 5.17 fills them with the default TrainingArguments (warmup_steps=0).
SECTIONS = {"WarmupLR": {"warmup_min_lr": 0, "warmup_max_lr": engine_lr, "warmup_num_steps": 0},
            "WarmupCosineLR": {"total_num_steps": engine_total, "warmup_num_steps": 0}}
engine_results = {}
for name, params in SECTIONS.items():
    config = {"train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": engine_lr, "torch_adam": True}},
              "scheduler": {"type": name, "params": params}}
    model = torch.nn.Linear(4, 4)
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except Exception as exc:
        engine_results[name] = {"error": error(exc)}
        continue
    lrs = []
    for _ in range(3):
        lrs.append(engine.get_lr()[0])  # the lr this optimizer step runs at
        engine.backward(engine(torch.randn(1, 4)).sum())
        engine.step()
    engine_results[name] = {"lrs": lrs}

print("RESULT " + json.dumps({"schedulers": schedulers, "engine": engine_results}), flush=True)
# Leave without interpreter teardown: a gloo worker thread can abort it (probes/amd_specific_probe.py).
os._exit(0)
"""


@pytest.fixture(scope="module")
def results(ds_tree: tuple[str, Path]) -> tuple[str, dict[str, dict]]:
    kind, tree = ds_tree
    arguments = [STEPS, TOTAL, MAX_LR, OPTIMIZER_LR, COS_MIN_RATIO, ENGINE_LR, ENGINE_TOTAL]
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    result = run_python_in_tree(tree, "-c", PROBE, json.dumps(arguments), env=env)
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULT "))
    return kind, json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("name", ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"])
@pytest.mark.parametrize("warmup_type", ["log", "linear"])
def test_zero_steps_schedule_like_one_as_before_0_19_3(results, name, warmup_type):
    kind, found = results
    zero, one = found["schedulers"][f"{name} 0 {warmup_type}"], found["schedulers"][f"{name} 1 {warmup_type}"]
    assert "lrs" in one, one
    if kind == "pristine":  # the bug: 0 is refused
        assert zero == {"error": PRISTINE_ERROR}
    else:
        assert zero == one


def test_zero_steps_warm_up_over_two_steps_from_min_lr(results):
    """WarmupLR (log) with 0, patched: warmup_min_lr (0) for the first two optimizer steps, then max_lr."""
    kind, found = results
    if kind == "pristine":
        pytest.skip("0 is refused there (test_zero_steps_schedule_like_one_as_before_0_19_3)")
    assert found["schedulers"]["WarmupLR 0 log"] == {"lrs": [0.0, 0.0] + [MAX_LR] * (STEPS - 1)}


@pytest.mark.parametrize("name", ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"])
@pytest.mark.parametrize("bad", [-1, 2.5])
def test_negative_and_non_integer_steps_are_refused_on_every_tree(results, name, bad):
    kind, found = results
    error = found["schedulers"][f"{name} {bad} log"]["error"]
    if kind == "pristine":
        assert error == f"ValueError: warmup_num_steps must be a positive integer, got {bad}"
    else:
        assert error == f"ValueError: warmup_num_steps must be a non-negative integer, got {bad}"


def test_a_real_warm_up_is_unchanged(results):
    """10 log warm-up steps: warmup_min_lr (0) for the first optimizer step, then log(k)/log(10) of max_lr."""
    _, found = results
    expected = [0.0] + [MAX_LR * min(1.0, math.log(k) / math.log(10)) for k in range(1, STEPS + 1)]
    assert found["schedulers"]["WarmupLR 10 log"]["lrs"] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert "error" not in found["schedulers"]["WarmupDecayLR 10 log"]
    assert found["schedulers"]["WarmupCosineLR 10 log"]["lrs"][0] == 0.0  # before step(): 0, as in 0.19.5


@pytest.mark.parametrize("name", ["WarmupLR", "WarmupCosineLR"])
def test_deepspeed_initialize_with_the_transformers_section(results, name):
    kind, found = results
    result = found["engine"][name]
    if kind == "pristine":  # what every transformers 5.17 user of the guide's section gets
        assert result == {"error": PRISTINE_ERROR}
    elif name == "WarmupLR":  # two steps at warmup_min_lr, as transformers 5.18+ gets with max(1, 0)
        assert result == {"lrs": [0.0, 0.0, ENGINE_LR]}
    else:
        assert "lrs" in result and result["lrs"][0] == 0.0 and result["lrs"][2] > 0.0, result
