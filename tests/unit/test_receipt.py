"""The receipt reader is strict and total: a valid receipt of the known schema, or a `ReceiptError` that
names the file, says what is wrong and how to fix it; never a TypeError from the dataclass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlstack_ds.errors import ExitCode
from mlstack_ds.installed.receipt import Receipt, ReceiptError, read_receipt, receipt_path, write_receipt


def valid_receipt(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "deepspeed_version": "0.19.5", "recipe": "deepspeed-0.19.5", "source": "pypi", "source_commit": "c" * 40,
        "source_pin": "a" * 64, "patches": [{"name": "0001-x.patch", "sha256": "b" * 64}], "tree_hash": "d" * 40,
        "platform": "cpu", "accelerator": "cpu", "archs": [], "ops": ["cpu_adam"], "flags": {"DS_BUILD_OPS": "0"},
        "wheel": "/cache/wheels/k/deepspeed-0.19.5.whl", "wheel_sha256": "e" * 64, "torch_version": "2.13.0+cpu",
        "python": "/venv/bin/python", "cache_key": "k", "installed_at": "2026-01-01T00:00:00+0000",
        "previous": {"deepspeed_version": None, "wheel": None, "receipt": None}, "schema": 1, "tool_version": "0.1",
    }
    data.update(changes)
    return data


def write_raw(prefix: Path, raw: bytes) -> Path:
    path = receipt_path(prefix)
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    return path


def test_written_receipt_reads_back_equal(tmp_path: Path) -> None:
    receipt = Receipt.from_dict(valid_receipt())
    write_receipt(tmp_path, receipt)
    assert read_receipt(tmp_path) == receipt
    assert read_receipt(tmp_path / "elsewhere") is None  # no receipt: None, not an error


def test_receipt_from_before_wheel_sha256_of_previous_still_reads(tmp_path: Path) -> None:
    write_raw(tmp_path, json.dumps(valid_receipt()).encode())  # previous without wheel_sha256
    receipt = read_receipt(tmp_path)
    assert receipt is not None and receipt.previous.wheel_sha256 is None


@pytest.mark.parametrize(("raw", "what"), [
    (json.dumps({"schema": 99}).encode(), "schema 99 is not one this mlstack-ds knows (1)"),
    (json.dumps(valid_receipt(schema=2)).encode(), "schema 2 is not one"),
    (json.dumps(valid_receipt())[:200].encode(), "not valid JSON (truncated or damaged"),
    (b"", "not valid JSON"),
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not text (binary or damaged)"),
    (b"[1, 2]", "the receipt is an array, not an object"),
    (b"null", "the receipt is null, not an object"),
    (json.dumps({"deepspeed_version": "0.19.5"}).encode(), "the receipt lacks accelerator, archs"),
    (json.dumps(valid_receipt(surprise=1)).encode(), "has unknown fields surprise"),
    (json.dumps(valid_receipt(ops="cpu_adam")).encode(), "field 'ops' is a string, not an array"),
    (json.dumps(valid_receipt(ops=[1])).encode(), "'ops' must be a list of strings"),
    (json.dumps(valid_receipt(schema=True)).encode(), "field 'schema' is a boolean, not a number"),
    (json.dumps(valid_receipt(flags={"A": 1})).encode(), "'flags' must map strings to strings"),
    (json.dumps(valid_receipt(patches=["x"])).encode(), "'patches' must be a list of {name, sha256}"),
    (json.dumps(valid_receipt(previous={"deepspeed_version": 5})).encode(),
     "'previous.deepspeed_version' is a number, not a string or null"),
    (json.dumps(valid_receipt(previous={"deepspeed_version": "0.1", "what": 1})).encode(),
     "'previous' has unknown fields what"),
    (json.dumps(valid_receipt(previous={"deepspeed_version": "0.1", "receipt": {"schema": 1}})).encode(),
     "the previous receipt lacks"),
])
def test_anything_but_a_valid_receipt_is_one_clear_error(tmp_path: Path, raw: bytes, what: str) -> None:
    path = write_raw(tmp_path, raw)
    with pytest.raises(ReceiptError) as caught:
        read_receipt(tmp_path)
    error = caught.value
    assert error.exit_code == ExitCode.INSTALL
    assert error.message.startswith(f"receipt {path} is unusable: ") and what in error.message, error.message
    assert "__init__" not in error.message and "\n" not in error.message
    assert "mlstack-ds install --force" in error.hint and f"rm {path}" in error.hint


def test_unreadable_receipt_file_is_a_receipt_error(tmp_path: Path) -> None:
    path = receipt_path(tmp_path)
    path.mkdir(parents=True)  # a directory where the file should be: EISDIR for everyone, root included
    with pytest.raises(ReceiptError, match=f"receipt {path} cannot be read"):
        read_receipt(tmp_path)
