"""One `config` run: the candidate configs, one start of the target for DeepSpeed's estimates and verdicts,
the choice, and the inputs it was made from.

What is written is what DeepSpeed parsed by construction: every config the plan may write is built once
(`rules.candidate_configs`), those dicts are what the target validates, and the plan picks one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.config.hardware import Hardware
from mlstack_ds.config.model import ModelShape
from mlstack_ds.config.rules import Plan, candidate_configs, make_plan
from mlstack_ds.dsconfig.target import TargetAnswer, Validation, ask_target, check_batch_keys
from mlstack_ds.errors import ConfigDoesNotFit, MlstackError


@dataclass(frozen=True)
class Planned:
    plan: Plan
    answer: TargetAnswer
    validation: Validation  # DeepSpeed's verdict on the chosen config (and the --hf round trip)
    inputs: dict[str, Any]  # everything the choice was made from, each with where it came from


def plan_inputs(hardware: Hardware, *, micro_batch: int, seq_len: int, hf: bool,
                answer: TargetAnswer | None = None) -> dict[str, Any]:
    """The facts the plan used: the same inputs give the same config. Host RAM measured on this machine
    (no --ram) is flagged, since the choice can flip with it (ZeRO-2 needs each rank's fp32 copy in RAM)."""
    def fact(value: Any, name: str) -> dict[str, Any]:
        return {"value": value, "source": hardware.source(name)}

    inputs: dict[str, Any] = {
        "gpus_per_node": fact(hardware.gpus_per_node, "gpus_per_node"), "nodes": fact(hardware.nodes, "nodes"),
        "vram_bytes": fact(hardware.vram_bytes, "vram"), "ram_bytes": fact(hardware.ram_bytes, "ram"),
        "ram_measured": hardware.ram_measured, "platform": fact(hardware.platform, "platform"),
        "arch": fact(hardware.arch, "arch"), "micro_batch": micro_batch, "seq_len": seq_len, "hf": hf}
    if answer is not None:
        inputs["amd_specific"] = {"value": answer.amd_specific and hardware.platform == "rocm",
                                  "source": f"the target's DeepSpeed {answer.deepspeed} "
                                            f"{'has' if answer.amd_specific else 'has no'} patch 0014"}
    return inputs


def plan_config(shape: ModelShape, hardware: Hardware, python: Path, *, micro_batch: int, seq_len: int, hf: bool,
                on_refusal: Callable[[ConfigDoesNotFit], None] = lambda _e: None) -> Planned:
    """Every candidate config goes to the target with the estimate request, so the chosen one has been
    parsed by DeepSpeed in the same start; `on_refusal` sees a refusal before it is raised (--explain)."""
    built = candidate_configs(shape, hardware, micro_batch=micro_batch, hf=hf)
    keys = tuple(built)
    answer = ask_target(python, params=shape.params, largest_layer_params=shape.largest_layer_params,
                        gpus_per_node=hardware.gpus_per_node, nodes=hardware.nodes,
                        configs=[built[key][0] for key in keys], hf=hf, micro_batch=micro_batch, hidden=shape.hidden)
    inputs = plan_inputs(hardware, micro_batch=micro_batch, seq_len=seq_len, hf=hf, answer=answer)
    try:
        plan = make_plan(shape, hardware, answer.estimates, built, micro_batch=micro_batch, seq_len=seq_len,
                         amd_specific=answer.amd_specific, hf=hf)
    except ConfigDoesNotFit as refusal:
        refusal.details["inputs"] = inputs
        on_refusal(refusal)
        raise
    checked = answer.validations[keys.index(plan.key)]  # plan.config is built[plan.key][0]: the dict validated
    if not checked.ok:
        raise MlstackError(f"DeepSpeed {answer.deepspeed} rejects the planned config at "
                           f"{checked.key or 'an unknown key'}: {checked.message}",
                           hint="this is a bug in mlstack-ds's config rules; please report it with --json")
    check_batch_keys(plan.config, hardware.world_size, "the planned config")
    return Planned(plan, answer, checked, inputs)
