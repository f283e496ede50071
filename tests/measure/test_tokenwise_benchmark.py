"""Smoke test of the benchmark suite (benchmarks/run.py) on shrunk models, so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


@pytest.fixture
def bench():
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("senslab_bench_run", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH.parent))


def test_benchmark_tiny_run_writes_json_and_table(bench, tmp_path, capsys):
    out = tmp_path / "result.json"
    result = bench.main(["--tiny", "--cases", "boolean_transformer", "--no-training",
                         "--threads", "1", "--out", str(out)])
    saved = json.loads(out.read_text())
    (row,) = saved["cases"]
    assert row["case"] == "boolean_transformer" and row["tokens"] == 20 and row["draws"] == 3
    assert row["senslab_fwd_per_s"] > 0 and row["reference_fwd_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["senslab_fwd_per_s"] / row["reference_fwd_per_s"])
    assert row["gflop_per_forward"] > 0 and 0 < row["gemm_fraction"]
    # precision: the trained digits MLP flips sometimes; every technique reports a saving
    digits = saved["precision"]["digits_mlp (trained)"]
    assert 0 < digits["flip_rate"] < 0.5
    for name in ("stratified", "antithetic", "control variate", "cv + antithetic"):
        assert digits[name]["saving"] > 0
    # reuse: the text models (prefix), ResNet-18 and the CNN (local) timed both ways
    assert set(saved["reuse"]) == {"lstm", "gpt2", "resnet18", "cnn"}
    assert saved["reuse"]["resnet18"]["kind"] == saved["reuse"]["cnn"]["kind"] == "local"
    assert all(r["same_numbers"] and r["speedup"] > 0 for r in saved["reuse"].values())
    assert "| boolean_transformer | 20 × 3 |" in capsys.readouterr().out
    assert result["markdown"] == saved["markdown"]
    # the record names the CPU and the threads as set, not only the host name
    assert saved["machine"]["threads"] == 1 and saved["machine"]["cpu"]


def test_gpu_benchmark_says_it_needs_a_gpu(tmp_path):
    """benchmarks/gpu.py renders its recorded H100 run, and on a machine without CUDA stops
    with a message that points to the CPU suite."""
    import torch

    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("senslab_bench_gpu", BENCH.parent / "gpu.py")
        gpu = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gpu)
    finally:
        sys.path.remove(str(BENCH.parent))
    recorded = json.loads((BENCH.parent / "results" / "h100-gpu.json").read_text())
    assert gpu.markdown(recorded) == recorded["markdown"]
    assert all(row["agrees"] for rows in recorded["sensitivity"].values()
               for name, row in rows.items() if name in gpu.VARIANTS and name != "float32")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA device; on a CPU use benchmarks/run.py"):
            gpu.main(["--out", str(tmp_path / "x.json")])
