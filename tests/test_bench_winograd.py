"""benchmarks/winograd_bf16.py: its Winograd pieces rebuild the convolution, its FLOP counts add
up to local reuse's, and its ceilings reproduce the real-model benchmark's from the same record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import benchscripts
import pytest
import torch
import torch.nn.functional as F
from torch import nn

RECORD = (Path(__file__).resolve().parents[1] / "benchmarks" / "results"
          / "real-resnet18-256-2threads-zen4-sampling.json")


@pytest.fixture(scope="module")
def wino():
    sys.path.insert(0, str(benchscripts.BENCHMARKS))
    try:
        yield benchscripts.load("winograd_bf16.py", "senslab_winograd_bf16")
    finally:
        sys.path.remove(str(benchscripts.BENCHMARKS))


def test_the_variants_are_the_convolution(wino):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, 8, 8, generator=g).relu()
    w = torch.randn(64, 256, 3, 3, generator=g) / 48
    exact = F.conv2d(x.double(), w.double(), padding=1)
    # the transforms written in the script, with float32 products, are local reuse's algorithm
    v = wino.transformed_input(x)
    u = wino._winograd.transform_weight(w)
    rebuilt = wino.untransformed(torch.bmm(v, u), 3, 8, 8)
    assert (rebuilt.double() - exact).abs().max() < 1e-4 * exact.abs().max()
    err = wino.errors(x, w)
    assert err["Winograd float32"]["rms"] < 1e-5
    assert 1e-4 < err["direct bf16 (autocast)"]["rms"] < 1e-2
    # splitting the transformed operands can only bring the bf16 products closer
    assert (err["Winograd, 3 bf16 products (hi/lo)"]["rms"]
            <= err["Winograd, 1 bf16 product"]["rms"])


def test_flops_of_a_layer(wino):
    conv = nn.Conv2d(256, 128, 3, padding=1, bias=False)
    f = wino.flops(conv, (256, 8, 8))
    assert f["direct"] == 8 * 8 * 256 * 128 * 9 * 2
    assert f["products"] == 36 * 4 * 256 * 128 * 2
    assert 0 < f["transforms"] < f["products"]  # linear in the channels, the products quadratic
    assert f["winograd"] < f["direct"] / 2.5


def test_the_layers_found_are_the_ones_winograd_runs(wino):
    from senslab.models import create_model

    model = create_model("resnet18", seed=0).eval()
    found = wino.winograd_layers(model, torch.zeros(2, 3, 32, 32))
    # the stride-1 3×3 convolutions of stages 3 and 4 (256 channels on 8×8, 512 on 4×4 maps),
    # all but each stage's first, strided one
    assert [tuple(x.shape[1:]) for _, _, x in found] == [(256, 8, 8)] * 3 + [(512, 4, 4)] * 3
    assert all(conv.stride == (1, 1) for _, conv, _ in found)


def test_the_ceilings_reproduce_the_records(wino):
    record = json.loads(RECORD.read_text())
    case = next(c for c in record["cases"] if c["case"] == "resnet18")
    same = {"as recorded": case["gflop_per_local_copy_direct"]}
    rows = wino.ceilings(record, same)
    sampled = next(r for r in rows if "sampling" in r["label"])
    # the record's own bound: "ceiling at every unit's peak 2.05×" (docs/benchmarks.md)
    assert sampled["direct"] == pytest.approx(2.05, abs=0.005)
    assert sampled["as recorded"] == pytest.approx(sampled["direct"])
    assert sampled["measured"] == pytest.approx(1.57, abs=0.005)
    fewer = wino.ceilings(record, {"half": case["gflop_per_local_copy_direct"] / 2})
    assert all(r["half"] > r["direct"] for r in fewer)


def test_bf16_output_probe_is_a_bool(wino):
    assert isinstance(wino.bf16_output_available(), bool)
