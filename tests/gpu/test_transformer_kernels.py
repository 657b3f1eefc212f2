"""The CUDA transformer kernels (transformer, stochastic_transformer, transformer_inference) against torch, on
the GPU check's machine. Their checks (mlstack_ds/worker/transformer_checks.py) are written from upstream's own
tests and tolerances but not yet measured on a GPU, so they run here, printing every error they measure
(`-rP` in the GPU check's log), and join verify's table once a run has shown their margins; until then
verify's `untested_ops` names these ops."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mlstack_ds.worker import transformer_checks
from mlstack_ds.worker.context import Context
from mlstack_ds.worker.protocol import CheckFailed, SkipCheck

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("check", transformer_checks.CHECKS, ids=lambda check: check.name)
def test_transformer_kernel_matches_torch(check, installed_deepspeed, tmp_path) -> None:
    ctx = Context(SimpleNamespace(out=str(tmp_path), receipt=None), 0, 1)  # the receipt of this interpreter
    ctx.torch, ctx.deepspeed = torch, installed_deepspeed
    try:
        details = check.run(ctx)
    except SkipCheck as skipped:
        pytest.skip(str(skipped))
    except CheckFailed as failed:
        print(json.dumps(failed.details, indent=1, default=str))
        raise
    print(f"{check.name}: " + json.dumps(details, indent=1, default=str))
