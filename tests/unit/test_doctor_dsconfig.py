"""--ds-config: read as DeepSpeed reads it (hjson in the target interpreter, duplicate keys refused,
an object required), compared with real hjson on the same files; and which configs offload to NVMe
(the ZeRO-Infinity case of catalogue F14)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import hjson
import pytest

from mlstack_ds.dsconfig.read import (
    dict_raise_error_on_duplicate_keys,
    offloads_to_nvme,
    read_ds_config,
    read_nvme_offload,
)
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


# Files DeepSpeed accepts: JSON, and what hjson adds.
ACCEPTED = {
    "json": json.dumps({"train_batch_size": 8, "zero_optimization": {"offload_param": {"device": "nvme"}}}),
    "comments and trailing commas": """{
        # a hash comment
        "train_batch_size": 8, // a line comment
        /* a block comment */
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",},},
    }""",
    "hjson without quotes, commas or root braces": (
        "train_batch_size: 8\n"
        "zero_optimization: {\n  stage: 3\n  offload_optimizer: {\n    device: nvme\n    pin_memory: true\n  }\n}\n"
        "name: a quoteless string\n"
        "note:\n  '''\n  multi-line\n  text\n  '''\n"
    ),
    "floats and nested lists": '{"optimizer": {"params": {"lr": 1.5e-4, "betas": [0.9, 0.95]}}}',
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_configs_read_exactly_as_hjson_reads_them(tmp_path: Path, name: str) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(ACCEPTED[name])
    expected = hjson.loads(ACCEPTED[name], object_pairs_hook=dict_raise_error_on_duplicate_keys)
    assert read_ds_config(path) == json.loads(json.dumps(expected))
    assert read_nvme_offload(path) is offloads_to_nvme(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"train_batch_size": 8, "train_batch_size": 16}', "Duplicate keys in DeepSpeed config: ['train_batch_size']"),
        ('{"zero_optimization": {"stage": 2, "stage": 3}}', "Duplicate keys in DeepSpeed config: ['stage']"),
        ("[1, 2]", "the top level is a list, DeepSpeed needs an object"),
        ("5", "the top level is int, DeepSpeed needs an object"),
        ('{"a": [1, 2}', "DeepSpeed cannot read it (HjsonDecodeError"),
    ],
)
def test_refused_configs(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(text)
    with pytest.raises(UsageError) as refused:
        read_ds_config(path)
    assert message in refused.value.message
    assert refused.value.message.startswith(f"--ds-config {path}: ")
    assert refused.value.hint
    # real hjson with DeepSpeed's hook agrees: it raises, or returns something that is not an object
    try:
        loaded = hjson.loads(text, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    except (ValueError, hjson.HjsonDecodeError):
        return
    assert not isinstance(loaded, dict)


def test_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--ds-config"):
        read_nvme_offload(tmp_path / "absent.json")
    with pytest.raises(UsageError, match="Is a directory"):
        read_nvme_offload(tmp_path)


@pytest.fixture(scope="module")
def python_without_hjson(bare_python: Path) -> Path:
    """A real interpreter where DeepSpeed (and so hjson) is not installed yet."""
    python = bare_python
    assert subprocess.run([python, "-c", "import hjson"], capture_output=True, check=False).returncode != 0
    return python


def test_without_hjson_strict_json_is_read_and_the_rest_refused(tmp_path: Path, python_without_hjson: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(ACCEPTED["json"])
    assert read_nvme_offload(path, python_without_hjson) is True
    path.write_text(ACCEPTED["comments and trailing commas"])
    with pytest.raises(UsageError) as refused:
        read_ds_config(path, python_without_hjson)
    assert f"{python_without_hjson} has no hjson" in refused.value.message
    assert "install DeepSpeed" in refused.value.hint
    path.write_text('{"a": 1, "a": 2}')
    with pytest.raises(UsageError, match=r"Duplicate keys in DeepSpeed config: \['a'\]"):
        read_ds_config(path, python_without_hjson)


def test_a_fifo_is_read_once_by_the_parser(tmp_path: Path) -> None:
    import os
    import threading

    fifo = tmp_path / "ds_config.fifo"
    os.mkfifo(fifo)
    text = ACCEPTED["comments and trailing commas"]

    def writer() -> None:
        with fifo.open("w") as stream:
            stream.write(text)

    thread = threading.Thread(target=writer)
    thread.start()
    assert read_nvme_offload(fifo) is True
    thread.join(timeout=60)
