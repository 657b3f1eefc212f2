"""DeepSpeed's own answers, asked in the target interpreter: its memory estimators and its config parser.

Why there: the estimators (`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`,
the non-printing functions under the `_all_cold` wrappers) and `DeepSpeedConfig` are DeepSpeed's, of the
version the user will train with; copying their formulas here would drift. The CLI never imports torch
or DeepSpeed, so one small script runs there (through the runner), reads a JSON request on stdin and
prints one marked JSON line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.detect.marked import UnreadableLine, marked_object
from mlstack_ds.detect.target_probe import PROBE_CEILING_S, PROBE_STALL_S
from mlstack_ds.errors import EnvironmentProblem, ToolError, UsageError
from mlstack_ds.runner import run

MARKER = "MLSTACK_CONFIG_JSON:"

# Runs in the target interpreter. "estimate": DeepSpeed's estimators for every placement we consider;
# "validate": DeepSpeedConfig (and, for --hf, transformers' HfTrainerDeepSpeedConfig) on the config.
SCRIPT = r'''
import importlib.util, json, os, sys, tempfile
MARKER = "MLSTACK_CONFIG_JSON:"
# Parsing and estimating need no device: the CPU accelerator keeps DeepSpeed from probing GPUs.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

def answer(doc):
    print(MARKER + json.dumps(doc, default=str))
    sys.stdout.flush()

def key_path(config, name, prefix=""):
    """The dotted path of `name` inside `config` (DeepSpeed's errors name a field, not its section)."""
    if isinstance(config, dict):
        if name in config:
            return prefix + name
        for key, value in config.items():
            found = key_path(value, name, prefix + key + ".")
            if found:
                return found
    return None

def describe(exc, config):
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            loc = [str(p) for p in first.get("loc", ())]
            path = key_path(config, loc[0]) if loc else None
            if path and len(loc) > 1:
                path = path + "." + ".".join(loc[1:])
            return {"key": path or ".".join(loc), "message": first.get("msg", str(exc))}
        except Exception:
            pass
    text = " ".join(str(exc).split()) or type(exc).__name__
    key = None
    for word in text.replace("'", " ").replace('"', " ").replace(":", " ").split():
        key = key_path(config, word)
        if key:
            break
    return {"key": key, "message": "%s: %s" % (type(exc).__name__, text)}

def estimate(req):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
    p, big, g, n = req["params"], req["largest_layer_params"], req["gpus_per_node"], req["nodes"]
    rows = []
    for offload in (False, True):
        cpu, gpu = z2(total_params=p, num_gpus_per_node=g, num_nodes=n, cpu_offload=offload)
        rows.append({"stage": 2, "offload_optimizer": offload, "offload_param": False, "gpu": gpu, "cpu": cpu})
    for offload, offload_param in ((False, False), (True, False), (True, True)):
        cpu, gpu, _ = z3(total_params=p, largest_layer_params=big, num_gpus_per_node=g, num_nodes=n,
                         cpu_offload=offload, cpu_offload_params=offload_param, zero_init=True)
        rows.append({"stage": 3, "offload_optimizer": offload, "offload_param": offload_param, "gpu": gpu,
                     "cpu": cpu})
    import deepspeed, torch
    return {"estimates": rows, "deepspeed": deepspeed.__version__, "hip": getattr(torch.version, "hip", None),
            "amd_specific": importlib.util.find_spec("deepspeed.runtime.amd_specific") is not None,
            "transformers": importlib.util.find_spec("transformers") is not None}

def hf_round_trip(config, req):
    """transformers' own handling of "auto": HfTrainerDeepSpeedConfig fills from TrainingArguments-like
    values, then finalizes with the model's hidden size; what comes out must have no "auto" left."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    from transformers import TrainingArguments
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    with tempfile.TemporaryDirectory() as out:
        # use_cpu: the planning host may have no GPU, and TrainingArguments refuses bf16/fp16 without one.
        args = TrainingArguments(output_dir=out, use_cpu=True, per_device_train_batch_size=req["micro_batch"],
                                 bf16="bf16" in config, fp16="fp16" in config, report_to=[])
    hf.trainer_config_process(args)
    class Hidden:  # a model's config, as trainer_config_finalize reads it
        hidden_size = req["hidden"]
    class Model:
        config = Hidden()
    hf.trainer_config_finalize(args, Model(), num_training_steps=100)
    filled = hf.config
    left = [k for k, v in _walk(filled) if v == "auto"]
    return filled, left

def _walk(config, prefix=""):
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _walk(value, prefix + key + ".")
        else:
            yield prefix + key, value

def parse(config):
    from deepspeed.runtime.config import DeepSpeedConfig
    # Without torch.distributed, DeepSpeedConfig takes world size 1: check the batch keys ourselves and
    # let DeepSpeed derive train_batch_size from the per-GPU ones.
    local = {k: v for k, v in config.items() if k != "train_batch_size"}
    DeepSpeedConfig(local)

def validate(req, config):
    result = {"ok": True}
    try:
        if req.get("hf"):
            if importlib.util.find_spec("transformers") is None:
                result["hf"] = "transformers is not installed in the target: the \"auto\" values were not " \
                               "round-tripped"
                filled = json.loads(json.dumps(config))  # a deep copy: _replace_auto edits nested sections
                for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
                    filled[key] = req["batch"][key]
                _replace_auto(filled)
            else:
                filled, left = hf_round_trip(config, req)
                result["hf"] = "round-tripped through transformers' HfTrainerDeepSpeedConfig"
                result["hf_filled"] = filled
                if left:
                    return {"ok": False, "key": left[0], "message": "transformers left \"auto\" unfilled"}
            parse(filled)
        else:
            parse(config)
    except BaseException as exc:
        return {"ok": False, **describe(exc, config)}
    return result

def _replace_auto(config):
    """Without transformers: auto values stand in as DeepSpeed's defaults, so the rest is still parsed."""
    for key, value in list(config.items()):
        if isinstance(value, dict):
            _replace_auto(value)
            if not value:
                config.pop(key)
        elif value == "auto":
            config.pop(key)

def plan(req):
    """Estimates, and DeepSpeed's verdict on every config sent, as sent, in one start (imports take seconds)."""
    doc = estimate(req)
    doc["validations"] = [validate(req, c) for c in req["configs"]]
    return doc

req = json.loads(sys.stdin.read())
try:
    answer(plan(req) if req["mode"] == "plan" else validate(req, req["config"]))
except ImportError as exc:
    answer({"missing": str(exc)})
'''


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
        result = run([python, "-c", SCRIPT], input_text=json.dumps(request), timeout=PROBE_CEILING_S,
                     stall_s=PROBE_STALL_S)  # it imports torch and DeepSpeed: as patient as the probe
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
