"""What a bench run measures: the model's shape, the stages, the world sizes and the step counts.

The models are GPT-like decoders: `tiny` is sized for a CPU run of a few minutes on 2 cores (many
moderate layers and a small vocabulary, so ZeRO-3 gathers one layer at a time and model states, not the
embedding, dominate memory); the other sizes are `config`'s presets (the AMD guide's four sizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.config.model import PRESETS
from mlstack_ds.errors import UsageError
from mlstack_ds.patience import BENCH_TIMEOUT_S

STAGES = ("ddp", "0", "1", "2", "3")
DEFAULT_STAGES = ("ddp", "0", "2", "3")


@dataclass(frozen=True)
class BenchModel:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int


TINY = BenchModel("tiny", layers=8, hidden=384, heads=6, vocab=4096)
MODELS: dict[str, BenchModel] = {"tiny": TINY, **{
    name: BenchModel(name, shape.layers, shape.hidden, shape.heads, shape.vocab) for name, shape in PRESETS.items()}}
# Per-model defaults: the guide's sizes at its sequence length, `tiny` at what 2 CPU cores finish quickly.
DEFAULT_SEQ_LEN = {"tiny": 64}
GUIDE_SEQ_LEN = 1024
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class BenchSpec:
    model: BenchModel
    stages: tuple[str, ...]
    world_sizes: tuple[int, ...]  # () with a hostfile: the hostfile's slots decide
    steps: int
    warmup: int
    micro_batch: int
    seq_len: int
    precision: str = "auto"
    config: Path | None = None
    config_json: str | None = None  # the --config file as DeepSpeed read it (hjson allowed), as JSON
    memory_cap: int = 0  # bytes per rank; 0: none
    hostfile: Path | None = None
    timeout_s: float = BENCH_TIMEOUT_S
    slurm: bool = False  # `--slurm`: the allocation's nodes, ranks started by srun
    node_counts: tuple[int, ...] = ()  # `--nodes 1,2` with --slurm: the first N nodes of the allocation each

    def to_json(self) -> dict[str, object]:
        return {"model": self.model.__dict__, "stages": list(self.stages), "world_sizes": list(self.world_sizes),
                "steps": self.steps, "warmup": self.warmup, "micro_batch": self.micro_batch, "seq_len": self.seq_len,
                "precision": self.precision, "config": str(self.config) if self.config else None,
                "memory_cap_bytes": self.memory_cap or None,
                "hostfile": str(self.hostfile) if self.hostfile else None, "slurm": self.slurm,
                "nodes": list(self.node_counts)}


def parse_model(name: str) -> BenchModel:
    model = MODELS.get(name.lower())
    if model is None:
        raise UsageError(f"--model {name!r}: not a bench model", hint=f"choose one of {', '.join(MODELS)}")
    return model


def parse_precision(text: str) -> str:
    if text not in PRECISIONS:
        raise UsageError(f"--precision {text!r}: not a precision", hint="auto, fp32, bf16 or fp16")
    return text


def default_seq_len(model: BenchModel) -> int:
    """Tokens per sequence when --seq-len is not given: short for tiny, the guide's for the others."""
    return DEFAULT_SEQ_LEN.get(model.name, GUIDE_SEQ_LEN)


def parse_stages(text: str) -> tuple[str, ...]:
    """`ddp,0,2,3` (also `zero2`, `z3`): in the given order, each once."""
    stages: list[str] = []
    for raw in (part.strip().lower() for part in text.split(",")):
        stage = raw.removeprefix("zero").removeprefix("z") if raw not in ("ddp", "") else raw
        if stage not in STAGES:
            raise UsageError(f"--stages {text!r}: {raw or 'an empty entry'} is not a stage",
                             hint="stages are ddp (plain DistributedDataParallel) and the ZeRO stages 0, 1, 2, 3, "
                             "e.g. --stages ddp,0,2,3")
        if stage not in stages:
            stages.append(stage)
    return tuple(stages)


def parse_world_sizes(text: str | None) -> tuple[int, ...]:
    """`2`, or `1,2,4` for a scaling run; each a positive whole number."""
    if text is None:
        return ()
    sizes: list[int] = []
    for part in text.split(","):
        try:
            size = int(part.strip())
        except ValueError:
            raise UsageError(f"--world-size {text!r}: {part.strip() or 'an empty entry'} is not a whole number",
                             hint="e.g. --world-size 2, or --world-size 1,2 to measure scaling") from None
        if size < 1:
            raise UsageError(f"--world-size {text!r}: {size} ranks cannot train",
                             hint="every world size is at least 1, e.g. --world-size 1,2")
        if size not in sizes:
            sizes.append(size)
    return tuple(sorted(sizes))


def positive(option: str, value: int, *, zero_ok: bool = False) -> int:
    if value < 0 or (value == 0 and not zero_ok):
        bound = "zero or more" if zero_ok else "at least 1"
        raise UsageError(f"{option} {value}: must be {bound}", hint=f"e.g. {option} {0 if zero_ok else 2}")
    return value


def positive_seconds(option: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{option} {value:g}: must be a positive number of seconds", hint=f"e.g. {option} 600")
    return value


def parse_node_counts(text: str | None, slurm: bool) -> tuple[int, ...]:
    """`--nodes 1,2` (with --slurm): node counts for a scaling run across the allocation, ascending."""
    if text is None:
        return ()
    if not slurm:
        raise UsageError("--nodes needs --slurm", hint="inside an allocation: bench --slurm --nodes 1,2")
    counts: list[int] = []
    for part in text.split(","):
        try:
            count = int(part.strip())
        except ValueError:
            raise UsageError(f"--nodes {text!r}: {part.strip() or 'an empty entry'} is not a whole number",
                             hint="e.g. --nodes 1,2") from None
        if count < 1:
            raise UsageError(f"--nodes {text!r}: {count} nodes cannot train", hint="e.g. --nodes 1,2")
        if count not in counts:
            counts.append(count)
    return tuple(sorted(counts))
