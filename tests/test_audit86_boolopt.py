"""Audit 86 (boolopt): Fourier sums beyond float64's square range, complex tables and strings,
and NGD / Polyak on a gradient whose norm overflows."""

from __future__ import annotations

import math

import pytest
import torch

from senslab.measure._cube import inputs_to_index
from senslab.measure.fourier import (
    average_sensitivity_fourier,
    fourier_coefficients,
    influence_fourier,
    noise_stability,
    spectral_weights,
    subset_sizes,
)
from senslab.optim import NGD, SPS, Polyak


def _f64(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ------------------------------------------------------------------ Fourier: squares overflow


def test_influences_and_as_ignore_a_huge_constant_term() -> None:
    # f̂(∅) = 1e200 squares to inf; influences and as(f) do not involve f̂(∅): as(f) read nan
    c = _f64(1e200, 1.0, 2.0, 0.5)  # f̂(∅), f̂({0}), f̂({1}), f̂({0, 1})
    assert average_sensitivity_fourier(c, coefficients=True) == 1.0 + 4.0 + 2 * 0.25
    assert influence_fourier(c, coefficients=True).tolist() == [1.25, 4.25]


def test_noise_stability_in_range_though_a_weight_is_not() -> None:
    # W_0 = 1e300 fits float64, W_1 = 4e308 does not; Stab_0 = W_0 (it read nan: inf · 0)
    c = _f64(1e150, 2e154)
    assert noise_stability(c, 0.0, coefficients=True) == pytest.approx(1e300, rel=1e-15)


def test_weights_beyond_float64_are_refused() -> None:
    table = _f64(1e200, -1e200, 3e199, 0.0)  # coefficients up to 5.75e199: squares overflow
    c = fourier_coefficients(table)
    assert bool(torch.isfinite(c).all())  # the coefficients themselves are fine
    for call in (lambda: spectral_weights(table), lambda: noise_stability(table, 0.5),
                 lambda: average_sensitivity_fourier(table), lambda: influence_fourier(table)):
        with pytest.raises(ValueError, match="overflow float64.*table / s"):
            call()


def test_scaled_weights_match_exact_sums_over_scales() -> None:
    g = torch.Generator().manual_seed(86)
    for scale in (1e-150, 1.0, 1e150, 2.0**520):
        c = torch.randn(16, generator=g, dtype=torch.float64) * scale
        squares = [x * x for x in c.tolist()]  # Python floats: exact where they do not overflow
        sizes = subset_sizes(4).tolist()
        want = [sum(s for s, k in zip(squares, sizes, strict=True) if k == d) for d in range(5)]
        if math.isinf(max(want)):  # 2^520 squared: beyond float64
            with pytest.raises(ValueError, match="overflow"):
                spectral_weights(c, coefficients=True)
            # the influences on bits 0..3 may fit or not; as(f) of c / 2^520 scaled back does
            a = average_sensitivity_fourier(c * 2.0**-520, coefficients=True)
            assert a > 0 and math.isfinite(a)
            continue
        assert spectral_weights(c, coefficients=True).tolist() == pytest.approx(want, rel=1e-13)


def test_in_range_results_unchanged_to_the_last_bit() -> None:
    g = torch.Generator().manual_seed(3)
    table = torch.randn(64, generator=g, dtype=torch.float64)
    c = fourier_coefficients(table, output="real")
    w = c.pow(2)
    sizes = subset_sizes(6)
    weights = torch.zeros(7, dtype=torch.float64).index_add_(0, sizes, w)
    assert torch.equal(spectral_weights(table, output="real"), weights)
    inf = torch.stack([w.view(-1, 2, 1 << i)[:, 1].sum() for i in range(6)])
    assert torch.equal(influence_fourier(table, output="real"), inf)
    k = torch.arange(7, dtype=torch.float64)
    assert average_sensitivity_fourier(table, output="real") == float((weights * k).sum())
    assert noise_stability(table, -0.3, output="real") == float((weights * (-0.3) ** k).sum())


# ------------------------------------------------------------------ complex tables and strings


@pytest.mark.parametrize("output", ["auto", "real", "sign"])
def test_complex_table_is_refused(output: str) -> None:
    # output='real' dropped the imaginary part: 1+1j read as 1 (a torch warning at most)
    table = torch.tensor([1 + 1j, -1, -1, 1], dtype=torch.complex64)
    with pytest.raises(ValueError, match="complex.*table.real"):
        fourier_coefficients(table, output=output)


def test_complex_coefficients_are_refused() -> None:
    c = torch.tensor([0, 1j, 0, 1], dtype=torch.complex128)
    with pytest.raises(ValueError, match="coefficients are complex"):
        spectral_weights(c, coefficients=True)
    with pytest.raises(ValueError, match="coefficients are complex"):
        noise_stability(c, 0.5, coefficients=True)


@pytest.mark.parametrize("entries", [[[1, -1], [1j, -1]], [[1, -1], [-1, -1]]])
def test_complex_strings_are_refused(entries: list) -> None:
    # |1j| = 1 passed the ±1 check; then torch's bare NotImplementedError ("lt_cpu")
    x = torch.tensor(entries, dtype=torch.complex64)
    with pytest.raises(ValueError, match="complex.*x.real"):
        inputs_to_index(x)


# ------------------------------------------------------------------ NGD / Polyak: norm overflow


@pytest.mark.parametrize(("dtype", "big", "kind"), [
    (torch.float64, 1e308, "float64"), (torch.float32, 3e38, "float32"),
])
@pytest.mark.parametrize("make", ["ngd", "polyak", "sps"])
def test_norm_overflow_is_named(dtype: torch.dtype, big: float, kind: str, make: str) -> None:
    p = torch.nn.Parameter(torch.zeros(4, dtype=dtype))

    def closure() -> torch.Tensor:
        p.grad = torch.full((4,), big, dtype=dtype)  # finite entries, norm 2·big: overflows
        return torch.tensor(1.0, dtype=dtype)

    opt = (NGD([p], lr=0.1) if make == "ngd" else Polyak([p]) if make == "polyak"
           else SPS([p], c=0.5, eta_max=1.0))
    with pytest.raises(FloatingPointError, match=f"every gradient entry is finite.*{kind}") as e:
        opt.step(closure)
    assert "nan or inf entries" not in str(e.value)
    assert bool((p.detach() == 0).all())  # nothing moved


def test_inf_entry_still_named_as_such() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([1.0, math.inf, 2.0])
    with pytest.raises(FloatingPointError, match="nan or inf entries"):
        NGD([p], lr=0.1).step()


def test_huge_finite_gradient_with_finite_norm_still_steps() -> None:
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float32))
    p.grad = torch.full((4,), 1e30)  # squares overflow float32; the scaled norm 2e30 does not
    NGD([p], lr=0.1).step()
    assert float(p.detach().double().norm()) == pytest.approx(0.1, rel=1e-6)


# ------------------------------------------------------------------ sampled standard error


def test_sampled_stderr_survives_a_large_mean() -> None:
    # s(f, x) = 1e12 + O(1): Σs² − N·mean² lost the spread to rounding, stderr read 0.0
    from senslab.measure.boolean import boolean_sensitivity

    def f(x: torch.Tensor) -> torch.Tensor:
        return 1e6 * x[:, 0] + 0.5 * x[:, 1] * (1 + x[:, 2])

    r = boolean_sensitivity(f, 4, method="sample", num_samples=400, generator=5,
                            output="real", dtype=torch.float64)
    bits = torch.randint(0, 2, (400, 4), generator=torch.Generator().manual_seed(5))
    x = (1 - 2 * bits).double()
    flips = x.unsqueeze(1) * (1 - 2 * torch.eye(4, dtype=torch.float64))
    s = ((f(x).unsqueeze(1) - f(flips.reshape(-1, 4)).reshape(400, 4)) ** 2 / 4).sum(1)
    want = float((s - 1e12).std() / 20)  # the spread, taken where it is not lost
    assert want > 0.01
    assert r.stderr == pytest.approx(want, rel=1e-6)
    assert r.ci95[0] < r.average < r.ci95[1]
