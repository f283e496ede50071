"""The zero-noise verification (``_runner.verify_copies``) runs on the first batch of each input
shape, and never again for that shape: later batches pay no extra forwards.

The model counts every row it evaluates; ``num_forward`` counts the clean rows and the perturbed
copies, so what the model saw beyond ``num_forward`` is the verification: ``2 × VERIFY_ROWS``
zero-noise rows and ``2 × VERIFY_BATCH`` noisy ones (the batch check: together, then in two
halves) on a new shape, none on a shape already checked.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure._runner import VERIFY_BATCH, VERIFY_ROWS
from senslab.tokens import Sequence


class RowCounter(nn.Module):
    """Two logits of a linear map of the tokens; counts the rows it is called on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += len(x)
        return self.lin(x).sum(1)


def _extra(metric: TokenSensitivity, model: RowCounter, x: torch.Tensor) -> int:
    """The rows one ``update`` (after a ``reset``) evaluated beyond its ``num_forward``."""
    metric.reset()
    rows = model.rows
    metric.update(x)
    return (model.rows - rows) - metric.compute().num_forward


def test_verification_runs_once_per_input_shape():
    torch.manual_seed(0)
    model = RowCounter()
    metric = TokenSensitivity(model, Sequence(), sigma=1.0, generator=0, chunk_size=64,
                              precision="float32")
    g = torch.Generator().manual_seed(1)
    # _extra resets the metric before each update: a shape checked stays checked across reset
    check = 2 * VERIFY_ROWS + 2 * VERIFY_BATCH
    assert _extra(metric, model, torch.randn(6, 4, 3, generator=g)) == check
    assert _extra(metric, model, torch.randn(6, 4, 3, generator=g)) == 0  # same shape: no check
    # a new shape: the zero-noise copies again; the batch check, a property of the model and
    # the options, ran on the first batch only
    assert _extra(metric, model, torch.randn(6, 5, 3, generator=g)) == 2 * VERIFY_ROWS
    assert _extra(metric, model, torch.randn(6, 4, 3, generator=g)) == 0  # the first, again


def test_a_random_forward_is_refused_on_its_first_batch():
    class Noisy(RowCounter):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(nn.functional.dropout(x, 0.5, training=True))

    metric = TokenSensitivity(Noisy(), Sequence(), sigma=1.0, generator=0)
    with pytest.raises(RuntimeError, match="changed between two evaluations"):
        metric.update(torch.randn(6, 4, 3))


def test_eval_mode_false_refuses_dropout_and_batch_statistics_in_train_mode():
    """In the model's own mode a train-mode dropout is random: its draws would be counted as
    flips (two runs with one seed gave different numbers), so it is refused. Train-mode
    BatchNorm normalises each chunk of copies by its own statistics — the number moved with
    chunk_size (0.70 at chunks of 2, 0.04 at 64 here) — so it is refused too, before any
    forward; with its BatchNorm in eval() the rest of the model keeps its mode and is measured,
    the same at every chunk size."""
    torch.manual_seed(0)  # test-only: model init
    drop = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Dropout(0.3), nn.Linear(16, 3))
    x = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="eval_mode=False.*eval_mode=True"):
        TokenSensitivity(drop.train(), Sequence(), sigma=1e-6, eval_mode=False).update(x)
    assert drop.training
    calm = TokenSensitivity(drop.eval(), Sequence(), sigma=1e-6, eval_mode=False, generator=0)
    calm.update(x)  # dropout off: deterministic
    assert calm.compute().estimate == 0.0
    norm = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.BatchNorm1d(16), nn.Linear(16, 3))
    norm.train()
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    with pytest.raises(ValueError, match=r"BatchNorm layers that normalise by batch statistics "
                                         r"\(2: .*depend on chunk_size.*eval_mode=True"):
        TokenSensitivity(norm, Sequence(), sigma=1.0, eval_mode=False).update(x)
    assert all(torch.equal(before[k], v) for k, v in norm.state_dict().items())
    norm[2].eval()  # the rest in train mode
    rates = []
    for chunk in (2, 64):
        m = TokenSensitivity(norm, Sequence(), sigma=1.0, eval_mode=False, generator=0,
                             chunk_size=chunk)
        m.update(x)
        rates.append(m.compute().per_sample)
    assert torch.equal(rates[0], rates[1]) and norm.training and not norm[2].training


def test_a_callers_autocast_does_not_change_the_decisions():
    """Called inside a bf16 autocast region (a bf16-mixed validation step) without autocast=,
    the measurement still runs in float32: the same flips as outside it. With autocast= the
    precision is the caller's choice."""
    torch.manual_seed(0)  # test-only: model init
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 64), nn.Tanh(), nn.Linear(64, 2)).eval()
    with torch.no_grad():  # two nearly tied classes: bf16's rounding changes some decisions
        model[3].weight[1] = model[3].weight[0] + 0.002 * torch.randn(64)
        model[3].bias.zero_()
    x = torch.randn(16, 4, 3, generator=torch.Generator().manual_seed(2))
    plain = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=8, generator=0)
    plain.update(x)
    inside = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=8, generator=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside.update(x)
        assert torch.is_autocast_cpu_enabled()  # the caller's region is left as it was
    assert torch.equal(inside.compute().per_sample, plain.compute().per_sample)
    low = TokenSensitivity(model, Sequence(), sigma=0.5, repeats=8, generator=0,
                           autocast=torch.bfloat16)
    low.update(x)
    assert not torch.equal(low.compute().per_sample, plain.compute().per_sample)


class Scaled(nn.Module):
    """A linear model whose forward multiplies by a registered buffer (saved for backward)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.lin = nn.Linear(12, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.flatten(1)) * self.scale


def test_measuring_between_a_loss_and_its_backward_leaves_the_graph_usable():
    """A loss computed before measuring with eval_mode=False (a per-step metric in a training
    step) still backpropagates: buffers the measurement did not change are not written back
    (a write bumped their version, and backward failed with torch's in-place error)."""
    model = Scaled().train()
    x = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(1))
    loss = model(x).square().mean()
    TokenSensitivity(model, Sequence(), sigma=1.0, eval_mode=False, generator=0).update(x)
    loss.backward()
    assert model.lin.weight.grad is not None and model.scale._version == 0


# -- a user's own reuse path is checked with noise, not only at zero noise (audit user52, §2)


def _own_reuse_models():
    """A user's subclasses of the zoo's LSTM (prefix reuse) and CNN (local reuse) with the zoo's
    weights: correct at zero noise, wrong on every noisy copy."""
    from senslab.models import create_model
    from senslab.models.text import LSTMClassifier
    from senslab.models.vision import CNN

    class ForgetsNoise(LSTMClassifier):
        def forward_suffix(self, cache, src, tok, noise):
            return super().forward_suffix(cache, src, tok, torch.zeros_like(noise))  # bug

    class HalvesNoise(CNN):
        def forward_local(self, cache, rows, top, left, patch):
            x, p = cache["maps"][0], patch.shape[-1]
            clean = torch.stack([x[r, :, t:t + p, c:c + p] for r, t, c in
                                 zip(rows.tolist(), top.tolist(), left.tolist(), strict=True)])
            return super().forward_local(cache, rows, top, left, clean + 0.5 * (patch - clean))

    lstm = create_model("lstm", vocab_size=64, dim=32, layers=2, max_len=16).eval()
    cnn = create_model("cnn", image_size=8, num_classes=3, channels=(4, 8), hidden=16).eval()
    out = []
    for base, cls in ((lstm, ForgetsNoise), (cnn, HalvesNoise)):
        own = cls(base.config)
        own.load_state_dict(base.state_dict())
        out.append((base, own.eval()))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 64, (4, 10), generator=g)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[1, 6:] = 0
    text = {"input_ids": ids, "attention_mask": mask}
    images = torch.randn(3, 1, 8, 8, generator=g)
    return out, text, images


def test_a_forward_suffix_that_drops_the_noise_is_refused():
    """Right at zero noise, so the zero-noise copies agree with the clean forward; the noisy
    copies of the first example disagree with full forwards: refused, naming the method and the
    way out. The zoo's LSTM (same weights) and full forwards measure as before."""
    from senslab import token_sensitivity
    from senslab.tokens import Embedding

    [(base, own), _], text, _ = _own_reuse_models()
    opts = {"sigma": 3.0, "repeats": 2, "precision": "float32", "compare": "l2", "generator": 0}
    with pytest.raises(RuntimeError, match=r"ForgetsNoise's prefix_cache/forward_suffix "
                                           r"disagrees with its forward on a noisy copy(?s:.*)"
                                           r"reuse_prefix=False"):
        token_sensitivity(own, text, **opts)
    full = token_sensitivity(own, text, Embedding("embed_ln", reuse_prefix=False), **opts)
    reused = token_sensitivity(base, text, **opts)
    assert full.estimate > 0 and reused.estimate == pytest.approx(full.estimate, rel=1e-4)


def test_a_forward_local_that_halves_the_noise_is_refused():
    from senslab import token_sensitivity
    from senslab.tokens import Patches

    [_, (base, own)], _, images = _own_reuse_models()
    opts = {"sigma": 1.0, "repeats": 2, "precision": "float32", "generator": 0}
    with pytest.raises(RuntimeError, match=r"HalvesNoise's local_cache/forward_local disagrees "
                                           r"with its forward on a noisy copy(?s:.*)"
                                           r"reuse_local=False"):
        token_sensitivity(own, images, Patches(4), **opts)
    full = token_sensitivity(own, images, Patches(4, reuse_local=False), **opts)
    reused = token_sensitivity(base, images, Patches(4), **opts)
    assert torch.equal(full.per_sample, reused.per_sample)


def test_the_noisy_check_costs_two_forwards_and_leaves_the_seeded_numbers_alone(monkeypatch):
    """With reuse on, the noisy copies take two forwards (their reuse path and their full
    forward) on the first batch of a shape, none later; their noise has a generator of its own,
    so a seed gives exactly the numbers it gives without the check, and the global RNG is not
    drawn from."""
    from senslab.measure import _runner

    [(lstm, _), _], text, _ = _own_reuse_models()
    calls = {"forward": 0, "suffix": 0}
    forward, suffix = lstm.forward, lstm.forward_suffix

    def counted(name, fn):
        def run(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(lstm, "forward", counted("forward", forward))
    monkeypatch.setattr(lstm, "forward_suffix", counted("suffix", suffix))

    def measure(**kw):
        metric = TokenSensitivity(lstm, sigma=3.0, repeats=2, precision="float32",
                                  compare="l2", chunk_size=64, generator=5, **kw)
        metric.update(text)
        before = dict(calls)
        metric.update(text)  # the same shape: verified already
        later = {k: calls[k] - before[k] for k in calls}
        return metric.compute().per_sample, before, later

    rng = torch.get_rng_state()
    calls.update(forward=0, suffix=0)
    checked, first, later = measure()
    assert torch.equal(torch.get_rng_state(), rng)
    monkeypatch.setattr(_runner, "_verify_noisy", lambda *a: None, raising=False)
    calls.update(forward=0, suffix=0)
    unchecked, bare, _ = measure()
    assert torch.equal(checked, unchecked)
    assert first["forward"] - bare["forward"] == 1 and first["suffix"] - bare["suffix"] == 1
    assert later["forward"] == 1  # the clean forward only
