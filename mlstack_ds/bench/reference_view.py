"""`bench --reference` for a reader: the guide's tables laid out as the guide prints them, a verdict in every
cell, the reason for each verdict beneath, the assumptions and the peak-rate table with its sources.

Why the guide's layout: a user holding the guide finds the same rows and columns; the reasons are listed
by cell id (`memory/13B/DeepSpeed ZeRO-3`) so `--json`'s entries can be found from here.
"""

from __future__ import annotations

from typing import Any

from mlstack_ds.console import print_records

# Short marks for the table cells; the full words are in the legend and in --json.
MARKS = {"consistent": "ok", "not-on-stated-hardware": "not on its hardware", "short-sequences-only": "short seq only",
         "needs-unstated-conditions": "unstated conditions", "needs-offload": "needs offload",
         "arithmetic-off": "arithmetic off", "impossible": "IMPOSSIBLE"}


def render_reference(document: dict[str, Any], console: Any) -> None:
    source = document["source"]
    console.print(f"The guide's tables ({source['title']}), as claimed for {source['hardware']}, ROCm "
                  f"{source['rocm']}, torch {source['torch']}; every verdict computed here, nothing was run.",
                  markup=False, highlight=False, soft_wrap=True)
    console.print("Not stated by the guide: " + "; ".join(source["unstated"]), markup=False, highlight=False,
                  soft_wrap=True)
    for table, meta in document["tables"].items():
        cells = [c for c in document["cells"] if c["table"] == table]
        columns = list(dict.fromkeys(c["column"] for c in cells))
        rows = []
        for row in dict.fromkeys(c["row"] for c in cells):
            by_column = {c["column"]: c for c in cells if c["row"] == row}
            batch = next((c["conditions"].get("batch_size") for c in by_column.values()), None)
            label = f"{row} (batch {batch})" if batch else row
            rows.append([label, *(f"{by_column[col]['value']} [{MARKS[by_column[col]['verdict']]}]"
                                  if col in by_column else "" for col in columns)])
        print_records(console, [meta["row_header"], *columns], rows, title=f"{meta['title']} ({meta['unit']})")
    console.print("Why (every cell that is not consistent):", markup=False, highlight=False)
    for cell in document["cells"]:
        if cell["verdict"] != "consistent":
            console.print(f"  {cell['id']} = {cell['value']}: {cell['verdict_text']}: {cell['reason']}",
                          markup=False, highlight=False, soft_wrap=True)
    assumptions = document["assumptions"]
    console.print(f"Assumed: memory by the {assumptions['memory']}; FLOP per sample {assumptions['flops_per_sample']}"
                  f" ({assumptions['gpu']['name']}: {assumptions['gpu']['per_device_tflops']:.1f} TFLOP/s per GPU); "
                  "shapes (layers × hidden, parameters): " + ", ".join(
                      f"{name} {s['layers']}×{s['hidden']} {s['params'] / 1e9:.2f}B"
                      for name, s in assumptions["shapes"].items()),
                  markup=False, highlight=False, soft_wrap=True)
    print_records(console, ["key", "guide", "guide says", "DeepSpeed default", "config writes"],
                  [[v["key"], v["value"], v["guide_says"] or "-", v["deepspeed_default"], v["config_writes"] or "-"]
                   for v in document["config_values"]], title="The guide's AMD-specific settings")
    print_records(console, ["GPU", "target", "GiB", "FP16 TFLOP/s", "BF16 TFLOP/s", "derived", "source"],
                  [[p["name"], p["arch"], f"{p['vram_gib']:g}", f"{p['fp16_tflops']:g}", f"{p['bf16_tflops']:g}",
                    "yes" if p["derived"] else "no", p["source"]] for p in document["peaks"]],
                  title="Peak dense FP16/BF16 per product (sparsity excluded)")
