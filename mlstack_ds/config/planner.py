"""One `config` run: the candidate configs, one start of the target for DeepSpeed's estimates and verdicts,
the choice, and the proof that what is written is what DeepSpeed parsed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.config.hardware import Hardware
from mlstack_ds.config.model import ModelShape
from mlstack_ds.config.rules import AMD_SPECIFIC_SECTION, ORDER, Plan, config_for, make_plan
from mlstack_ds.dsconfig.target import TargetAnswer, Validation, ask_target, check_batch_keys
from mlstack_ds.errors import ConfigDoesNotFit, MlstackError


@dataclass(frozen=True)
class Planned:
    plan: Plan
    answer: TargetAnswer
    validation: Validation  # DeepSpeed's verdict on the chosen config (and the --hf round trip)


def plan_config(shape: ModelShape, hardware: Hardware, python: Path, *, micro_batch: int, seq_len: int, hf: bool,
                on_refusal: Callable[[ConfigDoesNotFit], None] = lambda _e: None) -> Planned:
    """Every placement's config goes to the target with the estimate request, so the chosen one has been
    parsed by DeepSpeed in the same start; `on_refusal` sees a refusal before it is raised (--explain)."""
    configs = [config_for(shape, hardware, placement, micro_batch=micro_batch, hf=hf, amd_specific=False)[0]
               for placement in ORDER]
    answer = ask_target(python, params=shape.params, largest_layer_params=shape.largest_layer_params,
                        gpus_per_node=hardware.gpus_per_node, nodes=hardware.nodes, configs=configs,
                        amd_specific_section=AMD_SPECIFIC_SECTION if hardware.platform == "rocm" else None,
                        hf=hf, micro_batch=micro_batch, hidden=shape.hidden)
    try:
        plan = make_plan(shape, hardware, answer.estimates, micro_batch=micro_batch, seq_len=seq_len,
                         amd_specific=answer.amd_specific, hf=hf)
    except ConfigDoesNotFit as refusal:
        on_refusal(refusal)
        raise
    chosen = plan.chosen
    checked = answer.validations[ORDER.index((chosen.stage, chosen.offload_optimizer, chosen.offload_param))]
    if checked.config != plan.config:  # the rules are pure: the same placement gives the same config
        raise MlstackError("the config DeepSpeed parsed is not the one planned",
                           hint="this is a bug in mlstack-ds; rerun with MLSTACK_DEBUG=1 and report it")
    if not checked.ok:
        raise MlstackError(f"DeepSpeed {answer.deepspeed} rejects the planned config at "
                           f"{checked.key or 'an unknown key'}: {checked.message}",
                           hint="this is a bug in mlstack-ds's config rules; please report it with --json")
    check_batch_keys(plan.config, hardware.world_size, "the planned config")
    return Planned(plan, answer, checked)
