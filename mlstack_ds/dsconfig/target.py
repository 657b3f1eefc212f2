"""DeepSpeed's own answers, asked in the target interpreter: its memory estimators and its config parser.

Why there: the estimators (`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`,
the non-printing functions under the `_all_cold` wrappers) and `DeepSpeedConfig` are DeepSpeed's, of the
version the user will train with; copying their formulas here would drift. The CLI never imports torch
or DeepSpeed, so one small script runs there by path (target_side/mlstack_dsconfig_answers.py, through
the runner), reads a JSON request on stdin and prints one marked JSON line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.detect.marked import UnreadableLine, marked_object
from mlstack_ds.errors import EnvironmentProblem, ToolError, UsageError
from mlstack_ds.patience import WAITS
from mlstack_ds.runner import run
from mlstack_ds.target_side import mlstack_dsconfig_answers as answers_module
from mlstack_ds.target_side import script

MARKER = answers_module.MARKER


@dataclass(frozen=True)
class Estimate:
    """DeepSpeed's estimate of model states for one placement: bytes per GPU and per node (CPU RAM)."""

    stage: int
    offload_optimizer: bool
    offload_param: bool
    gpu: int
    cpu: int


@dataclass(frozen=True)
class Validation:
    ok: bool
    key: str | None = None
    message: str = ""
    hf: str = ""  # what happened to the "auto" values
    filled: dict[str, Any] | None = None  # --hf with transformers: the config after the Trainer filled "auto"


@dataclass(frozen=True)
class TargetAnswer:
    estimates: tuple[Estimate, ...]
    deepspeed: str
    hip: str | None
    amd_specific: bool  # the target's DeepSpeed carries patch 0014 (the amd_specific section)
    transformers: bool
    validations: tuple[Validation, ...]  # one per config sent, in order, each parsed as sent


def _ask(python: Path, request: Mapping[str, Any]) -> dict[str, Any]:
    try:
        result = run([python, script(answers_module)], input_text=json.dumps(request),
                     patience=WAITS["target probe"])  # it imports torch and DeepSpeed: as patient as the probe
    except ToolError as exc:
        raise EnvironmentProblem(f"the target interpreter {python} could not run: {exc.message}",
                                 hint="pass --python with the interpreter that has DeepSpeed") from exc
    try:
        answer = marked_object(result.stdout, MARKER)
    except UnreadableLine:
        answer = None
    if answer is None:
        raise EnvironmentProblem(f"the target interpreter {python} failed: {result.tail(3) or 'no answer'}",
                                 hint="check that DeepSpeed imports there: python -c 'import deepspeed'")
    if "missing" in answer:
        raise EnvironmentProblem(f"DeepSpeed cannot be imported in {python} ({answer['missing']})",
                                 hint="install DeepSpeed there first (mlstack-ds install), or pass --python")
    return answer


def _validation(answer: Mapping[str, Any]) -> Validation:
    return Validation(bool(answer.get("ok")), answer.get("key"), str(answer.get("message", "")),
                      str(answer.get("hf", "")), answer.get("hf_filled"))


def _batch(micro_batch: int, world_size: int) -> dict[str, int]:
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
            "train_batch_size": micro_batch * world_size}


def ask_target(python: Path, *, params: int, largest_layer_params: int, gpus_per_node: int, nodes: int,
               configs: Sequence[Mapping[str, Any]], hf: bool, micro_batch: int, hidden: int) -> TargetAnswer:
    """In one start of the target: DeepSpeed's ZeRO-2/3 model-state estimates with and without CPU offload,
    whether its DeepSpeed has patch 0014's amd_specific section, and its parser's verdict on each of
    `configs` exactly as given (the target adds nothing: the caller sends every variant it may write)."""
    world_size = gpus_per_node * nodes
    answer = _ask(python, {"mode": "plan", "params": params, "largest_layer_params": largest_layer_params,
                           "gpus_per_node": gpus_per_node, "nodes": nodes, "configs": [dict(c) for c in configs],
                           "hf": hf, "micro_batch": micro_batch, "world_size": world_size, "hidden": hidden,
                           "batch": _batch(micro_batch, world_size)})
    rows = tuple(Estimate(int(r["stage"]), bool(r["offload_optimizer"]), bool(r["offload_param"]), int(r["gpu"]),
                          int(r["cpu"])) for r in answer["estimates"])
    return TargetAnswer(rows, str(answer["deepspeed"]), answer.get("hip"), bool(answer["amd_specific"]),
                        bool(answer["transformers"]), tuple(_validation(v) for v in answer["validations"]))


def validate_in_target(python: Path, config: Mapping[str, Any], *, hf: bool = False, micro_batch: int = 1,
                       world_size: int = 1, hidden: int) -> Validation:
    """DeepSpeed's own parser on `config` (with `hf`, after transformers filled the "auto" values for a model
    of `hidden` size)."""
    answer = _ask(python, {"mode": "validate", "config": dict(config), "hf": hf, "micro_batch": micro_batch,
                           "world_size": world_size, "hidden": hidden, "batch": _batch(micro_batch, world_size)})
    return _validation(answer)


def check_batch_keys(config: Mapping[str, Any], world_size: int, source: str) -> None:
    """train_batch_size = micro-batch × gradient accumulation × world size, as DeepSpeed asserts at launch
    (its parser cannot check it without torch.distributed running)."""
    values = [config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                      "gradient_accumulation_steps")]
    if any(v is None or v == "auto" for v in values):
        return
    train, micro, accumulation = values
    if not all(isinstance(v, int) for v in values) or train != micro * accumulation * world_size:
        raise UsageError(f"{source}: train_batch_size {train} is not train_micro_batch_size_per_gpu {micro} × "
                         f"gradient_accumulation_steps {accumulation} × {world_size} ranks",
                         hint="make train_batch_size their product, or leave it out and DeepSpeed computes it")
