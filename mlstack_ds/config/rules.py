"""The choices, as pure functions of the model, the hardware and DeepSpeed's estimates; each with its reason.

Sources (docs/config.md has the whole table): ZeRO placement from DeepSpeed's own model-state estimators
(asked in the target, `target.py`), plus activations and the ZeRO buckets, against VRAM with headroom;
precision by the GPU target (`gfx.supports_bf16`); bucket sizes by patch 0013's rule; the ROCm loss
scale and the `amd_specific` keys from the AMD guide and patch 0014.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlstack_ds import gfx
from mlstack_ds.config.hardware import Hardware
from mlstack_ds.config.model import ModelShape
from mlstack_ds.config.sizes import gib
from mlstack_ds.dsconfig.target import Estimate
from mlstack_ds.errors import ConfigDoesNotFit

# Patch 0013 (patches/*/0013-zero-config-smaller-default-buckets-on-ROCm-GPUs-under-64-GiB.patch):
# ROCm GPUs under 64 GiB get 1e8-element buckets, larger ones keep upstream's 5e8. The patch's own
# constants live in DeepSpeed's source, not importable here; tests/unit/test_config.py reads the patch
# and holds these equal to ROCM_LARGE_GPU_MEMORY_BYTES and ROCM_SMALL_GPU_BUCKET_SIZE.
ROCM_LARGE_GPU_MEMORY_BYTES = 64 * 2**30
ROCM_SMALL_GPU_BUCKET_SIZE = 100_000_000
UPSTREAM_BUCKET_SIZE = 500_000_000

# Headroom: what the estimates leave out (the HIP/CUDA context, the caching allocator's fragmentation,
# kernels' workspaces) is kept free: plans use 85% of VRAM and 80% of host RAM.
VRAM_USABLE = 0.85
RAM_USABLE = 0.80
# Activations of one GPT layer in 16-bit training, bytes per (token × hidden): 34 (Korthikanti et al.
# 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1 without the 5·a·s/h term
# of the s×s attention scores, which torch's SDPA flash/memory-efficient kernels do not keep).
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34
# Logits per token and vocabulary entry: 16-bit logits, their fp32 upcast for the loss, and its gradient.
LOGIT_BYTES = 2 + 4 + 4
ROCM_FP16_INITIAL_SCALE_POWER = 14  # the AMD guide: 2**14, not DeepSpeed's 2**16, avoids early overflow skips

# The placements tried, cheapest first: ZeRO-2, ZeRO-3, then the optimizer offloaded, then parameters too.
Placement = tuple[int, bool, bool]  # (ZeRO stage, offload optimizer, offload parameters)
ORDER: tuple[Placement, ...] = ((2, False, False), (3, False, False), (2, True, False), (3, True, False),
                                (3, True, True))
# A candidate config: its placement and whether it carries patch 0014's amd_specific section.
CandidateKey = tuple[Placement, bool]
Built = Mapping[CandidateKey, tuple[dict[str, Any], list["Choice"]]]


@dataclass(frozen=True)
class Choice:
    key: str
    value: Any
    reason: str


@dataclass(frozen=True)
class Candidate:
    """One placement's needs against what is there."""

    stage: int
    offload_optimizer: bool
    offload_param: bool
    model_states: int  # DeepSpeed's estimate, per GPU
    activations: int
    buckets: int
    cpu: int  # DeepSpeed's estimate, per node
    gpu_limit: int
    ram_limit: int | None

    @property
    def gpu(self) -> int:
        return self.model_states + self.activations + self.buckets

    @property
    def fits_gpu(self) -> bool:
        return self.gpu <= self.gpu_limit

    @property
    def fits_ram(self) -> bool:
        return self.ram_limit is None or self.cpu <= self.ram_limit

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_ram

    @property
    def label(self) -> str:
        offload = ("optimizer and parameters offloaded" if self.offload_param
                   else "optimizer offloaded" if self.offload_optimizer else "no offload")
        return f"ZeRO-{self.stage}, {offload}"

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "offload_optimizer": self.offload_optimizer, "offload_param": self.offload_param,
                "gpu_bytes": self.gpu, "model_states_bytes": self.model_states, "activation_bytes": self.activations,
                "bucket_bytes": self.buckets, "cpu_bytes": self.cpu, "gpu_limit_bytes": self.gpu_limit,
                "ram_limit_bytes": self.ram_limit, "fits": self.fits}


@dataclass(frozen=True)
class Plan:
    config: dict[str, Any]
    choices: tuple[Choice, ...]
    candidates: tuple[Candidate, ...]
    chosen: Candidate
    key: CandidateKey  # which of the built candidates `config` is (the one DeepSpeed validated)
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "choices": [c.__dict__ for c in self.choices],
                "candidates": [c.to_dict() for c in self.candidates], "notes": list(self.notes)}


def activation_bytes(model: ModelShape, micro_batch: int, seq_len: int) -> int:
    """Activations kept for backward on one GPU (ZeRO does not partition them)."""
    tokens = micro_batch * seq_len
    return tokens * model.hidden * model.layers * ACTIVATION_BYTES_PER_TOKEN_HIDDEN + tokens * model.vocab * LOGIT_BYTES


def bucket_size(hardware: Hardware) -> tuple[int, str]:
    """Patch 0013's rule: 1e8 elements on ROCm GPUs under 64 GiB, else upstream's 5e8."""
    if hardware.platform == "rocm" and hardware.vram_bytes < ROCM_LARGE_GPU_MEMORY_BYTES:
        return ROCM_SMALL_GPU_BUCKET_SIZE, (
            f"ROCm GPU with {gib(hardware.vram_bytes)} (< 64 GiB): 1e8-element buckets, patch 0013's rule; "
            "upstream's 5e8 costs several GB with overlap_comm")
    why = "a GPU with 64 GiB or more" if hardware.platform == "rocm" else f"{hardware.platform}, not ROCm"
    return UPSTREAM_BUCKET_SIZE, f"{why}: DeepSpeed's default 5e8-element buckets (patch 0013's rule keeps them)"


def bucket_bytes(stage: int, reduce_bucket: int, other_bucket: int) -> int:
    """16-bit bucket buffers alive at once with overlap_comm: the reduce bucket double-buffered, plus the
    all-gather (ZeRO-2) or prefetch (ZeRO-3) bucket (patch 0014's zero_bucket_reservation_bytes)."""
    del stage  # same shape for both stages; kept for the reader
    return 2 * (2 * reduce_bucket + other_bucket)


def candidates(model: ModelShape, hardware: Hardware, estimates: tuple[Estimate, ...], *, micro_batch: int,
               seq_len: int, buckets: tuple[int, int]) -> tuple[Candidate, ...]:
    """Every placement of ORDER with its needs; `buckets` is (reduce, all-gather/prefetch) in elements."""
    by_key = {(e.stage, e.offload_optimizer, e.offload_param): e for e in estimates}
    activations = activation_bytes(model, micro_batch, seq_len)
    gpu_limit = int(hardware.vram_bytes * VRAM_USABLE)
    ram_limit = int(hardware.ram_bytes * RAM_USABLE) if hardware.ram_bytes else None
    return tuple(Candidate(stage, opt, par, by_key[(stage, opt, par)].gpu, activations,
                           bucket_bytes(stage, *buckets), by_key[(stage, opt, par)].cpu, gpu_limit, ram_limit)
                 for stage, opt, par in ORDER)


def choose_placement(model: ModelShape, hardware: Hardware, found: tuple[Candidate, ...]) -> tuple[Candidate, str]:
    """The first placement of ORDER that fits with headroom, and why; a ConfigDoesNotFit with the numbers."""
    for index, candidate in enumerate(found):
        if candidate.fits:
            skipped = "; ".join(f"{c.label} needs {gib(c.gpu)} per GPU" + ("" if c.fits_ram else
                                f" and {gib(c.cpu)} RAM") for c in found[:index])
            why = (f"{candidate.label}: {gib(candidate.gpu)} per GPU (model states {gib(candidate.model_states)} by "
                   f"DeepSpeed's estimator, activations {gib(candidate.activations)}, buckets "
                   f"{gib(candidate.buckets)}) within {gib(candidate.gpu_limit)} "
                   f"({int(VRAM_USABLE * 100)}% of {gib(hardware.vram_bytes)})")
            if candidate.offload_optimizer:
                why += f", {gib(candidate.cpu)} host RAM within {gib(candidate.ram_limit or 0)}"
            return candidate, why + (f"; cheaper placements do not fit: {skipped}" if skipped else "")
    smallest = min(found, key=lambda c: c.gpu)
    ram = "unknown" if hardware.ram_bytes is None else gib(hardware.ram_bytes)
    reasons = []
    if not smallest.fits_gpu:
        reasons.append(f"needs {gib(smallest.gpu)} per GPU even with {smallest.label} (model states "
                       f"{gib(smallest.model_states)}, activations {gib(smallest.activations)}, buckets "
                       f"{gib(smallest.buckets)}), {gib(smallest.gpu_limit)} usable of {gib(hardware.vram_bytes)}")
    fitting_gpu = [c for c in found if c.fits_gpu]
    if fitting_gpu:
        least_ram = min(fitting_gpu, key=lambda c: c.cpu)
        reasons.append(f"{least_ram.label} fits the GPU but needs {gib(least_ram.cpu)} host RAM, "
                       f"{gib(least_ram.ram_limit or 0)} usable of {ram}")
    raise ConfigDoesNotFit(
        f"{model.name} ({model.params / 1e9:.2f}B parameters) does not fit on {hardware.world_size} × "
        f"{gib(hardware.vram_bytes)} GPU(s) with {ram} RAM per node: " + "; ".join(reasons),
        hint="more GPUs (--gpus, --nodes), a smaller --micro-batch or --seq-len, or more host RAM; "
             "NVMe offload (ZeRO-Infinity) is not planned by this command",
        details={"candidates": [c.to_dict() for c in found]})


def precision(hardware: Hardware) -> tuple[str, dict[str, Any], str]:
    """bf16 where the target computes it natively; else fp16 with the ROCm loss-scale advice."""
    if hardware.arch and gfx.supports_bf16(hardware.arch):
        family = gfx.lookup(hardware.arch).family
        return "bf16", {"enabled": True}, (f"{hardware.arch} ({family}) computes bf16 natively: fp32's range, "
                                           "no loss scaling, no overflow-skipped steps")
    what = f"{hardware.arch} ({gfx.lookup(hardware.arch).family}) has no native bf16" if hardware.arch \
        else "the GPU target is unknown, and fp16 runs on every GPU"
    section: dict[str, Any] = {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2,
                               "min_loss_scale": 1}
    if hardware.platform == "rocm":
        section["initial_scale_power"] = ROCM_FP16_INITIAL_SCALE_POWER
        return "fp16", section, (f"{what}: fp16 with dynamic loss scaling, starting at 2**14 (the AMD guide's "
                                 "ROCm advice; DeepSpeed's 2**16 overflows and skips the first steps)")
    section["initial_scale_power"] = 16
    return "fp16", section, f"{what}: fp16 with DeepSpeed's dynamic loss scaling"


AMD_SPECIFIC_SECTION: dict[str, Any] = {"rocm_stream_priority": True, "rocm_mem_pool_init": True}


def candidate_configs(model: ModelShape, hardware: Hardware, *, micro_batch: int, hf: bool) -> Built:
    """Every config the plan can write, built once by `config_for`: each placement, and on ROCm each with and
    without the amd_specific section (whether the target has patch 0014 is known only once it answers).
    The target validates these very dicts and `make_plan` picks one of them: what is written is what
    DeepSpeed parsed by construction, not by comparing two builds."""
    sections = (False, True) if hardware.platform == "rocm" else (False,)
    return {(placement, section): config_for(model, hardware, placement, micro_batch=micro_batch, hf=hf,
                                             amd_specific=section)
            for placement in ORDER for section in sections}


def make_plan(model: ModelShape, hardware: Hardware, estimates: tuple[Estimate, ...], built: Built, *,
              micro_batch: int, seq_len: int, amd_specific: bool, hf: bool) -> Plan:
    """The config and its reasons, one of `built` (candidate_configs); `amd_specific`: the target's DeepSpeed
    has patch 0014's section."""
    found = candidates(model, hardware, estimates, micro_batch=micro_batch, seq_len=seq_len,
                       buckets=planned_buckets(model, hardware, hf))
    chosen, placement_why = choose_placement(model, hardware, found)
    key: CandidateKey = ((chosen.stage, chosen.offload_optimizer, chosen.offload_param),
                         amd_specific and hardware.platform == "rocm")
    config, choices = built[key]
    notes = (f"activations assume no gradient checkpointing: {gib(chosen.activations)} at micro-batch "
             f"{micro_batch} × {seq_len} tokens; checkpointing keeps only each layer's input",
             *ram_notes(hardware, found))
    return Plan(config, (Choice("zero_optimization.stage", chosen.stage, placement_why), *choices), found, chosen,
                key, notes)


def ram_notes(hardware: Hardware, found: tuple[Candidate, ...]) -> tuple[str, ...]:
    """Where host RAM decides the choice: it is the one input that flips ZeRO-2/ZeRO-3 between machines
    (DeepSpeed's estimate counts each rank's cold fp32 copy per node even without offload)."""
    notes = []
    if hardware.ram_bytes is None:
        notes.append("host RAM is unknown: placements are not checked against it; pass --ram SIZE")
    elif hardware.ram_measured:
        notes.append(f"host RAM {gib(hardware.ram_bytes)} is this machine's ({hardware.source('ram')}): without "
                     "--ram the choice depends on the machine config runs on; pass --ram SIZE for the one that "
                     "trains")
    for candidate in found:
        if candidate.fits:
            break
        if candidate.fits_gpu:
            notes.append(f"{candidate.label} fits the GPUs but needs {gib(candidate.cpu)} host RAM per node, over "
                         f"{gib(candidate.ram_limit or 0)} usable ({int(RAM_USABLE * 100)}% of "
                         f"{gib(hardware.ram_bytes or 0)}): with more RAM it would be chosen")
    return tuple(notes)


def planned_buckets(model: ModelShape, hardware: Hardware, hf: bool) -> tuple[int, int]:
    """(reduce, all-gather/prefetch) bucket elements: patch 0013's rule, or with --hf what the Trainer's
    "auto" fills from the hidden size (trainer_config_finalize: hidden², 0.9 × hidden²)."""
    if hf:
        return model.hidden * model.hidden, int(0.9 * model.hidden * model.hidden)
    bucket, _ = bucket_size(hardware)
    return bucket, bucket


def config_for(model: ModelShape, hardware: Hardware, placement: tuple[int, bool, bool], *, micro_batch: int,
               hf: bool, amd_specific: bool) -> tuple[dict[str, Any], list[Choice]]:
    """The config of one placement (stage, offload optimizer, offload parameters), with its reasons: the
    CLI has DeepSpeed parse every placement's config in the same target start that estimates them."""
    stage, offload_optimizer, offload_param = placement
    bucket, bucket_why = bucket_size(hardware)
    choices: list[Choice] = []
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        choices.append(Choice("zero_optimization.offload_optimizer.device", "cpu",
                              "the optimizer states (12 bytes/parameter) do not fit next to the model: DeepSpeed's "
                              "CPU Adam steps them in host RAM; pinned for faster copies"))
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        choices.append(Choice("zero_optimization.offload_param.device", "cpu",
                              "even the 16-bit parameters' partition does not fit: ZeRO-3 keeps them in host RAM "
                              "and gathers one layer at a time"))
    choices.append(Choice("zero_optimization.overlap_comm", True,
                          "overlaps gradient reduction with the backward pass; its cost, the double-buffered "
                          "reduce bucket, is in the bucket estimate"))
    choices.append(Choice("zero_optimization.contiguous_gradients", True,
                          "copies gradients into one contiguous buffer as they are produced: no fragmentation "
                          "of VRAM during backward"))
    if hf:
        zero["reduce_bucket_size"] = "auto"
        choices.append(Choice("zero_optimization.reduce_bucket_size", "auto",
                              "--hf: the Trainer fills hidden_size² (trainer_config_finalize)"))
    else:
        zero["reduce_bucket_size"] = bucket
        choices.append(Choice("zero_optimization.reduce_bucket_size", bucket, bucket_why))
    if stage == 2:
        zero["allgather_bucket_size"] = bucket
        choices.append(Choice("zero_optimization.allgather_bucket_size", bucket, bucket_why))
    else:
        auto_or = (lambda value: "auto" if hf else value)  # noqa: E731 one rule for the three ZeRO-3 keys
        zero["stage3_prefetch_bucket_size"] = auto_or(bucket)
        zero["stage3_param_persistence_threshold"] = auto_or(10 * model.hidden)
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        choices.append(Choice("zero_optimization.stage3_prefetch_bucket_size", zero["stage3_prefetch_bucket_size"],
                              "--hf: the Trainer fills 0.9 × hidden_size²" if hf else bucket_why))
        choices.append(Choice("zero_optimization.stage3_param_persistence_threshold",
                              zero["stage3_param_persistence_threshold"],
                              "--hf: the Trainer fills 10 × hidden_size" if hf else
                              "10 × hidden size (the Trainer's rule): biases and norms stay whole on every GPU "
                              "instead of being gathered each step"))
        choices.append(Choice("zero_optimization.stage3_gather_16bit_weights_on_model_save", True,
                              "saving gathers the partitioned weights into one 16-bit state dict "
                              "(save_pretrained/save_16bit_model give a usable checkpoint)"))

    name, section, precision_why = precision(hardware)
    if hf:
        section = {**section, "enabled": "auto"}
        precision_why += "; --hf: enabled is \"auto\", the Trainer's --bf16/--fp16 decides"
    choices.append(Choice(f"{name}.enabled", section["enabled"], precision_why))

    config: dict[str, Any] = {}
    world = hardware.world_size
    if hf:
        config.update({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                       "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"})
        choices.append(Choice("train_micro_batch_size_per_gpu", "auto",
                              f"--hf: the Trainer fills the batch keys (planned for --micro-batch {micro_batch})"))
    else:
        config.update({"train_batch_size": micro_batch * world, "train_micro_batch_size_per_gpu": micro_batch,
                       "gradient_accumulation_steps": 1, "gradient_clipping": 1.0})
        choices.append(Choice("train_micro_batch_size_per_gpu", micro_batch,
                              f"--micro-batch; train_batch_size = {micro_batch} × 1 step × {world} ranks"))
    config[name] = section
    config["optimizer"] = {"type": "AdamW", "params": (
        {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"} if hf
        else {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01})}
    optimizer_why = "the estimators assume Adam's states (12 bytes/parameter); " + (
        "with offload DeepSpeed runs it as CPU Adam" if offload_optimizer else "ZeRO partitions them")
    optimizer_why += "; --hf: its params are \"auto\", the Trainer's" if hf else "; set lr and the rest for your run"
    choices.append(Choice("optimizer.type", "AdamW", optimizer_why))
    config["zero_optimization"] = zero

    if hardware.platform == "rocm" and amd_specific:
        config["amd_specific"] = dict(AMD_SPECIFIC_SECTION)
        choices.append(Choice("amd_specific", config["amd_specific"],
                              "the target's DeepSpeed has patch 0014: ZeRO's communication streams at the highest "
                              "priority, the bucket memory reserved at start instead of mid-step"))
    elif hardware.platform == "rocm":
        choices.append(Choice("amd_specific", None, "left out: the target's DeepSpeed is not patched (no patch "
                              "0014), and an unpatched DeepSpeed ignores the section silently"))
    return config, choices
