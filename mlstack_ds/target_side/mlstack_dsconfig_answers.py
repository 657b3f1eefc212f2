"""DeepSpeed's own answers, in the *target* interpreter: `python mlstack_dsconfig_answers.py < REQUEST`.

The request (JSON on stdin) says what to ask: "plan" for DeepSpeed's ZeRO-2/3 estimators for every placement
the config planner considers and its parser's verdict on each config sent, "validate" for one config
(with "hf": after transformers' HfTrainerDeepSpeedConfig filled the "auto" values). The answer is one
`MLSTACK_CONFIG_JSON:` line; dsconfig/target.py asks and reads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

MARKER = "MLSTACK_CONFIG_JSON:"


def answer(doc: dict[str, Any]) -> None:
    print(MARKER + json.dumps(doc, default=str))
    sys.stdout.flush()


def key_path(config: Any, name: str, prefix: str = "") -> str | None:
    """The dotted path of `name` inside `config` (DeepSpeed's errors name a field, not its section)."""
    if isinstance(config, dict):
        if name in config:
            return prefix + name
        for key, value in config.items():
            found = key_path(value, name, prefix + key + ".")
            if found:
                return found
    return None


def describe(exc: BaseException, config: dict[str, Any]) -> dict[str, Any]:
    """The key a rejection is about and DeepSpeed's message: pydantic's first error when it has one, else the
    first word of the message that is a key of the config."""
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
    return {"key": key, "message": f"{type(exc).__name__}: {text}"}


def estimate(req: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed's model-state estimates, with and without CPU offload, and what the target has."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
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
    import deepspeed
    import torch
    return {"estimates": rows, "deepspeed": deepspeed.__version__, "hip": getattr(torch.version, "hip", None),
            "amd_specific": importlib.util.find_spec("deepspeed.runtime.amd_specific") is not None,
            "transformers": importlib.util.find_spec("transformers") is not None}


def hf_round_trip(config: dict[str, Any], req: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """transformers' own handling of "auto": HfTrainerDeepSpeedConfig fills from TrainingArguments-like
    values, then finalizes with the model's hidden size; what comes out must have no "auto" left."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
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


def _walk(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _walk(value, prefix + key + ".")
        else:
            yield prefix + key, value


def parse(config: dict[str, Any]) -> None:
    """DeepSpeed's parser on `config`; raises what DeepSpeed raises."""
    from deepspeed.runtime.config import DeepSpeedConfig
    # Without torch.distributed, DeepSpeedConfig takes world size 1: check the batch keys ourselves and
    # let DeepSpeed derive train_batch_size from the per-GPU ones.
    local = {k: v for k, v in config.items() if k != "train_batch_size"}
    DeepSpeedConfig(local)


def validate(req: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed's verdict on one config, as sent (with "hf", after transformers filled its "auto" values)."""
    result: dict[str, Any] = {"ok": True}
    try:
        if req.get("hf"):
            if importlib.util.find_spec("transformers") is None:
                result["hf"] = "transformers is not installed in the target: the \"auto\" values were not " \
                               "round-tripped"
                filled = json.loads(json.dumps(config))  # a deep copy: replace_auto edits nested sections
                for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
                    filled[key] = req["batch"][key]
                replace_auto(filled)
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


def replace_auto(config: dict[str, Any]) -> None:
    """Without transformers: auto values stand in as DeepSpeed's defaults, so the rest is still parsed."""
    for key, value in list(config.items()):
        if isinstance(value, dict):
            replace_auto(value)
            if not value:
                config.pop(key)
        elif value == "auto":
            config.pop(key)


def plan(req: dict[str, Any]) -> dict[str, Any]:
    """Estimates, and DeepSpeed's verdict on every config sent, as sent, in one start (imports take seconds)."""
    doc = estimate(req)
    doc["validations"] = [validate(req, c) for c in req["configs"]]
    return doc


def search_like_python_c() -> None:
    """Run by path, Python puts this file's directory first on sys.path; `python -c` (how this script ran
    before) puts the current directory there. Kept so: what `import deepspeed` finds must not depend on
    how the script was started."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main() -> int:
    search_like_python_c()
    # Parsing and estimating need no device: the CPU accelerator keeps DeepSpeed from probing GPUs.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    req = json.loads(sys.stdin.read())
    try:
        answer(plan(req) if req["mode"] == "plan" else validate(req, req["config"]))
    except ImportError as exc:
        answer({"missing": str(exc)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
