"""`bundle --prebuilt`: a DeepSpeed wheel for another Python than the bundle's is refused before DIR is touched
(it would never be chosen on the offline machine); one for the bundle's Python passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlstack_ds.bundle.make import check_prebuilt_python
from mlstack_ds.bundle.manifest import BundleTarget
from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.index.publish import Publishable

WHEEL = "deepspeed-0.19.5+998b290dfd8e-cp311-cp311-linux_x86_64.whl"


def prebuilt(name: str) -> Publishable:
    return Publishable(Path("/cache/wheels/998b290dfd8e") / name, {"plan": {"cache_key": "998b290dfd8e"}},
                       "0.19.5+998b290dfd8e", name)


def test_a_wheel_for_the_bundles_python_passes() -> None:
    check_prebuilt_python(prebuilt(WHEEL), BundleTarget("3.11", "manylinux_2_36_x86_64"))


def test_a_wheel_for_another_python_is_refused_with_both_named() -> None:
    with pytest.raises(UsageError) as raised:
        check_prebuilt_python(prebuilt(WHEEL), BundleTarget("3.12", "manylinux_2_28_x86_64"))
    assert raised.value.exit_code == ExitCode.USAGE
    assert "is for cp311" in raised.value.message and "Python 3.12" in raised.value.message
    assert "nothing was written" in raised.value.message and "install --offline builds" in raised.value.hint
