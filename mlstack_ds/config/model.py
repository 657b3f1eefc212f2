"""The model being trained, as the numbers the memory estimates need: parameters, the largest layer,
and the shapes the activation estimate uses.

A preset, a local Hugging Face `config.json` (read, never downloaded), or `--params/--hidden/--layers`.
Parameter counts are computed from shapes, not from instantiating the model: the CLI never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.errors import UsageError

GPT2_VOCAB = 50272  # OPT's vocabulary (GPT-2's 50257, padded to a multiple of 8)
GPT_POSITIONS = 2048


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need. `largest_layer_params` is DeepSpeed's `largest_layer_params` (the biggest
    single module's own parameters: ZeRO-3 gathers one module at a time)."""

    name: str
    params: int
    largest_layer_params: int
    hidden: int
    layers: int
    heads: int
    vocab: int
    source: str  # how it was given: "preset", a config.json path, or "--params/--hidden/--layers"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def gpt_params(layers: int, hidden: int, vocab: int = GPT2_VOCAB, positions: int = GPT_POSITIONS) -> int:
    """A GPT/OPT decoder: 12·h² + 13·h per layer (attention 4h², MLP 8h², biases and norms), tied token
    embeddings and learned positions, and the final norm."""
    return layers * (12 * hidden * hidden + 13 * hidden) + (vocab + positions) * hidden + 2 * hidden


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    return ModelShape(name, gpt_params(layers, hidden), max(GPT2_VOCAB * hidden, 4 * hidden * hidden), hidden,
                      layers, heads, GPT2_VOCAB, "preset")


# The AMD guide's four sizes, with the GPT-3 paper's / OPT's shapes (layers, hidden, heads).
PRESETS: dict[str, ModelShape] = {
    "350m": _gpt("350m", 24, 1024, 16),
    "1.3b": _gpt("1.3b", 24, 2048, 32),
    "6.7b": _gpt("6.7b", 32, 4096, 32),
    "13b": _gpt("13b", 40, 5120, 40),
}

# Hugging Face configs name the same things differently per architecture; the first key present wins.
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_FFN = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
_GATED_ACTIVATIONS = ("silu", "swiglu", "geglu", "gelu_pytorch_tanh_gated")
_LEARNED_POSITIONS = ("gpt2", "opt", "gpt_neo", "biogpt")


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def model_from_hf_config(path: Path) -> ModelShape:
    """Shapes from a local `config.json`; unreadable, non-JSON or shapeless files are UsageErrors."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"model config {path}: cannot read it ({reason})",
                         hint="pass a preset (350m, 1.3b, 6.7b, 13b) or a readable Hugging Face config.json") from exc
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"model config {path}: not JSON ({exc.msg} at line {exc.lineno})",
                         hint="pass the model's config.json (the file next to its weights)") from exc
    if not isinstance(config, dict):
        raise UsageError(f"model config {path}: the top level is not an object",
                         hint="pass the model's config.json (the file next to its weights)")
    config = {**config.get("text_config", {}), **config} if isinstance(config.get("text_config"), dict) else config
    hidden, layers = _first_int(config, _HIDDEN), _first_int(config, _LAYERS)
    if not hidden or not layers or hidden <= 0 or layers <= 0:
        raise UsageError(f"model config {path}: no positive hidden size and layer count "
                         f"(looked for {'/'.join(_HIDDEN)} and {'/'.join(_LAYERS)})",
                         hint="pass --params, --hidden and --layers for this model instead")
    heads = _first_int(config, _HEADS) or max(1, hidden // 64)
    vocab = _first_int(config, ("vocab_size",)) or GPT2_VOCAB
    ffn = _first_int(config, _FFN) or 4 * hidden
    kv_heads = _first_int(config, ("num_key_value_heads",)) or heads
    head_dim = _first_int(config, ("head_dim",)) or hidden // heads
    gated = str(config.get("hidden_act", config.get("activation_function", ""))) in _GATED_ACTIVATIONS
    attention = hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim
    mlp = (3 if gated else 2) * hidden * ffn
    tied = bool(config.get("tie_word_embeddings", True))
    positions = (_first_int(config, ("max_position_embeddings", "n_positions")) or 0) \
        if config.get("model_type") in _LEARNED_POSITIONS else 0
    params = layers * (attention + mlp + 4 * hidden) + vocab * hidden * (1 if tied else 2) + positions * hidden
    name = str(config.get("_name_or_path") or config.get("model_type") or path.parent.name or path.name)
    return ModelShape(name, params, max(vocab * hidden, hidden * ffn), hidden, layers, heads, vocab, str(path))


def model_from_dims(params: int | None, hidden: int | None, layers: int | None) -> ModelShape:
    """`--params/--hidden/--layers`: hidden and layers are needed for activations; params defaults to the
    GPT count of that shape."""
    for option, value in (("--params", params), ("--hidden", hidden), ("--layers", layers)):
        if value is not None and value <= 0:
            raise UsageError(f"{option} {value}: must be greater than zero", hint=f"e.g. {option} 24")
    if hidden is None or layers is None:
        raise UsageError("--params needs --hidden and --layers (the activation estimate uses them)",
                         hint="e.g. --params 7e9 --hidden 4096 --layers 32, or a preset: 350m, 1.3b, 6.7b, 13b")
    total = params if params is not None else gpt_params(layers, hidden)
    return ModelShape(f"{total / 1e9:.2f}B", total, max(GPT2_VOCAB * hidden, 4 * hidden * hidden), hidden, layers,
                      max(1, hidden // 64), GPT2_VOCAB, "--params/--hidden/--layers")


def resolve_model(model: str | None, params: int | None, hidden: int | None, layers: int | None) -> ModelShape:
    """MODEL (preset or config.json) or the dimension options, not both, not neither."""
    dims_given = any(v is not None for v in (params, hidden, layers))
    if model is not None and dims_given:
        raise UsageError("give MODEL or --params/--hidden/--layers, not both",
                         hint="drop MODEL to describe the model by its dimensions")
    if model is None:
        if not dims_given:
            raise UsageError("no model given", hint="pass a preset (350m, 1.3b, 6.7b, 13b), a config.json, or "
                             "--params/--hidden/--layers")
        return model_from_dims(params, hidden, layers)
    preset = PRESETS.get(model.lower())
    if preset is not None:
        return preset
    path = Path(model)
    if path.is_dir() and (path / "config.json").exists():
        path = path / "config.json"
    if not path.exists():
        raise UsageError(f"model {model!r}: neither a preset nor an existing file",
                         hint=f"presets: {', '.join(PRESETS)}; or the path of a Hugging Face config.json")
    return model_from_hf_config(path)
