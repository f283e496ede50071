"""The random stream of the token-wise estimator: every option's draws independent of how the
copies are chunked, of the global default dtype; seeds that torch cannot take are refused.

* Vocabulary picks (``replace_with``) were drawn a chunk at a time (``torch.randint(V, (n,))``
  per chunk): on a generator whose numbers depend on how a draw is split into calls (CUDA's
  gives every call its own offset), another ``chunk_size``, the automatic size or padding-aware
  batching put other rows in the same copies. The test records the draw calls themselves,
  which is what decides the numbers on every device; on the CPU the values agreed before too.
* The Gaussian noise was drawn in the default dtype: under ``torch.set_default_dtype(
  torch.float64)`` the same seed gave other numbers (0.2031 instead of 0.1667 below).
* ``generator=-1`` was taken as the seed 2**64 − 1 without a word, and ``generator=2**64``
  failed only inside ``update`` with "Overflow when unpacking long long".
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from senslab.measure import CompareSensitivity, TokenSensitivity, token_sensitivity
from senslab.measure._noise import NOISE_BLOCK, NoiseStream
from senslab.tokens import Embedding, Sequence

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # few-flips notes: not tested

T, D, V = 8, 6, 50


class Draws(TorchFunctionMode):
    """Records every torch call made of the generator ``gen``: its name, its size arguments
    and dtype. Equal records mean equal numbers on any device: a generator's numbers are a
    function of its seed and the sequence of draw calls made of it. (The checks of the model
    draw from generators of their own, which leave the measurement's numbers alone.)"""

    def __init__(self, gen: torch.Generator) -> None:
        super().__init__()
        self.gen = gen
        self.calls: list[tuple[str, str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if kwargs.get("generator") is self.gen:
            self.calls.append((func.__name__, repr(args), repr(kwargs.get("dtype"))))
        return func(*args, **kwargs)


def mlp() -> nn.Module:
    torch.manual_seed(0)  # test-only: model init
    return nn.Sequential(nn.Flatten(), nn.Linear(T * D, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(seed: int = 1, n: int = 8) -> torch.Tensor:
    return torch.randn(n, T, D, generator=torch.Generator().manual_seed(seed))


def vocab() -> torch.Tensor:
    return torch.randn(V, D, generator=torch.Generator().manual_seed(2))


OPTIONS = {
    "replace_with": lambda: dict(replace_with=vocab(), repeats=3),
    "replace_with+num_tokens": lambda: dict(replace_with=vocab(), repeats=3, num_tokens=3),
    "replace_with+uniform": lambda: dict(replace_with=vocab(), allocation="uniform", budget=0.5),
    "gaussian": lambda: dict(sigma=1.0, repeats=3),
    "num_tokens": lambda: dict(sigma=1.0, repeats=3, num_tokens=3),
    "antithetic": lambda: dict(sigma=1.0, repeats=4, antithetic=True),
    "whole": lambda: dict(sigma=1.0, repeats=3, mode="whole"),
    "uniform+target": lambda: dict(sigma=1.0, allocation="uniform", budget=0.5,
                                   target_stderr=0.05),
    "linear": lambda: dict(sigma=1.0, allocation="linear"),
    "control_variate": lambda: dict(sigma=1.0, repeats=2, control_variate="linear"),
}


def _measure(options: dict, chunk_size) -> tuple[list, list]:
    """The draw calls and per-example rates of two updates (the stream continues)."""
    gen = torch.Generator().manual_seed(3)
    metric = TokenSensitivity(mlp(), Sequence(), precision="float32", generator=gen,
                              chunk_size=chunk_size, **options)
    with Draws(gen) as draws:
        metric.update(batch(1))
        metric.update(batch(4, n=5))
    return draws.calls, metric.compute().per_sample.tolist()


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_option_draws_the_same_calls_whatever_the_chunk_size(name):
    """Before: with replace_with, chunk_size=1 drew 1 pick per call, chunk_size=5 five, the
    automatic size a probe of 8 then its chunks; the other options already drew alike."""
    runs = {cs: _measure(OPTIONS[name](), cs) for cs in (1, 5, None)}
    calls, values = runs[None]
    assert calls, "no draw recorded"
    for cs, (c, v) in runs.items():
        assert c == calls, f"chunk_size={cs} drew otherwise"
        assert v == values


class MeanText(nn.Module):
    """Embeds, then averages the real tokens: cutting the padding changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.embedding = nn.Embedding(20, D)
        self.head = nn.Linear(D, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embedding(input_ids) * attention_mask[..., None]
        return self.head(h.sum(1) / attention_mask.sum(1, keepdim=True))


def test_replace_with_picks_do_not_depend_on_padding_aware_batching():
    """trim_padding draws a window of examples at a time, the full-width path a chunk at a
    time: before, the pick calls differed (windows vs chunks of 3)."""
    ids = torch.randint(1, 20, (6, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(7)[None] < torch.tensor([7, 3, 5, 1, 6, 4])[:, None]
    inputs = {"input_ids": ids.masked_fill(~mask, 0), "attention_mask": mask}
    rows = torch.randn(V, D, generator=torch.Generator().manual_seed(5))
    runs = []
    for trim, cs in ((True, None), (False, 3), (True, 2)):
        gen = torch.Generator().manual_seed(0)
        metric = TokenSensitivity(MeanText(), Embedding("embedding"), replace_with=rows,
                                  repeats=2, trim_padding=trim, chunk_size=cs,
                                  precision="float32", generator=gen)
        with Draws(gen) as draws:
            metric.update(inputs)
        assert metric.last_trimmed == trim
        runs.append((draws.calls, metric.compute().per_sample.tolist()))
    assert runs[0] == runs[1] == runs[2]


def test_picks_are_drawn_in_fixed_blocks_keyed_by_position():
    """Pick k is element k of blocks of NOISE_BLOCK draws made one after another, however the
    picks are asked for; the generator then stands after whole blocks (before: after exactly
    the picks handed out, so its next draw depended on the split)."""
    high = 37
    ref = torch.Generator().manual_seed(9)
    blocks = torch.cat([torch.randint(high, (NOISE_BLOCK,), generator=ref) for _ in range(2)])
    for split in ([5, 3], [1] * 8, [8], [NOISE_BLOCK - 2, 7]):
        g = torch.Generator().manual_seed(9)
        stream = NoiseStream(g, D, torch.device("cpu"))
        got = torch.cat([stream.randint(high, n) for n in split])
        assert torch.equal(got, blocks[: sum(split)])
        after = torch.Generator().manual_seed(9)
        for _ in range(-(-sum(split) // NOISE_BLOCK)):
            torch.randint(high, (NOISE_BLOCK,), generator=after)
        assert torch.equal(g.get_state(), after.get_state())


def test_paired_comparison_keeps_its_picks_paired_over_batches():
    """The pending picks travel with the stream's position from one model to the next (a
    buffer the comparison copies): two objects of one function differ by exactly 0 in every
    batch, chunked differently."""
    class Identity:
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)

    metric = CompareSensitivity({"a": Identity(), "b": Identity()}, Sequence(), compare="l2",
                                replace_with=vocab(), repeats=2, generator=1, chunk_size=7)
    metric.metrics["b"].chunk_size = 2
    for seed in range(3):
        metric.update(batch(seed, n=5))
    d = metric.compute().difference("a", "b")
    assert torch.equal(d.per_sample, torch.zeros(15)) and d.stderr == 0.0


@pytest.mark.parametrize("double", [False, True], ids=["float32-model", "float64-model"])
def test_a_float64_default_dtype_does_not_change_the_noise(double):
    """Before: 0.2031 under torch.set_default_dtype(torch.float64) against 0.1667 under the
    float32 default, same seed, same model, same inputs (the noise was drawn as float64)."""
    model, x = mlp(), batch()
    if double:
        model, x = model.double(), x.double()
    want = token_sensitivity(model, x, Sequence(), sigma=1.0, repeats=3, precision="float32")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = token_sensitivity(model, x, Sequence(), sigma=1.0, repeats=3, precision="float32")
    finally:
        torch.set_default_dtype(previous)
    assert got.per_sample.tolist() == want.per_sample.tolist()
    assert 0 < want.estimate < 1


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64, 2**70])
def test_a_seed_torch_cannot_take_is_refused_when_the_metric_is_made(seed):
    """Before: -1 ran as the seed 2**64 − 1 (the same numbers every run, where -1 is often meant
    as "random"); 2**64 failed inside update() with "Overflow when unpacking long long"."""
    with pytest.raises(ValueError, match=r"generator seed must be an int from 0 to 2\*\*64 - 1"):
        TokenSensitivity(mlp(), Sequence(), sigma=1.0, generator=seed)


def test_accepted_option_values_give_the_documented_numbers():
    """A numpy int is an int, a numpy float a float, an int sigma a float; the largest seed
    works. Floats, tensors and bools where a count is asked for are refused, not rounded."""
    x = batch()

    def run(**kw):
        opts = dict(sigma=1.0, repeats=2, precision="float32", generator=0) | kw
        return token_sensitivity(mlp(), x, Sequence(), **opts).per_sample.tolist()

    base = run()
    for kw in (dict(repeats=np.int64(2)), dict(sigma=np.float32(1.0)), dict(sigma=1),
               dict(generator=np.int64(0)), dict(chunk_size=np.int64(3))):
        assert run(**kw) == base, kw
    # the largest seed a CPU generator reads whole; one more would be another seed's numbers
    assert run(generator=2**32 - 1) == run(generator=torch.Generator().manual_seed(2**32 - 1))
    with pytest.raises(ValueError, match=r"generator=4294967296 is 2\*\*32 or more"):
        run(generator=2**32)
    for kw in (dict(repeats=2.0), dict(repeats=torch.tensor(2)), dict(repeats=True),
               dict(num_tokens=3.0), dict(chunk_size=True)):
        with pytest.raises(ValueError, match="must be a positive integer"):
            run(**kw)
    for kw in (dict(sigma=torch.tensor(1.0)), dict(generator=np.random.default_rng(0))):
        with pytest.raises(TypeError):
            run(**kw)


def test_token_subsets_do_not_depend_on_the_default_dtype() -> None:
    """``num_tokens`` and ``allocation="uniform"`` drew their token subsets in the default dtype:
    a float64 default gave other subsets from one seed (0.2361 for 0.1806)."""
    from senslab.measure import token_sensitivity
    from senslab.tokens import Sequence

    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 4, generator=g)
    x = torch.randn(16, 6, 4, generator=g)

    def model(inp: torch.Tensor) -> torch.Tensor:
        return (inp.float() * w).sum((1, 2))

    def both(**opts: object) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for dtype in (torch.float32, torch.float64):
            before = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = token_sensitivity(model, x, Sequence(), sigma=1.0, generator=0, **opts)
            finally:
                torch.set_default_dtype(before)
            out.append(r.per_sample)
        return out[0], out[1]

    for opts in ({"num_tokens": 2, "repeats": 2}, {"allocation": "uniform", "budget": 0.5}):
        a, b = both(**opts)
        assert torch.equal(a, b), opts
