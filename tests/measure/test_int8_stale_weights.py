"""Checked int8 (``precision="int8-checked"``) never runs an out-of-date int8 copy of the
weights: edits PyTorch counts no version for (a permutation written through ``.data`` or a
NumPy view, which keeps a weight's sum and norm; an index buffer reordered; a parameterless
module swapped for another) make a new packed copy, a new static copy and a new calibration,
and an edit made while the measurement runs is named as the cause where a spot check finds it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from checked_flips import Recorder
from torch import nn
from torch.nn.utils import parametrize

from senslab.measure import _int8
from senslab.tokens import Patches, Sequence

pytestmark = pytest.mark.skipif(not _int8.available(),
                                reason="this torch has no x86 quantised linear kernels")


def mlp(dyadic: bool = False) -> nn.Sequential:
    gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128),
                          nn.ReLU(), nn.Linear(128, 4)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            if dyadic:  # multiples of 2^-12: every float64 sum and norm is exact, so any
                p.copy_((p * 4096).round() / 4096)  # permutation keeps them bit for bit
    return model


def permuted_columns(w: torch.Tensor, seed: int = 1) -> torch.Tensor:
    return w[:, torch.randperm(w.shape[1], generator=torch.Generator().manual_seed(seed))]


def both(make, edit, tokens, inputs, **opts):
    """float32 and checked int8 on two updates, ``edit(model)`` between them (same seed);
    the checked run's warnings and its check before and after the edit."""
    runs = {}
    for precision in ("float32", "int8-checked"):
        model = make()
        m = Recorder(model, tokens, generator=5, precision=precision, **opts)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            m.update(inputs[0])
            before = (m._check._int8, m._check._static)
            edit(model)
            m.update(inputs[1])
        runs[precision] = (m, [str(w.message) for w in said], before)
    return runs["float32"][0], *runs["int8-checked"]


def test_the_fingerprint_sees_a_permutation_that_keeps_the_sum_and_the_norm():
    model = mlp(dyadic=True)
    before = _int8.weights_state(model)
    w = model[3].weight
    w.data.copy_(permuted_columns(w.data))  # through .data: no version counted
    after = _int8.weights_state(model)
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1
    (a, b), = changed
    assert a[:4] == b[:4]  # address, version, sum and norm: what the old check compared
    assert a[4] != b[4]


def rare(seed: int) -> torch.Tensor:
    """Token 3's first two features are 0 but on the first two examples (±6)."""
    x = torch.randn(64, 8, 16, generator=torch.Generator().manual_seed(seed)) * 0.5
    x[:, 3, :2] = 0.0
    x[:2, 3, 0], x[:2, 3, 1] = 6.0, -6.0
    return x


@pytest.mark.parametrize("seed", [4, 5])
def test_a_swap_through_data_that_few_copies_reach_gets_float32_decisions(seed):
    """Two columns of the first layer swapped through ``.data`` between two updates; only the
    two examples whose features reach them see it. The packed int8 weights (keyed on address
    and version) and the bound (sum and norm unchanged) were the old model's, and the spot
    checks drew none of those copies: 5 (seed 4) and 2 (seed 5) of 512 copies took the old
    weights' class without a word (estimate 0.0254 against float32's 0.0303)."""

    def swap(model):
        w = model[1].weight.data
        w[:, [48, 49]] = w[:, [49, 48]].clone()  # token 3's features 0 and 1

    x = rare(seed)
    full, checked, said, (packs, _) = both(lambda: mlp(dyadic=True), swap, Sequence(),
                                          (x, x), sigma=1.0, chunk_size=64)
    assert checked.checked_precision == "int8"
    assert torch.equal(checked.copies, full.copies)
    assert checked._check._int8 is not packs  # new packed weights, a new calibration
    half = len(full.copies) // 2
    assert not torch.equal(full.copies[:half], full.copies[half:])  # the swap matters
    assert not any("spot check" in s for s in said)


class _Callable:
    """A plain callable around a module: no parameters to fingerprint."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_plain_callables_weights_written_through_data_are_packed_again():
    """A plain callable has no parameters the check can list, so only the packed weights can
    tell: a permutation written through ``.data`` kept the old int8 copy, and the spot checks
    blamed int8's rounding ("a first batch unlike the later ones")."""
    g = torch.Generator().manual_seed(2)
    x1, x2 = torch.randn(64, 8, 16, generator=g), torch.randn(64, 8, 16, generator=g)

    def edit(model):
        w = model.net[3].weight
        w.data.copy_(permuted_columns(w.data))

    full, checked, said, (packs, _) = both(lambda: _Callable(mlp()), edit, Sequence(),
                                          (x1, x2), sigma=1.0, chunk_size=64)
    assert torch.equal(checked.copies, full.copies)
    assert checked._check._int8 is not packs
    assert not any("spot check" in s for s in said)


def test_changed_names_and_drops_the_packed_weights_written_through_data():
    model, x = mlp(), torch.randn(16, 128, generator=torch.Generator().manual_seed(3))
    mode = _int8.Int8Linears()
    with torch.inference_mode(), mode:
        model(x)
    assert mode.changed() == []
    w = model[3].weight
    w.data.copy_(permuted_columns(w.data))
    assert mode.changed(drop=False) == ["weight and bias (128, 128)"]
    assert mode.changed() == ["weight and bias (128, 128)"]
    assert len(mode.packs) == 0  # the stale one, and the one no call used since changed()
    with torch.inference_mode(), mode:
        low = model[:4](x)
        fresh = torch.ops.quantized.linear_dynamic(
            model[:3](x), _int8.pack(w, model[3].bias), _int8.reduce_range())
    assert torch.equal(low, fresh)  # packed again from the permuted weight


def test_a_packed_entry_keeps_its_storage_so_no_tensor_takes_its_address():
    """``p.data = new`` frees the old storage while ``p`` lives: a later tensor of the same
    shape at that address, with the same version, would have found the old packed weights."""
    lin, x = nn.Linear(128, 128).eval(), torch.randn(4, 128)
    lin.weight.data = torch.randn(128, 128)
    mode = _int8.Int8Linears()
    with torch.inference_mode(), mode:
        lin(x)
    held = lin.weight.data_ptr()
    lin.weight.data = torch.randn(128, 128)
    fresh = [torch.randn(128, 128) for _ in range(16)]
    assert held not in {t.data_ptr() for t in fresh}


def test_an_index_buffer_reordered_through_data_starts_a_new_calibration():
    """A parametrization that permutes a weight by an index buffer: reordering the buffer
    keeps its sum and its absolute sum, and the second update kept the first's bound."""

    class Permute(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("idx", torch.arange(128))

        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return w[:, self.idx]

    def make():
        model = mlp()
        parametrize.register_parametrization(model[3], "weight", Permute())
        return model

    def edit(model):
        idx = model[3].parametrizations.weight[0].idx
        idx.data.copy_(idx.flip(0))

    g = torch.Generator().manual_seed(2)
    x1, x2 = torch.randn(64, 8, 16, generator=g), torch.randn(64, 8, 16, generator=g)
    full, checked, _, (packs, _) = both(make, edit, Sequence(), (x1, x2), sigma=1.0,
                                        chunk_size=64)
    assert checked._check._int8 is not packs
    assert torch.equal(checked.copies, full.copies)


class SmallConv(nn.Module):
    """Convolutions with BatchNorm (folded into the static int8 copy) and an activation."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.act = nn.Tanh()
        self.c3 = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Linear(32, 3)
        with torch.no_grad():
            for t in (*self.parameters(), self.bn2.running_mean):
                t.copy_(torch.randn(t.shape, generator=g) / max(1, t[0].numel()) ** 0.5)
                t.copy_((t * 4096).round() / 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn2(self.c2(torch.relu(self.c1(x)))))
        return self.head(torch.relu(self.c3(x)).mean((2, 3)))


def bn_permuted(model: SmallConv) -> None:
    b = model.bn2.running_mean.data
    b.copy_(b[torch.randperm(32, generator=torch.Generator().manual_seed(3))])


def tanh_to_sigmoid(model: SmallConv) -> None:
    model.act = nn.Sigmoid()  # the same name, the same plain attributes, no parameters


@pytest.mark.parametrize("edit", [bn_permuted, tanh_to_sigmoid])
def test_the_static_int8_copy_is_remade_after_an_edit_no_version_counts(edit):
    """BatchNorm running means permuted through ``.data`` (folded into the int8
    convolution), or a ``Tanh`` swapped for a ``Sigmoid``: the static copy computed the old
    model (the spot checks found margins moved by 1.96 and 0.95 and blamed int8's rounding)."""
    g = torch.Generator().manual_seed(1)
    x1, x2 = torch.rand(12, 1, 16, 16, generator=g) * 4 - 2, torch.rand(
        12, 1, 16, 16, generator=g) * 4 - 2
    full, checked, said, (_, static) = both(lambda: SmallConv().eval(), edit, Patches(4),
                                            (x1, x2), sigma=1.5, repeats=2)
    assert static is not None and static.model is not None
    now = checked._check._static
    assert now is not static and now.model is not None  # a new copy of the edited model
    assert torch.equal(checked.copies, full.copies)
    assert not any("spot check" in s for s in said)


def test_the_spot_check_names_weights_edited_while_the_measurement_runs():
    """A hook that permutes a weight through ``.data`` once, mid-update, on the first call after
    the calibration: the spot check that finds it blamed int8's errors and "a first batch unlike
    the later ones"; it names the edited weight, and every later copy is re-checked."""
    model, m = mlp(), None

    def hook(module, args):
        if m._check.bound is not None and not getattr(module, "edited", False):
            module.edited = True
            module.weight.data.copy_(permuted_columns(module.weight.data))

    model[3].register_forward_pre_hook(hook)
    x = torch.randn(64, 8, 16, generator=torch.Generator().manual_seed(2))
    m = Recorder(model, Sequence(), generator=5, precision="int8-checked", sigma=1.0,
                 chunk_size=64)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        m.update(x)
    assert model[3].edited
    spot = [str(w.message) for w in said if "spot check" in str(w.message)]
    assert len(spot) == 1
    assert "the cause is not int8's rounding" in spot[0]
    assert "weight and bias (128, 128)" in spot[0] and ".data" in spot[0]
    assert "first batch unlike" not in spot[0]
    assert m.check_bound == float("inf")
