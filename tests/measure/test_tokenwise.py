"""Token-wise Gaussian sensitivity: exactness, closed forms, equivalences and errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding, Patches, Sequence

# -- small models covering the architectures the core must measure through one call ----------


class TinyViT(nn.Module):
    def __init__(self, patch: int = 4, dim: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.patch = patch
        self.embed = nn.Conv2d(1, dim, patch, stride=patch)
        layer = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.encoder(h).mean(1))


class TinyLSTM(nn.Module):
    def __init__(self, vocab: int = 20, dim: int = 8, classes: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.embed_ln = nn.LayerNorm(dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed_ln(self.embedding(input_ids)))
        last = attention_mask.long().sum(1) - 1
        return self.head(h[torch.arange(len(h)), last])


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.LeakyReLU(), nn.Linear(32, 3))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 3)
    )


def text_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 20, (6, 7), generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = torch.arange(7)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, 0), "attention_mask": mask}


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def seeded(module_fn, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # test-only: model init; the estimator itself never reads global RNG
    return module_fn()


# -- the same call measures every architecture -------------------------------------------------


@pytest.mark.parametrize("make", [mlp, cnn, TinyViT])
def test_image_models_measurable_through_one_call(make, images):
    r = token_sensitivity(seeded(make), images, Patches(4), sigma=1.0, repeats=2)
    assert 0.0 <= r.estimate <= 1.0
    assert r.num_examples == 10
    assert r.num_forward == 10 + 10 * 4 * 2
    assert r.per_sample.shape == (10,) and r.per_position.shape == (4,)
    assert math.isfinite(r.stderr)


def test_lstm_with_embedding_tokens_measurable():
    model = seeded(TinyLSTM)
    batch = text_batch()
    r = token_sensitivity(model, batch, Embedding("embed_ln"), sigma=2.0, repeats=3)
    assert r.num_forward == 6 + 3 * int(batch["attention_mask"].sum())
    assert 0.0 < r.estimate < 1.0


# -- exactness: chunking, class vs function, merging, seeds ------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"repeats": 3},
        {"repeats": 2, "num_tokens": 2},
        {"repeats": 4, "mode": "whole", "sigma": 0.3},
        {"repeats": 2, "compare": "l2"},
    ],
)
def test_chunked_equals_unchunked_exactly(options, images):
    model = seeded(cnn)
    opts = {"sigma": 1.0, **options}
    full = token_sensitivity(model, images, Patches(2), chunk_size=10_000, **opts)
    for chunk in (1, 7, 33):
        part = token_sensitivity(model, images, Patches(2), chunk_size=chunk, **opts)
        assert part.num_forward == full.num_forward
        if opts.get("compare", "class") == "class":  # flip counts: identical
            assert torch.equal(part.per_sample, full.per_sample)
            assert part.estimate == full.estimate
        else:  # same noise; distances differ only by BLAS summation order across batch sizes
            assert torch.allclose(part.per_sample, full.per_sample, rtol=1e-5, atol=0)


def test_chunked_equals_unchunked_for_embedding_tokens():
    model, batch = seeded(TinyLSTM), text_batch()
    a = token_sensitivity(model, batch, Embedding("embed_ln"), sigma=2.0, repeats=3, chunk_size=5)
    b = token_sensitivity(model, batch, Embedding("embed_ln"), sigma=2.0, repeats=3)
    assert torch.equal(a.per_sample, b.per_sample)
    assert torch.equal(a.per_position, b.per_position)


def test_class_equals_function(images):
    model = seeded(mlp)
    fn = token_sensitivity(model, images, Patches(4), sigma=0.7, repeats=2, generator=5)
    metric = TokenSensitivity(model, Patches(4), sigma=0.7, repeats=2, generator=5)
    metric.update(images)
    cl = metric.compute()
    assert cl.estimate == fn.estimate and cl.stderr == fn.stderr
    assert torch.equal(cl.per_position, fn.per_position)

    # two updates continue the same random stream: equal to one call on the concatenation
    metric = TokenSensitivity(model, Patches(4), sigma=0.7, repeats=2, generator=5)
    metric.update(images[:4])
    metric.update(images[4:])
    assert torch.equal(metric.compute().per_sample, fn.per_sample)

    metric.reset()
    with pytest.raises(RuntimeError, match="no examples"):
        metric.compute()


def test_merge_across_workers_matches_pooled_statistics(images):
    model = seeded(mlp)
    parts = []
    for seed, chunk in [(1, images[:3]), (2, images[3:])]:
        m = TokenSensitivity(model, Patches(4), sigma=0.7, repeats=2, generator=seed)
        m.update(chunk)
        parts.append(m)
    singles = [p.compute() for p in parts]
    merged = parts[0].merge(parts[1]).compute()
    pooled = torch.cat([s.per_sample for s in singles]).double()
    assert merged.num_examples == 10
    assert merged.estimate == pytest.approx(pooled.mean().item(), abs=1e-12)
    assert merged.stderr == pytest.approx(pooled.std().item() / math.sqrt(10), abs=1e-12)
    assert merged.num_forward == sum(s.num_forward for s in singles)


def test_same_seed_same_numbers_and_generator_object(images):
    model = seeded(cnn)
    a = token_sensitivity(model, images, Patches(2), sigma=1.0, generator=3)
    b = token_sensitivity(model, images, Patches(2), sigma=1.0, generator=3)
    c = token_sensitivity(
        model, images, Patches(2), sigma=1.0, generator=torch.Generator().manual_seed(3)
    )
    d = token_sensitivity(model, images, Patches(2), sigma=1.0, generator=4)
    assert torch.equal(a.per_sample, b.per_sample) and torch.equal(a.per_sample, c.per_sample)
    assert not torch.equal(a.per_sample, d.per_sample)


def test_variance_is_sigma_squared(images):
    model = seeded(mlp)
    a = token_sensitivity(model, images, Patches(4), sigma=0.5)
    b = token_sensitivity(model, images, Patches(4), variance=0.25)
    assert torch.equal(a.per_sample, b.per_sample) and b.sigma == 0.5


# -- statistics: per-position and per-sample reductions, standard errors -----------------------


def test_per_position_means_average_back_to_the_mean(images):
    r = token_sensitivity(seeded(cnn), images, Patches(2), sigma=1.0, repeats=3)
    assert r.per_position.shape == (16,) and torch.equal(r.positions, torch.arange(16))
    assert r.per_position.mean().item() == pytest.approx(r.estimate, abs=1e-9)
    assert r.per_sample.double().mean().item() == pytest.approx(r.estimate, abs=1e-6)
    assert r.stderr == pytest.approx(r.per_sample.double().std().item() / math.sqrt(10), rel=1e-5)


def test_right_aligned_positions_for_variable_length_text():
    model, batch = seeded(TinyLSTM), text_batch()
    r = token_sensitivity(model, batch, Embedding("embed_ln"), sigma=2.0, repeats=2)
    lengths = batch["attention_mask"].sum(1)
    assert torch.equal(r.positions, torch.arange(-7, 0))
    # position −k holds one cell per example with at least k real tokens
    expected = torch.stack([(lengths >= k).sum() * 2 for k in range(7, 0, -1)]).double()
    assert torch.equal(r.position_counts, expected)
    token_weighted = (r.per_position * r.position_counts).sum() / r.position_counts.sum()
    per_example_weighted = (r.per_sample.double() * lengths).sum() / lengths.sum()
    assert token_weighted.item() == pytest.approx(per_example_weighted.item(), abs=1e-6)


@pytest.mark.parametrize("allocation", [None, "uniform", "linear"])
def test_right_aligned_positions_count_real_tokens_a_mask_leaves_out(allocation):
    """mask= may leave out real tokens (an end token): positions still count from the last
    real token, so a token keeps its position whatever else is perturbed (the token 3 of 6
    that alone flips was reported at −2, not −3, when token 4 was left out)."""

    class OnlyToken(nn.Module):
        """Class 1 unless token ``k``'s noise sums beyond ±0.01: only that token flips, and it
        nearly always does."""

        def __init__(self, k: int) -> None:
            super().__init__()
            self.emb, self.k = nn.Embedding(10, 4), k

        def forward(self, input_ids, attention_mask):
            h = self.emb(input_ids)
            v = 0.01 - (h[:, self.k] - self.emb.weight[input_ids[:, self.k]]).sum(-1).abs()
            return torch.stack([torch.zeros_like(v), v], -1)

    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 0]])
    batch = {"input_ids": ids, "attention_mask": ids != 0}
    mask = torch.tensor([[1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    opts = dict(sigma=1.0, repeats=8, generator=0) if allocation is None else dict(
        sigma=1.0, generator=0, allocation=allocation, budget=8.0 if allocation == "linear"
        else 1.0)
    r = token_sensitivity(seeded(lambda: OnlyToken(3)), batch, Embedding("emb"), mask=mask,
                          **opts)
    flipped = r.positions[r.per_position.nan_to_num() > 0].tolist()
    assert flipped == [-3, -2]  # token 3 of row 0 (6 real) and of row 1 (5 real)
    # position −2 of row 0 is the token mask= left out: never perturbed, never counted there
    assert r.position_counts[r.positions == -1].item() > 0


def test_padding_never_perturbed():
    class PaddingReader(nn.Module):
        """Outputs the embedding vectors at padded positions only."""

        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(20, 4)
            self.embed_ln = nn.LayerNorm(4)

        def forward(self, input_ids, attention_mask):
            h = self.embed_ln(self.embedding(input_ids))
            return (h * (~attention_mask).unsqueeze(-1)).flatten(1)

    batch = text_batch()
    for mode in ("token", "whole"):
        r = token_sensitivity(
            seeded(PaddingReader), batch, Embedding("embed_ln"), sigma=5.0, compare="l1",
            mode=mode, repeats=2,
        )
        assert r.estimate == 0.0
    # the same model, told every position is real, does see noise on the padded positions
    everything = torch.ones_like(batch["attention_mask"])
    r = token_sensitivity(
        seeded(PaddingReader), batch, Embedding("embed_ln"), sigma=5.0, compare="l1",
        mask=everything,
    )
    assert r.estimate > 0


# -- closed form: a linear classifier ----------------------------------------------------------


def test_linear_classifier_matches_closed_form():
    """sign(w·x + b): noise on token t flips with probability Φ(−|w·x+b| / (σ‖w_t‖))."""
    g = torch.Generator().manual_seed(0)
    t, d, sigma = 5, 3, 0.8
    w = torch.randn(t, d, generator=g)
    bias = 0.3
    x = torch.randn(4, t, d, generator=g) * 0.4

    def model(seq: torch.Tensor) -> torch.Tensor:
        return (seq * w).sum((1, 2)) + bias  # one logit: the sign is the class

    margin = (x * w).sum((1, 2)) + bias
    normal = torch.distributions.Normal(0.0, 1.0)
    per_token = normal.cdf(-margin.abs()[:, None] / (sigma * w.norm(dim=1)[None]))
    exact = per_token.mean().item()
    assert 0.05 < exact < 0.6  # the test is informative only if flips are neither rare nor sure

    r = token_sensitivity(
        model, x, Sequence(), sigma=sigma, repeats=400, estimand="subset", generator=11
    )
    assert abs(r.estimate - exact) < 4 * r.stderr
    assert r.stderr == r.stderr_subset and 0 < r.stderr < 0.02
    per_example = per_token.mean(1)
    assert torch.allclose(r.per_sample.double(), per_example.double(), atol=0.06)

    # two logits [0, w·x+b] give the same predictions through argmax: same numbers
    r2 = token_sensitivity(
        lambda s: torch.stack([torch.zeros(len(s)), model(s)], 1), x, Sequence(), sigma=sigma,
        repeats=400, estimand="subset", generator=11,
    )
    assert torch.equal(r.per_sample, r2.per_sample)


def test_linear_classifier_whole_input_closed_form():
    """Noise on every token: flips with probability Φ(−|w·x+b| / (σ‖w‖))."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 2, generator=g)
    x = torch.randn(3, 4, 2, generator=g) * 0.5
    sigma = 0.6
    margin = (x * w).sum((1, 2))
    exact = torch.distributions.Normal(0.0, 1.0).cdf(-margin.abs() / (sigma * w.norm())).mean()
    r = token_sensitivity(
        lambda s: (s * w).sum((1, 2)), x, Sequence(), sigma=sigma, mode="whole", repeats=3000,
        estimand="subset",
    )
    assert abs(r.estimate - exact.item()) < 4 * r.stderr


def test_replacement_by_vocabulary_tokens():
    """Replacing token 0 by a uniform vocabulary row flips 'is token 0 = e_0' w.p. (V−1)/V."""
    vocab = torch.eye(5)
    x = vocab[torch.tensor([[0, 3, 2, 1]])].repeat(2, 1, 1)

    def model(seq):
        return seq[:, 0, 0] - 0.5

    r = token_sensitivity(  # clean logits all 0.5 ∈ (0, 1): the kind must be said
        model, x, Sequence(), replace_with=vocab, repeats=500, estimand="subset",
        output_kind="logits",
    )
    exact = (4 / 5) / 4  # only token 0 matters, one of 4 tokens
    assert abs(r.estimate - exact) < 4 * r.stderr
    assert r.per_position[1:].sum() == 0


def test_autocast_bfloat16_agrees_with_float32(images):
    model = seeded(mlp)
    a = token_sensitivity(model, images, Patches(4), sigma=1.0, repeats=20)
    b = token_sensitivity(model, images, Patches(4), sigma=1.0, repeats=20, autocast=torch.bfloat16)
    assert abs(a.estimate - b.estimate) < 4 * max(a.stderr_subset, 1e-3)


def test_model_mode_restored_and_measured_in_eval(images):
    model = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 3))
    model.train()
    a = token_sensitivity(model, images, Patches(4), sigma=0.1)
    b = token_sensitivity(model, images, Patches(4), sigma=0.1)
    assert model.training and model[1].training
    assert torch.equal(a.per_sample, b.per_sample)  # dropout off while measuring


def test_default_tokens_from_model(images):
    model = seeded(mlp)
    model.default_tokens = lambda: Patches(4)
    r = token_sensitivity(model, images, sigma=0.5)
    assert r.per_position.shape == (4,)
    with pytest.raises(TypeError, match="default_tokens"):
        token_sensitivity(seeded(mlp), images, sigma=0.5)


# -- bad input ---------------------------------------------------------------------------------


def test_patch_size_must_divide_image(images):
    with pytest.raises(ValueError, match="patch size 3 does not divide image size 8x8; use one of"):
        token_sensitivity(seeded(mlp), images, Patches(3), sigma=0.1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": -1.0}, "sigma"),
        ({"variance": 0.0}, "variance"),
        ({}, "exactly one noise level"),
        ({"sigma": 0.1, "variance": 0.01}, "exactly one noise level"),
        ({"sigma": 0.1, "repeats": 0}, "repeats"),
        ({"sigma": 0.1, "compare": "kl"}, "compare"),
    ],
)
def test_bad_options(kwargs, message, images):
    with pytest.raises(ValueError, match=message):
        token_sensitivity(seeded(mlp), images, Patches(4), **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"seed": 0}, r"seed=: pass generator= \(an int seed"),
    ({"num_samples": 8}, r"num_samples=: pass repeats="),
    ({"batch_size": 64}, r"batch_size=: pass chunk_size="),
    ({"sigmma": 0.1}, r"sigmma=: did you mean sigma=\?"),
    ({"frobnicate": 1}, r"frobnicate=: not an option\. The options are: sigma, variance"),
])
def test_unknown_options_name_what_to_pass(kwargs, message, images):
    """An option senslab does not take is refused with the name it goes by here."""
    with pytest.raises(TypeError, match=message):
        token_sensitivity(seeded(mlp), images, Patches(4), sigma=0.1, **kwargs)
    with pytest.raises(TypeError, match=message):
        TokenSensitivity(seeded(mlp), Patches(4), sigma=0.1, **kwargs)


def test_empty_batch_and_wrong_shapes(images):
    with pytest.raises(ValueError, match="empty batch"):
        token_sensitivity(seeded(mlp), images[:0], Patches(4), sigma=0.1)
    with pytest.raises(ValueError, match=r"\(batch, channels, height, width\)"):
        token_sensitivity(seeded(mlp), images[:, 0], Patches(4), sigma=0.1)
    with pytest.raises(ValueError, match="mask has shape"):
        token_sensitivity(
            seeded(mlp), images, Patches(4), sigma=0.1, mask=torch.ones(10, 5, dtype=torch.bool)
        )


def test_nan_output_is_an_error(images):
    def broken(x):
        out = x.flatten(1)[:, :3].clone()
        out[2] = float("nan")
        return out

    with pytest.raises(FloatingPointError, match="NaN or infinite on 1 clean"):
        token_sensitivity(broken, images, Patches(4), sigma=0.1)


def test_inputs_on_other_device_than_model(images):
    """The only other device on a CPU machine is 'meta', whose parameters have no values: named
    as such (a model on a GPU with CPU inputs is in test_gpu.py)."""
    model = nn.Linear(64, 3, device="meta")
    with pytest.raises(ValueError, match="'1.weight', '1.bias' are on the 'meta' device"):
        token_sensitivity(nn.Sequential(nn.Flatten(), model), images, Patches(4), sigma=0.1)


def test_unknown_hook_target_lists_valid_names():
    with pytest.raises(ValueError, match="no submodule 'embed_lm'.*'embed_ln'.*Valid names"):
        token_sensitivity(seeded(TinyLSTM), text_batch(), Embedding("embed_lm"), sigma=1.0)


def test_hook_removed_after_measurement():
    model = seeded(TinyLSTM)
    batch = text_batch()
    token_sensitivity(model, batch, Embedding("embed_ln"), sigma=1.0)
    assert not model.embed_ln._forward_hooks
    with pytest.raises(ValueError):
        token_sensitivity(model, batch, Embedding("lstm"), sigma=1.0)  # tuple output
    assert not model.lstm._forward_hooks


# -- Ctrl-C ------------------------------------------------------------------------------------


def test_ctrl_c_inside_a_probe_finalizer_still_stops_the_measurement(monkeypatch) -> None:
    """SIGINT that lands while one of the chunk-size probe's weakref finalizers runs would raise
    its KeyboardInterrupt there, and Python would swallow it ("Exception ignored" and a
    traceback): the handler records it there without raising, and the measurement must stop all
    the same — after the probe chunk, not at the end of the batch — and put Python's own
    handler back."""
    import os
    import signal
    import sys
    import threading
    import weakref

    from senslab.measure import _chunks

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    x = torch.randn(8, 1, 8, 8, generator=g)
    forwards: list[int] = []
    model.register_forward_hook(lambda m, a, out: forwards.append(len(out)))
    real, fired = _chunks.ActivationMeter._release, []

    def ctrl_c_in_a_finalizer() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs here, inside the finalizer
            pass

    def release(self, key: int) -> None:
        if not fired:  # the first tensor of the probe that dies
            fired.append(1)
            dying = type("Dying", (), {})()
            weakref.finalize(dying, ctrl_c_in_a_finalizer)
            del dying  # the finalizer runs now, and the Ctrl-C lands in it
        real(self, key)

    swallowed: list[type] = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as m:
            m.setattr(_chunks.ActivationMeter, "_release", release)
            m.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
            metric = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=64, generator=0,
                                      precision="float32", memory_budget=1 << 16)
            with pytest.raises(KeyboardInterrupt):
                metric.update(x)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)
    assert swallowed == []  # nothing raised inside the finalizer: no "Exception ignored" print
    # of 8 × 16 × 64 copies, only the probe chunk ran (after the clean pass and its checks)
    assert fired and forwards[-1] == _chunks.PROBE_COPIES and sum(forwards) < 64


def test_a_float64_models_distances_are_taken_in_float64():
    """compare='l2' on a linear float64 model whose outputs sit near 100: the distance scales
    exactly with σ, down to σ = 1e-8 (subtracted after rounding to float32, where the spacing
    near 100 is 8e-6, it came out as 0 or a multiple of that spacing)."""
    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).double()
    with torch.no_grad():
        model[1].bias.fill_(100.0)
    x = torch.randn(4, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    opts = dict(compare="l2", repeats=2, generator=0)
    big, tiny = (token_sensitivity(model, x, Sequence(), sigma=s, **opts).estimate
                 for s in (1.0, 1e-8))
    assert big > 0
    assert tiny == pytest.approx(big * 1e-8, rel=1e-5)


@pytest.mark.parametrize("option", [{"control_variate": "linear"}, {"allocation": "linear"}])
def test_the_tangent_options_refuse_a_model_that_returns_labels(option):
    torch.manual_seed(0)  # test-only: init
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x = torch.randn(4, 3, 4, generator=torch.Generator().manual_seed(1))

    def labels(z):
        return net(z).argmax(-1)

    with pytest.raises(ValueError, match="returns class labels .torch.int64.: return the logits"):
        token_sensitivity(labels, x, Sequence(), sigma=1.0, generator=0, **option)
    assert token_sensitivity(labels, x, Sequence(), sigma=1.0, generator=0).num_forward > 0


def test_replace_with_refuses_a_half_precision_models_tokens():
    """In a bf16 model the copy x + (row − x) is not the vocabulary row (0.0117 for a row of
    0.0100, which flipped this model every time and was counted as never flipping): refused,
    with the float32 route; a float32 model puts the row there."""

    class Threshold(nn.Module):  # class 1 iff token 0 exceeds 0.011
        output_kind = "logits"

        def forward(self, x):
            return x[:, 0, 0].float() - 0.011

    x, vocab = torch.ones(1, 1, 1), torch.tensor([[0.01]])
    res = token_sensitivity(Threshold(), x, Sequence(), replace_with=vocab, repeats=4)
    assert res.estimate == 1.0  # the row is below the threshold: every copy flips
    with pytest.raises(ValueError, match="replace_with needs float32 or float64 tokens.*bfloat16"):
        token_sensitivity(Threshold(), x.bfloat16(), Sequence(), replace_with=vocab.bfloat16(),
                          repeats=4)


def test_per_position_under_num_tokens_weighs_each_example_alike(linear):
    """num_tokens draws 2 of each example's real tokens: a short example's tokens are always
    drawn, a long one's rarely, and the profile averaged copies alike, so it leaned towards
    short examples. Here the short examples sit near the boundary (they flip often) and the
    long ones far from it: the unweighted profile read about 0.1 high at the first positions.
    Each copy now stands for its example's real tokens over those a round draws (1/π), and
    the profile pooled over runs is the per-token truth, in one round or in several."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 3, generator=g, dtype=torch.float64)
    lengths = torch.tensor([2, 6, 2, 6, 2, 6, 2, 6])
    mask = torch.arange(6)[None] < lengths[:, None]
    x = torch.randn(8, 6, 3, generator=g, dtype=torch.float64)
    x = x * torch.where(lengths == 2, 0.1, 1.5)[:, None, None] * mask[..., None]

    def model(inp: torch.Tensor) -> torch.Tensor:
        return (inp * w).sum((-2, -1))[:, None]

    p = linear.flip_probs(x, w, 0.0, 1.0)
    truth = (p * mask).sum(0) / mask.sum(0)
    share = mask * torch.where(lengths == 2, 1.0, 1 / 3)[:, None]  # π: 2 of K tokens drawn
    alike = (p * share).sum(0) / share.sum(0)  # copies weighed alike: what the profile read
    assert (alike - truth)[:2].abs().min() > 0.05
    for options in ({"repeats": 40}, {"repeats": 8, "target_stderr": 1e-9,
                                      "max_forward": 8 + 5 * 16 * 8}):
        m = TokenSensitivity(model, Sequence(), sigma=1.0, generator=3, precision="float32",
                             num_tokens=2, align="left", **options)
        ps, pc = torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
        for _ in range(200):
            m.update(x, mask)
            r = m.compute()
            m.reset()
            ps += r.per_position.double().nan_to_num() * r.position_counts
            pc += r.position_counts
        pooled = ps / pc
        assert torch.allclose(pooled, truth, atol=0.02), (options, pooled - truth)


def test_a_forward_that_enters_autocast_itself_is_refused():
    """A mixed-precision wrapper (Lightning Fabric's module under bf16-mixed) switches autocast
    on inside its forward, past senslab's switch-off: the decisions would be bf16's. Refused
    before anything is counted; autocast= (reduced precision accepted) measures it."""

    class OwnAutocast(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = seeded(cnn)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.net(x).float()

    model, x = OwnAutocast(), torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    metric = TokenSensitivity(model, Patches(4), sigma=1.0, precision="float32")
    with pytest.raises(ValueError, match="switches autocast on by itself"):
        metric.update(x)
    assert metric.state.n == 0
    r = token_sensitivity(model, x, Patches(4), sigma=1.0, autocast=torch.bfloat16)
    assert r.num_examples == 4
    plain = token_sensitivity(model.net, x, Patches(4), sigma=1.0, precision="float32")
    assert plain.num_examples == 4


def test_batchnorm_without_running_statistics_is_refused_in_eval_mode_too():
    """eval() leaves a BatchNorm without running statistics normalising by its batch: the
    copies' flips would depend on chunk_size (a chunk of one copy failed inside torch)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8),
                          nn.BatchNorm1d(8, track_running_stats=False), nn.Linear(8, 3))
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"without running statistics \(2: track_running"):
        token_sensitivity(model, x, Patches(4), sigma=1.0)
    tracked = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    assert token_sensitivity(tracked, x, Patches(4), sigma=1.0).num_examples == 6


def test_inputs_without_a_tensor_are_named_with_the_fix():
    """Tokenizer output without return_tensors='pt' (lists) and a forward that takes one dict,
    passed as (features,), were told only that the inputs hold no tensor."""
    with pytest.raises(TypeError, match=r"a dict of \{'input_ids': list\}.*return_tensors='pt'"):
        token_sensitivity(seeded(mlp), {"input_ids": [[3, 4, 5]]}, Sequence(), sigma=1.0)
    with pytest.raises(TypeError, match=r"a tuple of \(dict\).*forward\(\*\*features\)"):
        token_sensitivity(seeded(mlp), ({"x": torch.zeros(2, 3)},), Sequence(), sigma=1.0)


@pytest.mark.parametrize("design", [{"repeats": 1}, {"allocation": "uniform"},
                                    {"allocation": "linear"}, {"antithetic": True, "repeats": 2},
                                    {"num_tokens": 2, "repeats": 4}])
def test_adaptive_stopping_needs_evidence_to_stop_on_no_flip(design):
    """target_stderr stopped at 0 ± 0 after two rounds without a flip, however few the draws:
    one example of 8 tokens flipping at ≈ 0.1 per draw did so in about a quarter of the calls.
    Zero flips now end the rounds only once the rule of three allows it; a model that never
    flips still stops long before the round cap."""
    torch.manual_seed(0)
    w = torch.randn(8, 3)
    x = torch.randn(1, 8, 3, generator=torch.Generator().manual_seed(4))

    def model(z):  # one logit: 0.5 + Σ_t w_t · (z_t − x_t), flips where the noise pushes it < 0
        return (0.5 + ((z - x) * w).sum((1, 2)))[:, None]

    design = dict(design, output_kind="logits")
    zeros = 0
    for seed in range(24):
        r = token_sensitivity(model, x, Sequence(), sigma=0.25, target_stderr=0.03,
                              generator=seed, estimand="subset", **design)
        zeros += r.estimate == 0.0 and r.stderr == 0.0
    exact = token_sensitivity(model, x, Sequence(), sigma=0.25, repeats=400, generator=99,
                              output_kind="logits")
    assert exact.estimate > 0.05  # the example does flip
    assert zeros <= 1, zeros
    never = token_sensitivity(lambda z: model(z) + 100.0, x, Sequence(), sigma=0.25,
                              target_stderr=0.01, generator=0, estimand="subset", **design)
    # the rule counts draws, not units: an antithetic pair or a sampled token's repeats are
    # several draws (counted as one, these ran 2× and 3× as long, to the round cap)
    assert never.estimate == 0.0 and never.num_forward <= 1 + 8 * 24


def test_the_profile_under_adaptive_stopping_weighs_batches_by_their_tokens():
    """With target_stderr each update runs as many rounds as its flips ask for; the profile
    counted every copy alike, so batches that ran more rounds weighed more (10–23% high in an
    audit). A batch's copies weigh 1/rounds: with examples of one length the count-weighted
    profile averages back to the estimate, as without a target."""
    torch.manual_seed(0)
    w = torch.randn(6, 3)
    x = torch.randn(8, 6, 3, generator=torch.Generator().manual_seed(4))

    def model(z):
        return (0.3 * torch.randn(1, generator=torch.Generator().manual_seed(0))
                + (z * w).sum((1, 2)))[:, None]

    metric = TokenSensitivity(model, Sequence(), sigma=0.8, target_stderr=0.05, generator=0,
                              estimand="subset", output_kind="logits")
    for i in range(len(x)):
        metric.update(x[i:i + 1])
    r = metric.compute()
    weighted = (r.per_position * r.position_counts).sum() / r.position_counts.sum()
    assert weighted.item() == pytest.approx(r.estimate, abs=1e-12)


def test_an_estimate_below_zero_never_inverts_the_interval():
    """A control variate's estimate can fall below 0; the interval clipped to [0, 1] had come
    out as (0.0000, −0.0084)."""
    from senslab.measure._stats import State, result

    st = State(n=4, s1=-0.47, s2=0.2, within=4 * 0.0559**2 * 4,
               samples=[torch.tensor([-0.1, -0.2, -0.1, -0.07])])
    r = result(st, "subset", "left", True, 1.0)
    lo, hi = r.ci95
    assert r.estimate < 0 and 0.0 <= lo <= hi <= 1.0 and hi == 0.0
    st.s1 = 4 * 1.2  # and above 1
    lo, hi = result(st, "subset", "left", True, 1.0).ci95
    assert lo == hi == 1.0


def test_token_sampling_without_a_target_on_few_pairs_says_its_error_is_unreliable():
    """allocation='uniform' learns the within-token variance from the tokens it draws twice;
    on a small batch without a target they are few, and the standard error came out 0 with
    flips seen in 29% of runs (coverage 0.68) without a word."""
    x = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.warns(RuntimeWarning, match=r"drew fewer than 64 tokens of a batch twice"):
        token_sensitivity(seeded(mlp), x, Patches(2), sigma=1.0, allocation="uniform",
                          estimand="subset")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        token_sensitivity(seeded(mlp), x, Patches(2), sigma=1.0, allocation="uniform",
                          target_stderr=0.05, estimand="subset")
        # the data standard error (the default) does not rest on the pairs
        token_sensitivity(seeded(mlp), x, Patches(2), sigma=1.0, allocation="uniform")
