"""benchmarks/checked_precision.py: every checked precision, and ``"auto"``, gives float32's
flips on a trained MLP, says what ran, and the command writes its record."""

from __future__ import annotations

import json

import benchscripts
import pytest

from senslab.measure import _int8


@pytest.fixture(scope="module")
def bench():
    return benchscripts.load("checked_precision.py", "senslab_checked_precision")


@pytest.mark.skipif(not _int8.available(), reason="no x86 quantised linear kernels")
def test_the_command_writes_a_record_with_float32_flips(bench, tmp_path):
    out = tmp_path / "checked.json"
    bench.CASES = {"small": ((128, 128), 60)}
    result = bench.main(["--threads", "1", "--examples", "32", "--repeats", "2", "--reps", "1",
                         "--cases", "small", "--out", str(out)])
    rows = {r["precision"]: r for r in result["cases"][0]["rows"]}
    assert set(rows) == set(bench.PRECISIONS)
    assert all(r["flips_equal_float32"] for r in rows.values())
    assert rows["float32"]["ran"] == "float32" and rows["float32"]["recheck_fraction"] is None
    assert rows["int8-checked"]["ran"] == "int8"
    assert 0 < rows["int8-checked"]["recheck_fraction"] <= 1  # the calibration at least
    assert rows["bf16-checked"]["ran"] == "bf16"
    assert rows["auto"]["ran"] in ("int8", "bf16", "float32")
    assert 0.0 < rows["float32"]["estimate"] < 1.0
    record = json.loads(out.read_text())
    assert record["cases"][0]["rows"][0]["precision"] == "float32"
    assert "| small" in out.with_suffix(".md").read_text()
