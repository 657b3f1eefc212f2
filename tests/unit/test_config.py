"""`mlstack-ds config`'s pure parts: sizes, model shapes, hardware overrides and the choices.

The estimates here are inputs written by hand (round numbers that make one placement fit and not the
next); that they follow DeepSpeed's own estimators is tests/integration/test_config_target.py's job.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mlstack_ds.config import rules
from mlstack_ds.config.hardware import Hardware, plan_hardware
from mlstack_ds.config.model import PRESETS, model_from_dims, model_from_hf_config, resolve_model
from mlstack_ds.config.rules import ORDER, candidate_configs, config_for, make_plan
from mlstack_ds.config.sizes import parse_size
from mlstack_ds.detect.model import GpuAgent
from mlstack_ds.dsconfig.target import Estimate, check_batch_keys
from mlstack_ds.errors import ConfigDoesNotFit, ExitCode, UsageError

GiB = 2**30
REPO = Path(__file__).resolve().parents[2]


def hardware(vram: int = 24 * GiB, ram: int | None = 256 * GiB, gpus: int = 2, arch: str | None = "gfx1100",
             platform: str = "rocm") -> Hardware:
    return Hardware(platform, gpus, 1, vram, ram, arch, "test GPU", ())  # type: ignore[arg-type]


def estimates(gpu: dict[tuple[int, bool, bool], int], cpu: int = 10 * GiB) -> tuple[Estimate, ...]:
    return tuple(Estimate(s, o, p, gpu[(s, o, p)], cpu) for s, o, p in ORDER)


SMALL = PRESETS["350m"]  # activations at micro-batch 1 × 128 tokens are a few MB


# --- sizes ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("24GiB", 24 * GiB), ("16GB", 16 * 10**9), ("512 MiB", 512 * 2**20), ("1.5TiB", int(1.5 * 2**40)),
    ("1000", 1000), ("24gib", 24 * GiB)])
def test_sizes(text: str, expected: int) -> None:
    assert parse_size("--vram", text) == expected


@pytest.mark.parametrize("text", ["0", "-1GiB", "0GB", "abc", "24 parsecs", "", "GiB"])
def test_bad_sizes_are_usage_errors_naming_the_option(text: str) -> None:
    with pytest.raises(UsageError, match="--ram") as caught:
        parse_size("--ram", text)
    assert caught.value.exit_code == ExitCode.USAGE and caught.value.hint


# --- models --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "billions"), [("350m", 0.35), ("1.3b", 1.3), ("6.7b", 6.7), ("13b", 13.0)])
def test_presets_are_the_sizes_they_are_named_for(name: str, billions: float) -> None:
    assert PRESETS[name].params == pytest.approx(billions * 1e9, rel=0.05)


def test_llama_2_7b_config_gives_its_published_parameter_count(tmp_path: Path) -> None:
    # meta-llama/Llama-2-7b-hf's config.json (the shape fields); the model has 6,738,415,616 parameters.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                                "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
                                "max_position_embeddings": 4096}))
    shape = model_from_hf_config(path)
    assert shape.params == pytest.approx(6_738_415_616, rel=0.001)
    assert (shape.hidden, shape.layers, shape.heads) == (4096, 32, 32)


def test_gpt2_config_gives_its_published_parameter_count(tmp_path: Path) -> None:
    # openai-community/gpt2's config.json: 124,439,808 parameters (biases make the 0.2% difference).
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                                "vocab_size": 50257, "n_positions": 1024, "activation_function": "gelu_new"}))
    assert model_from_hf_config(path).params == pytest.approx(124_439_808, rel=0.005)


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not JSON"), ("[1, 2]", "not an object"), ('{"model_type": "llama"}', "no positive hidden"),
    ('{"hidden_size": 0, "num_hidden_layers": 2}', "no positive hidden"), (b"\xff\xfe\x00", "cannot read")])
def test_bad_model_configs_are_usage_errors(tmp_path: Path, content: str | bytes, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UsageError, match=message) as caught:
        resolve_model(str(path), None, None, None)
    assert caught.value.hint


def test_model_arguments() -> None:
    assert resolve_model("13B", None, None, None) is PRESETS["13b"]
    assert model_from_dims(int(7e9), 4096, 32).params == 7_000_000_000
    for args, message in [((None, None, None), "no model given"), ((int(7e9), None, None), "needs --hidden"),
                          ((None, -1, 2), "--hidden -1"), ((None, 8, 0), "--layers 0")]:
        with pytest.raises(UsageError, match=message):
            resolve_model(None, *args)
    with pytest.raises(UsageError, match="not both"):
        resolve_model("13b", None, 4096, 32)
    with pytest.raises(UsageError, match="neither a preset nor an existing file"):
        resolve_model("/nonexistent/config.json", None, None, None)


# --- hardware ------------------------------------------------------------------------------------------

def gpu(vram: int | None = 24 * GiB, arch: str = "gfx1100", vendor: str = "amd") -> GpuAgent:
    return GpuAgent(0, arch, arch, "Radeon RX 7900 XTX", 32, 96, vram, False, 1, vendor=vendor)


def test_hardware_from_detected_gpus_and_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\nMemAvailable:   1000 kB\n")
    found = plan_hardware([gpu(), gpu(20 * GiB)], gpus_per_node=None, nodes=1, vram=None, ram=None, meminfo=meminfo)
    assert (found.platform, found.gpus_per_node, found.vram_bytes, found.ram_bytes, found.arch) == (
        "rocm", 2, 20 * GiB, 65536000 * 1024, "gfx1100")
    assert plan_hardware([gpu()], gpus_per_node=4, nodes=2, vram=16 * GiB, ram=GiB).world_size == 8


def test_host_ram_is_memtotal_read_once_and_says_so(tmp_path: Path) -> None:
    """MemAvailable moves with the load of the moment; the plan takes MemTotal, and says it measured it."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\nMemAvailable:   1000 kB\n")
    measured = plan_hardware([gpu()], gpus_per_node=2, nodes=1, vram=None, ram=None, meminfo=meminfo)
    meminfo.write_text("MemTotal:       1000 kB\n")  # a later read would see this: there is none
    assert measured.ram_bytes == 65536000 * 1024 and measured.ram_measured
    assert measured.source("ram") == f"measured: {meminfo} MemTotal"
    assert (measured.source("vram"), measured.source("arch"), measured.source("platform")) == (
        "detected (the smallest GPU's)", "detected", "detected")
    given = plan_hardware([gpu()], gpus_per_node=2, nodes=1, vram=None, ram=GiB, meminfo=meminfo)
    assert (given.ram_bytes, given.source("ram"), given.ram_measured) == (GiB, "--ram", False)
    unknown = plan_hardware([gpu()], gpus_per_node=2, nodes=1, vram=None, ram=None, meminfo=tmp_path / "absent")
    assert unknown.ram_bytes is None and not unknown.ram_measured and unknown.source("ram").startswith("unknown")


@pytest.mark.parametrize(("gpus", "kwargs", "message"), [
    ([], {}, "no GPU visible"), ([], {"gpus_per_node": 2}, "--vram"), ([gpu(None)], {}, "--vram"),
    ([gpu()], {"gpus_per_node": 0}, "--gpus 0"), ([gpu()], {"nodes": -1}, "--nodes -1")])
def test_hardware_that_cannot_be_planned_for(gpus: list[GpuAgent], kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        plan_hardware(gpus, **{"gpus_per_node": None, "nodes": 1, "vram": None, "ram": GiB, **kwargs})
    assert caught.value.hint


# --- choices -------------------------------------------------------------------------------------------

FITS_ALL = {key: GiB for key in ORDER}


def chosen(gpu_need: dict, **kwargs) -> rules.Plan:
    args = {"micro_batch": 1, "seq_len": 128, "amd_specific": False, "hf": False, **kwargs}
    hw = args.pop("hw", hardware())
    built = candidate_configs(SMALL, hw, micro_batch=args["micro_batch"], hf=args["hf"])
    return make_plan(SMALL, hw, estimates(gpu_need, args.pop("cpu", 10 * GiB)), built, **args)


def test_the_lowest_stage_that_fits_wins() -> None:
    plan = chosen(FITS_ALL)
    zero = plan.config["zero_optimization"]
    assert zero["stage"] == 2 and "offload_optimizer" not in zero
    plan = chosen({**FITS_ALL, (2, False, False): 30 * GiB})
    assert plan.chosen.stage == 3 and not plan.chosen.offload_optimizer
    assert "cheaper placements do not fit: ZeRO-2, no offload needs 30.7 GiB" in plan.choices[0].reason


def test_the_plan_writes_one_of_the_built_candidates_the_very_dict_validated() -> None:
    """Issue 28: what is written is one of the dicts sent to DeepSpeed, picked by key, never a second build
    (a second build once differed: the target added amd_specific and stripped "auto" from its copy)."""
    for hw, amd_variants in ((hardware(), (False, True)), (hardware(platform="cuda"), (False,))):
        built = candidate_configs(SMALL, hw, micro_batch=1, hf=True)
        assert sorted(built) == sorted((p, amd) for p in ORDER for amd in amd_variants)
        for answer_has_section in (False, True):
            plan = make_plan(SMALL, hw, estimates({**FITS_ALL, (2, False, False): 30 * GiB}), built, micro_batch=1,
                             seq_len=128, amd_specific=answer_has_section, hf=True)
            assert plan.key == ((3, False, False), answer_has_section and hw.platform == "rocm")
            assert plan.config is built[plan.key][0]
            assert ("amd_specific" in plan.config) is plan.key[1]


def test_ram_notes_say_when_the_machine_decides() -> None:
    """Measured RAM is flagged; a placement that fits the GPUs but not the RAM is named (1.3B on 2 × 24 GiB
    flips ZeRO-2 → ZeRO-3 between --ram 20GiB and 18GiB on DeepSpeed's 14.7 GiB cold-load estimate)."""
    cold_load = {(2, False, False): int(14.7 * GiB), (3, False, False): int(1.2 * GiB)}  # DeepSpeed's, for 1.3B

    def plan(hw: Hardware) -> rules.Plan:
        found = tuple(Estimate(*p, GiB, cold_load.get(p, 30 * GiB)) for p in ORDER)
        return make_plan(SMALL, hw, found, candidate_configs(SMALL, hw, micro_batch=1, hf=False),
                         micro_batch=1, seq_len=128, amd_specific=False, hf=False)

    measured = plan(Hardware("rocm", 2, 1, 24 * GiB, 18 * GiB, "gfx1100", "RX 7900 XTX",
                             (("ram", "measured: /proc/meminfo MemTotal"),)))
    assert measured.chosen.stage == 3
    assert any("this machine's (measured: /proc/meminfo MemTotal): without --ram the choice depends" in n
               for n in measured.notes)
    assert any(n.startswith("ZeRO-2, no offload fits the GPUs but needs 14.7 GiB host RAM") for n in measured.notes)
    given = plan(hardware(ram=20 * GiB))
    assert given.chosen.stage == 2 and not any("host RAM" in n for n in given.notes)


def test_headroom_is_kept() -> None:
    # 21 GiB of model states on a 24 GiB card: under the card's size, over 85% of it.
    plan = chosen({**FITS_ALL, (2, False, False): 21 * GiB})
    assert plan.chosen.stage == 3
    assert plan.candidates[0].gpu_limit == int(24 * GiB * rules.VRAM_USABLE)


def test_offload_when_nothing_else_fits_and_then_a_refusal_with_numbers() -> None:
    big = 100 * GiB
    plan = chosen({(2, False, False): big, (3, False, False): big, (2, True, False): big, (3, True, False): 5 * GiB,
                   (3, True, True): 2 * GiB})
    zero = plan.config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and "offload_param" not in zero
    with pytest.raises(ConfigDoesNotFit) as caught:
        chosen({key: big for key in ORDER})
    error = caught.value
    assert error.exit_code == ExitCode.DOES_NOT_FIT == 9
    assert "does not fit on 2 × 24.0 GiB" in error.message and "model states 100.0 GiB" in error.message
    assert len(error.details["candidates"]) == len(ORDER) and error.hint


def test_host_ram_limits_offload() -> None:
    only_offload = {key: (2 * GiB if key[1] else 100 * GiB) for key in ORDER}
    with pytest.raises(ConfigDoesNotFit, match=r"fits the GPU but needs 300.0 GiB host RAM, 51.2 GiB usable of 64"):
        chosen(only_offload, cpu=300 * GiB, hw=hardware(ram=64 * GiB))


def test_precision_by_arch() -> None:
    assert chosen(FITS_ALL).config["bf16"] == {"enabled": True}  # gfx1100: RDNA3
    for arch in ("gfx90a", "gfx942"):
        assert "bf16" in chosen(FITS_ALL, hw=hardware(arch=arch)).config
    fp16 = chosen(FITS_ALL, hw=hardware(arch="gfx1030")).config  # RDNA2: no native bf16
    assert "bf16" not in fp16 and fp16["fp16"]["enabled"] is True and fp16["fp16"]["initial_scale_power"] == 14
    cuda = chosen(FITS_ALL, hw=hardware(arch=None, platform="cuda")).config
    assert cuda["fp16"]["initial_scale_power"] == 16


def test_buckets_follow_patch_0013() -> None:
    """The rule and its constants are patch 0013's: read from the shipped patches, not copied by hand."""
    for patch in sorted(REPO.glob("patches/*/0013-*.patch")):
        text = patch.read_text()
        assert re.search(r"ROCM_LARGE_GPU_MEMORY_BYTES = 64 \* 2\*\*30", text), patch
        assert re.search(r"ROCM_SMALL_GPU_BUCKET_SIZE = pp_int\(1e8\)", text), patch
        assert re.search(r"reduce_bucket_size.*allgather_bucket_size.*default to 5e8", text, re.S), patch
    ours = (rules.ROCM_LARGE_GPU_MEMORY_BYTES, rules.ROCM_SMALL_GPU_BUCKET_SIZE, rules.UPSTREAM_BUCKET_SIZE)
    assert ours == (64 * GiB, 100_000_000, 500_000_000)
    zero = chosen(FITS_ALL).config["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 100_000_000
    for hw in (hardware(vram=64 * GiB), hardware(vram=192 * GiB), hardware(platform="cuda", arch=None)):
        assert chosen(FITS_ALL, hw=hw).config["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    assert zero["overlap_comm"] is True and zero["contiguous_gradients"] is True


def test_amd_specific_only_on_patched_rocm_builds() -> None:
    assert chosen(FITS_ALL, amd_specific=True).config["amd_specific"] == {"rocm_stream_priority": True,
                                                                          "rocm_mem_pool_init": True}
    unpatched = chosen(FITS_ALL, amd_specific=False)
    assert "amd_specific" not in unpatched.config
    assert any(c.key == "amd_specific" and "not patched" in c.reason for c in unpatched.choices)
    assert "amd_specific" not in chosen(FITS_ALL, amd_specific=True, hw=hardware(platform="cuda")).config


def test_hf_mode_writes_auto_where_the_trainer_fills_values() -> None:
    def autos(config: dict, prefix: str = "") -> set[str]:
        found = set()
        for key, value in config.items():
            if isinstance(value, dict):
                found |= autos(value, f"{prefix}{key}.")
            elif value == "auto":
                found.add(prefix + key)
        return found

    stage3 = config_for(SMALL, hardware(), (3, True, False), micro_batch=1, hf=True, amd_specific=False)[0]
    assert autos(stage3) == {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
        "bf16.enabled", "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
        "optimizer.params.weight_decay", "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold"}
    plain = config_for(SMALL, hardware(), (3, True, False), micro_batch=4, hf=False, amd_specific=False)[0]
    assert autos(plain) == set()
    assert (plain["train_batch_size"], plain["train_micro_batch_size_per_gpu"]) == (8, 4)


def test_every_choice_has_a_reason() -> None:
    plan = chosen(FITS_ALL, hf=True)
    assert plan.choices and all(c.reason for c in plan.choices)
    assert {"zero_optimization.stage", "bf16.enabled", "zero_optimization.overlap_comm",
            "zero_optimization.contiguous_gradients", "zero_optimization.reduce_bucket_size"} <= {
        c.key for c in plan.choices}


def test_batch_keys_must_multiply_out() -> None:
    check_batch_keys({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1},
                     2, "x")
    check_batch_keys({"train_batch_size": "auto"}, 2, "x")
    with pytest.raises(UsageError, match="train_batch_size 8 is not"):
        check_batch_keys({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
                          "gradient_accumulation_steps": 1}, 4, "x")


# --- verify --config -------------------------------------------------------------------------------------

def test_the_config_check_keeps_the_users_zero_and_precision_and_names_what_it_replaces() -> None:
    from mlstack_ds.worker import training
    from mlstack_ds.worker.config_checks import suite_config

    planned = config_for(PRESETS["6.7b"], hardware(), (3, True, False), micro_batch=1, hf=False, amd_specific=True)[0]
    config, replaced, precision = suite_config(planned)
    assert config["zero_optimization"] == planned["zero_optimization"]  # stage, offload, buckets as given
    assert config["amd_specific"] == planned["amd_specific"] and config["bf16"] == {"enabled": True}
    assert precision == "bf16"
    assert config["train_micro_batch_size_per_gpu"] == training.MICRO_BATCH and "train_batch_size" not in config
    assert config["optimizer"]["params"]["lr"] == training.ADAM["lr"]
    assert set(replaced) == {"train_micro_batch_size_per_gpu", "optimizer", "train_batch_size"}
    hf = config_for(SMALL, hardware(arch="gfx1030"), (2, False, False), micro_batch=1, hf=True, amd_specific=False)[0]
    config, replaced, precision = suite_config(hf, bf16_supported=True)
    assert precision is None and config["fp16"]["enabled"] is False  # "auto" fp16: off (no GPU loss scaler)
    assert config["zero_optimization"]["reduce_bucket_size"] == training.D_MODEL ** 2  # as the Trainer fills it
    assert "train_batch_size" not in config and "gradient_accumulation_steps" in config


def test_the_config_check_needs_a_config(tmp_path: Path) -> None:
    import sys

    from mlstack_ds.launch import launcher
    from mlstack_ds.verify.suite import VerifyOptions, run_verify

    with pytest.raises(UsageError, match="the config check needs --config FILE"):
        run_verify(VerifyOptions(python=Path(sys.executable), only="config"))
    args = launcher.worker_args(["config"], tmp_path, 60, "rid", ds_config=tmp_path / "ds.json")
    assert args[-2:] == ["--ds-config", str(tmp_path / "ds.json")]
