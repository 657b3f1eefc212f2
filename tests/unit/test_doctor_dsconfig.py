"""--ds-config: which DeepSpeed configs offload to NVMe (the ZeRO-Infinity case of catalogue F14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlstack_ds.doctor.dsconfig import offloads_to_nvme, read_nvme_offload
from mlstack_ds.errors import UsageError


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/n"}}}, True),
        ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}, True),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": True}}}, False),
        ({"zero_optimization": {"stage": 2}}, False),
        ({"train_batch_size": 8}, False),
        ({"zero_optimization": "junk"}, False),
        ([], False),
    ],
)
def test_offloads_to_nvme(config: object, expected: bool) -> None:
    assert offloads_to_nvme(config) is expected


def test_read_config_and_bad_files(tmp_path: Path) -> None:
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"zero_optimization": {"offload_param": {"device": "nvme"}}}))
    assert read_nvme_offload(good) is True
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not JSON"):
        read_nvme_offload(bad)
    with pytest.raises(UsageError, match="--ds-config"):
        read_nvme_offload(tmp_path / "absent.json")
