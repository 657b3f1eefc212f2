"""Patch 0018: on the CPU accelerator the ahead-of-time async_io extension is linked with libaio.

setup.py builds CPU ops from `CPUOpBuilder.builder()`, which hands the CppExtension `libraries_args()` and
never `extra_ldflags()` (where AsyncIOBuilder names -laio). 0.19.5's prebuilt async_io_op then fails to
load with `undefined symbol: io_submit`. The extension setup.py would build is inspected here in both
copies of op_builder (the one setup.py imports and the one DeepSpeed loads at run time); that the linked
op really loads is what the e2e install shows (verify's prebuilt_ops and nvme_offload checks).
"""

from __future__ import annotations

from pathlib import Path

from support.ds_patch import probe_result

PROBE = """
import json
from op_builder.cpu import AsyncIOBuilder as SetupBuilder
from deepspeed.ops.op_builder.cpu import AsyncIOBuilder as RuntimeBuilder
print("RESULT " + json.dumps({"setup": SetupBuilder().builder().libraries,
                              "runtime": RuntimeBuilder().builder().libraries}))
"""


def test_prebuilt_async_io_is_linked_with_libaio(ds_tree: tuple[str, Path]) -> None:
    kind, tree = ds_tree
    libraries = probe_result(tree, "-c", PROBE)
    assert all("torch" in libs for libs in libraries.values()), libraries  # torch's CppExtension libraries
    linked = {copy: "aio" in libs for copy, libs in libraries.items()}
    # pristine: no libaio, so io_submit is undefined when the prebuilt op loads
    assert linked == ({"setup": False, "runtime": False} if kind == "pristine" else {"setup": True, "runtime": True})
