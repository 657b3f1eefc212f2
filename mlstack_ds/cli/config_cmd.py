"""`mlstack-ds config`: a DeepSpeed config for this model on these GPUs, every choice with its reason."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from mlstack_ds.bench.verdicts import guide_departure
from mlstack_ds.cli.options import (
    ConfigNodesOption,
    ConfigOutOption,
    JsonOption,
    MicroBatchOption,
    PythonOption,
    SeqLenOption,
)
from mlstack_ds.config.hardware import Hardware, detect_gpus, plan_hardware
from mlstack_ds.config.model import PRESETS, resolve_model
from mlstack_ds.config.planner import plan_config, plan_inputs
from mlstack_ds.config.rules import Plan
from mlstack_ds.config.sizes import gib, parse_count, parse_size, positive_int
from mlstack_ds.console import Output, make_output
from mlstack_ds.errors import ConfigDoesNotFit, UsageError

CONFIG_HELP = (
    "Write a DeepSpeed config (ds_config.json) for MODEL on these GPUs: the lowest ZeRO stage that fits "
    "with headroom by DeepSpeed's own estimators (run in the target --python), then CPU offload, else a "
    "refusal with the numbers (exit 9); precision by GPU target; buckets by VRAM. The config is parsed by "
    "DeepSpeed in the target before it is written. MODEL: a preset ("
    + ", ".join(PRESETS) + "), a Hugging Face config.json, or --params/--hidden/--layers. See docs/config.md."
)


def register(app: typer.Typer) -> None:
    @app.command("config", help=CONFIG_HELP)
    def config_command(
        model: Annotated[str | None, typer.Argument(
            metavar="MODEL", help="Preset (350m, 1.3b, 6.7b, 13b) or a Hugging Face config.json path.")] = None,
        gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs per node (default: the detected ones).")]
        = None,
        nodes: ConfigNodesOption = 1,
        micro_batch: MicroBatchOption = 1,
        seq_len: SeqLenOption = 2048,
        vram: Annotated[str | None, typer.Option(
            "--vram", metavar="SIZE", help="Memory per GPU, e.g. 24GiB or 16GB (default: detected).")] = None,
        ram: Annotated[str | None, typer.Option(
            "--ram", metavar="SIZE", help="Host RAM per node, for offload (default: this machine's MemTotal).")] = None,
        params: Annotated[str | None, typer.Option("--params", help="Parameters, e.g. 7e9 (with --hidden, --layers).")]
        = None,
        hidden: Annotated[int | None, typer.Option("--hidden", help="Hidden size.")] = None,
        layers: Annotated[int | None, typer.Option("--layers", help="Transformer layers.")] = None,
        hf: Annotated[bool, typer.Option(
            "--hf", help="For the Hugging Face Trainer: \"auto\" where the Trainer fills the value.")] = False,
        out: ConfigOutOption = None,
        explain: Annotated[bool, typer.Option("--explain", help="Print every choice with its reason (stderr).")]
        = False,
        json_output: JsonOption = False,
        python: PythonOption = None,
    ) -> None:
        output = make_output(json_output)
        positive_int("--micro-batch", micro_batch)
        positive_int("--seq-len", seq_len)
        shape = resolve_model(model, parse_count("--params", params), hidden, layers)
        vram_bytes = parse_size("--vram", vram) if vram is not None else None
        ram_bytes = parse_size("--ram", ram) if ram is not None else None
        # The machine is read here, once; everything after takes these facts as given.
        hardware = plan_hardware(detect_gpus(), gpus_per_node=gpus, nodes=nodes, vram=vram_bytes, ram=ram_bytes)
        output.status(_inputs_line(plan_inputs(hardware, micro_batch=micro_batch, seq_len=seq_len, hf=hf)))
        output.status(f"asking DeepSpeed in {escape(str(python))} for its estimates and its verdict ...")
        planned = plan_config(shape, hardware, python, micro_batch=micro_batch, seq_len=seq_len, hf=hf,
                              on_refusal=lambda refusal: _explain_refusal(output, refusal, shape.name)
                              if explain else None)
        plan, answer, checked = planned.plan, planned.answer, planned.validation
        if explain:
            _explain(output, plan, shape.name, hardware, answer.deepspeed, checked.hf)
        text = json.dumps(plan.config, indent=2) + "\n"
        if out is not None:
            _write(out, text)
        amd = planned.inputs.get("amd_specific", {})
        output.status(f"{f'wrote {escape(str(out))}' if out else 'planned'}: {plan.chosen.label}, "
                      f"{gib(plan.chosen.gpu)} per GPU (DeepSpeed {answer.deepspeed} parsed it); amd_specific "
                      f"{'written' if amd.get('value') else 'left out'} ({escape(str(amd.get('source')))})")
        if json_output:
            output.emit_json({"model": shape.to_dict(), "hardware": hardware.to_dict(), "inputs": planned.inputs,
                              "deepspeed": answer.deepspeed, "validated": True, "hf": checked.hf or None,
                              "out": str(out) if out else None, **plan.to_dict()})
        elif out is None:
            typer.echo(text, nl=False)


def _inputs_line(inputs: dict[str, Any]) -> str:
    """The facts the plan is made from, each with its source: the same line means the same config."""
    ram = inputs["ram_bytes"]
    ram_text = "unknown" if ram["value"] is None else gib(ram["value"])
    line = (f"inputs: {inputs['gpus_per_node']['value']} GPU(s) per node ({inputs['gpus_per_node']['source']}) × "
            f"{inputs['nodes']['value']} node(s); {gib(inputs['vram_bytes']['value'])} VRAM per GPU "
            f"({inputs['vram_bytes']['source']}); host RAM {ram_text} per node ({ram['source']}); "
            f"{inputs['arch']['value'] or 'unknown target'} on {inputs['platform']['value']}; micro-batch "
            f"{inputs['micro_batch']} × {inputs['seq_len']} tokens")
    if inputs["ram_measured"]:
        line += "\n  without --ram the choice depends on this machine's RAM: pass --ram SIZE for the one that trains"
    return escape(line)


def _explain(output: Output, plan: Plan, model: str, hardware: Hardware, deepspeed: str, hf_note: str) -> None:
    """The reasons, on stderr: stdout stays the config, so `config --explain > ds_config.json` works."""
    err = output.err
    err.print(f"model {escape(model)}; {hardware.world_size} GPU(s) of {gib(hardware.vram_bytes)} "
              f"({escape(hardware.gpu_name)}, {hardware.platform}); DeepSpeed {deepspeed}")
    for choice in plan.choices:
        err.print(f"  {choice.key} = {escape(json.dumps(choice.value))}: {escape(choice.reason)}")
    err.print("  placements (per GPU; host RAM per node):")
    for c in plan.candidates:
        mark = "fits" if c.fits else "does not fit"
        err.print(f"    {c.label}: {gib(c.gpu)} GPU, {gib(c.cpu)} RAM: {mark}")
    for note in plan.notes:
        err.print(f"  note: {escape(note)}")
    chosen = plan.chosen
    for line in guide_departure(model, chosen.stage, chosen.offload_optimizer, chosen.offload_param):
        err.print(f"  departs from the guide: {escape(line)}")
    if hf_note:
        err.print(f"  --hf: {escape(hf_note)}")


def _explain_refusal(output: Output, refusal: ConfigDoesNotFit, model: str) -> None:
    """--explain on a refusal: every placement's numbers, and the guide's cell it departs from, before the
    error line."""
    output.err.print("  placements (per GPU; host RAM per node):")
    for c in refusal.details.get("candidates", []):  # type: ignore[union-attr]
        offload = ("optimizer and parameters offloaded" if c["offload_param"]
                   else "optimizer offloaded" if c["offload_optimizer"] else "no offload")
        output.err.print(f"    ZeRO-{c['stage']}, {offload}: {gib(c['gpu_bytes'])} GPU of {gib(c['gpu_limit_bytes'])} "
                         f"usable, {gib(c['cpu_bytes'])} RAM: does not fit")
    for line in guide_departure(model, None, False, False):
        output.err.print(f"  departs from the guide: {escape(line)}")


def _write(path: Path, text: str) -> None:
    """Atomically: a temporary file next to it, renamed into place (no half-written config)."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"--out {path}: no such directory {directory}", hint="create it first, or pick another path")
    try:
        fd, temporary = tempfile.mkstemp(prefix=".ds_config-", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot write it ({exc.strerror or exc})",
                         hint="pick a writable path") from exc
