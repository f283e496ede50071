"""Output sharpness within the float rounding of the forward, and exact keys of the caches of
final-model measurements (senslab.experiments.lowsens._cache)."""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from senslab.experiments.lowsens._cache import read_cache, write_cache
from senslab.measure.sharpness import output_sharpness
from senslab.train.rundir import RunDir

ROUNDING = "within the float rounding of the forward"


# ------------------------------------------------------------- 1: ShOp and the rounding floor
def _mlp() -> tuple[nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) / math.sqrt(p.shape[-1]))
    return model, torch.randn(64, 32, generator=g)


def _float64_shop(model: nn.Module, x: torch.Tensor, sigma: float, seed: int,
                  repeats: int) -> float:
    """ShOp of the same float32 noise draws as output_sharpness(model, generator=seed), with
    the forward in float64: the value without rounding."""
    exact = copy.deepcopy(model).double()
    gen = torch.Generator().manual_seed(seed)
    x = x.double()
    with torch.no_grad():
        clean = exact(x)
        total = 0.0
        for _ in range(repeats):
            moved = copy.deepcopy(exact)
            for p in moved.parameters():
                p.add_(sigma * torch.randn(p.shape, generator=gen).double())
            total += (moved(x) - clean).abs().sum(1).mean().item()
    return total / repeats


def _rounding_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if ROUNDING in str(w.message)]


def test_shop_inflated_by_rounding_is_warned_of_with_a_safe_sigma() -> None:
    """sigma_w=3e-8 on a float32 MLP: ShOp several % above the float64 value of the same draws;
    said, with a sigma_w where float32 agrees with float64. Numbers and the caller's generator
    are those of the draws alone (the check's extra draw is undone)."""
    model, x = _mlp()
    sigma = 3e-8
    gen = torch.Generator().manual_seed(7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = output_sharpness(model, x, sigma_w=sigma, repeats=3, generator=gen)
    truth = _float64_shop(model, x, sigma, 7, 3)
    assert res.shop.estimate > 1.02 * truth  # the bias is real
    said = _rounding_warnings(caught)
    assert len(said) == 1 and "float64" in said[0], said
    safe = float(said[0].split("sigma_w of at least ")[1].split(" ")[0])
    assert safe > sigma

    # the caller's generator advanced by the draws only: as a run the check does not enter
    twin = torch.Generator().manual_seed(7)
    output_sharpness(model, x, sigma_w=0.05, repeats=3, generator=twin)
    assert torch.equal(gen.get_state(), twin.get_state())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = output_sharpness(model, x, sigma_w=safe, repeats=3, generator=7)
        output_sharpness(model, x, sigma_w=0.05, repeats=3, generator=7)
    assert not _rounding_warnings(caught)
    assert ok.shop.estimate == pytest.approx(_float64_shop(model, x, safe, 7, 3), rel=2e-3)


def test_shop_of_large_weights_near_their_spacing_is_warned_of() -> None:
    """Weights of size about 10 (float32 spacing about 1e-6) under LayerNorms: at
    sigma_w=1e-6 the output changes are rounding and grid noise as much as weight noise."""
    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Tanh(), nn.Linear(64, 64),
                          nn.LayerNorm(64), nn.Tanh(), nn.Linear(64, 10))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(100 * (torch.rand(p.shape, generator=g) * 2 - 1) / 8)
    x = torch.randn(64, 64, generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output_sharpness(model, x, sigma_w=1e-6, repeats=2, generator=0)
    assert _rounding_warnings(caught)


# ------------------------------------------------------------- 2: exact cache keys
@pytest.fixture()
def rd(tmp_path: Path) -> RunDir:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"seed": 0}))
    return RunDir(run)


def test_tensor_keys_that_print_alike_are_refused(rd: RunDir) -> None:
    """Two masks of 2000 entries differing in one print alike ("..."): stored by their str()
    one's measurement was served for the other."""
    a, b = torch.zeros(2000), torch.zeros(2000)
    b[1000] = 1.0
    assert str(a) == str(b)
    with pytest.raises(TypeError, match=r"key\['settings'\]\['mask'\].*tolist"):
        write_cache(rd, "final.json", {"settings": {"mask": a}}, "values", {"shop": 1.0})
    with pytest.raises(TypeError, match=r"key\['settings'\]\['mask'\]"):
        read_cache(rd, "final.json", {"settings": {"mask": b}}, "values", "the final model")
    assert not (rd.path / "final.json").exists()
    # as a list it is exact: the other mask is another key
    write_cache(rd, "final.json", {"mask": a.tolist()}, "values", {"shop": 1.0})
    assert read_cache(rd, "final.json", {"mask": b.tolist()}, "values", "x") is None
    assert read_cache(rd, "final.json", {"mask": a.tolist()}, "values", "x") == {"shop": 1.0}


class Settings:
    """No JSON form; its str() holds its memory address."""


def test_objects_and_numeric_dict_keys_are_refused(rd: RunDir) -> None:
    with pytest.raises(TypeError, match=r"key\['settings'\] is a Settings object"):
        write_cache(rd, "final.json", {"settings": Settings()}, "values", {})
    with pytest.raises(TypeError, match=r"non-string key 1 .*use string keys"):
        write_cache(rd, "final.json", {"per_layer": {1: 0.5}}, "values", {})
    assert not (rd.path / "final.json").exists()


def test_numpy_and_torch_scalars_and_nan_keys_are_found_again(rd: RunDir) -> None:
    """write_json stored np.int64(15) as 15 while the key was looked up as "15": the cache
    never hit. A NaN setting never equalled itself."""
    key = {"step": np.int64(15), "sigma": torch.tensor(0.5), "clip": float("nan"),
           "flag": np.bool_(True)}
    write_cache(rd, "final.json", key, "values", {"shop": 2.0})
    assert read_cache(rd, "final.json", key, "values", "x") == {"shop": 2.0}
    plain = {"step": 15, "sigma": 0.5, "clip": float("nan"), "flag": True}
    assert read_cache(rd, "final.json", plain, "values", "x") == {"shop": 2.0}
    assert read_cache(rd, "final.json", {**plain, "step": 15.0}, "values", "x") is None
