"""`bench --plot FILE.png`: throughput and memory by stage, and scaling, as one PNG.

matplotlib is an optional extra (`pip install 'mlstack-ds[plot]'`), imported only here and only for
`--plot`, whose absence is found before any stage runs (a bench of minutes must not end in an import
error).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlstack_ds.errors import EnvironmentProblem, UsageError

PLOT_EXTRA_HINT = "pip install 'mlstack-ds[plot]' (matplotlib) into the environment that runs mlstack-ds"


def require_plotting(path: Path) -> None:
    """Refuse `--plot` up front: matplotlib missing, or a path that cannot become a PNG."""
    if path.suffix.lower() != ".png":
        raise UsageError(f"--plot {path}: the plot is a PNG", hint="name the file with .png, e.g. --plot bench.png")
    if not path.parent.is_dir():
        raise UsageError(f"--plot {path}: the directory {path.parent} does not exist", hint="create it first")
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError as exc:
        raise EnvironmentProblem(f"--plot needs matplotlib, which cannot be imported ({exc})",
                                 hint=PLOT_EXTRA_HINT) from None


def write_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    from matplotlib import pyplot  # noqa: PLC0415

    runs = report["runs"]
    sizes = sorted({r["world_size"] for r in runs})
    scaling = report["scaling"]
    panels = 3 if scaling else 2
    figure, axes = pyplot.subplots(1, panels, figsize=(5 * panels, 4), layout="constrained")
    width = 0.8 / max(1, len(sizes))
    stages = list(dict.fromkeys(r["stage"] for r in runs))
    labels = ["DDP" if s == "ddp" else f"ZeRO-{s}" for s in stages]
    for offset, size in enumerate(sizes):
        chosen = {r["stage"]: r for r in runs if r["world_size"] == size}
        xs = [i + offset * width for i in range(len(stages))]
        rates = [chosen[s]["samples_per_s"]["median"] if s in chosen and chosen[s]["samples_per_s"] else 0
                 for s in stages]
        memory = [max((p for p in chosen[s]["peak_memory_bytes"] if p), default=0) / 1e9 if s in chosen else 0
                  for s in stages]
        axes[0].bar(xs, rates, width, label=f"{size} rank(s)")
        axes[1].bar(xs, memory, width, label=f"{size} rank(s)")
        for x, stage in zip(xs, stages, strict=True):
            if chosen.get(stage, {}).get("status") == "oom":
                axes[0].text(x, 0, "OOM", ha="center", va="bottom")
    kind = "peak accelerator memory" if any(r["peak_memory_kind"] == "accelerator" for r in runs) else "peak RSS"
    for axis, title, unit in ((axes[0], "throughput", "samples/s"), (axes[1], kind, "GB per rank")):
        axis.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(stages))], labels)
        axis.set_title(title)
        axis.set_ylabel(unit)
        axis.legend()
    if scaling:
        for stage in dict.fromkeys(row["stage"] for row in scaling):
            points = [(row["world_size"], row["efficiency"]) for row in scaling if row["stage"] == stage]
            axes[2].plot([p[0] for p in points], [p[1] for p in points], marker="o",
                         label="DDP" if stage == "ddp" else f"ZeRO-{stage}")
        axes[2].set_title("scaling efficiency")
        axes[2].set_xlabel("ranks")
        axes[2].set_ylim(0, 1.2)
        axes[2].legend()
    spec = report["spec"]
    figure.suptitle(f"mlstack-ds bench: {spec['model']['name']}, micro-batch {spec['micro_batch']}, "
                    f"sequence {spec['seq_len']}")
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png", dpi=100)
    pyplot.close(figure)
    tmp.replace(path)
