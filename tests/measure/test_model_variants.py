"""Models a researcher brings that edit their inputs in place, depend on their batch or keep
state (audit variants53: D1, D3, R3–R5).

A forward that edits its input in place must be measured like its out-of-place twin, without
changing the caller's tensors; a forward whose output for one copy depends on the other copies
of its forward is refused on its first batch, also when every zero-noise copy agrees with its
clean batch; the refusals name the likely cause (dynamic quantisation, a buffer the forward
updates) and a fix that works.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.measure import TokenSensitivity, _runner
from senslab.measure._runner import VERIFY_BATCH, verify_copies
from senslab.tokens import Embedding, Patches, Sequence


def _mlp(d_in: int = 64, classes: int = 4, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # test-only: model init
    return nn.Sequential(nn.Flatten(), nn.Linear(d_in, 32), nn.Tanh(),
                         nn.Linear(32, classes)).eval()


def _images(n: int = 12, seed: int = 1) -> torch.Tensor:
    """(n, 1, 8, 8) images in [−1, 1]: about half the pixels negative."""
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed)) * 2 - 1


class InplaceNorm(nn.Module):
    """Normalises its input in place before the network (not idempotent)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.sub_(0.5).div_(0.25))


class OutOfPlaceNorm(InplaceNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - 0.5) / 0.25)


# -- D3/R4: in-place edits of the input --------------------------------------------------------


@pytest.mark.parametrize("inplace, twin", [
    (lambda net: nn.Sequential(nn.ReLU(inplace=True), net),
     lambda net: nn.Sequential(nn.ReLU(), net)),
    (InplaceNorm, OutOfPlaceNorm),
], ids=["relu_inplace", "normalise_inplace"])
def test_an_input_edited_in_place_is_measured_like_its_out_of_place_twin(inplace, twin):
    """An in-place ReLU first (idempotent: it passed the zero-noise check) made senslab measure
    f(relu(relu(x) + ε)) instead of f(relu(x + ε)) — 0.0312 against 0.0039 in the audit — and
    zeroed the caller's negative pixels; an in-place normalisation was refused with advice that
    did not help. Both are now measured copy for copy like the same model without the in-place
    edit, and the caller's images are left as they were."""
    net = _mlp()
    x = _images()
    given = x.clone()
    opts = {"sigma": 0.5, "repeats": 2, "generator": 0, "precision": "float32"}
    edited = token_sensitivity(inplace(net), x, Patches(2), **opts)
    assert torch.equal(x, given), "the caller's images were changed by the measurement"
    plain = token_sensitivity(twin(net), x, Patches(2), **opts)
    assert plain.estimate > 0
    assert torch.equal(edited.per_sample, plain.per_sample)


def test_a_sequence_clamped_in_place_is_measured_like_its_twin():
    net = _mlp(d_in=12)
    x = torch.randn(8, 4, 3, generator=torch.Generator().manual_seed(2))
    given = x.clone()
    opts = {"sigma": 0.7, "repeats": 2, "generator": 0, "precision": "float32"}
    edited = token_sensitivity(lambda t: net(t.clamp_(min=0)), x, Sequence(), **opts)
    assert torch.equal(x, given)
    plain = token_sensitivity(lambda t: net(t.clamp(min=0)), x, Sequence(), **opts)
    assert plain.estimate > 0
    assert torch.equal(edited.per_sample, plain.per_sample)


class IdsModel(nn.Module):
    """Token ids → embedding → position added (in place or not) → linear head. Its forward
    also maps out-of-vocabulary ids to 0 in place (the caller's ids must not change)."""

    def __init__(self, inplace: bool, vocab: int = 20, t: int = 6, d: int = 4) -> None:
        super().__init__()
        torch.manual_seed(3)  # test-only: model init
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(t, d))
        self.head = nn.Linear(t * d, 3)
        self.inplace, self.vocab = inplace, vocab

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        input_ids.masked_fill_(input_ids >= self.vocab, 0)
        h = self.emb(input_ids)
        h = h.add_(self.pos) if self.inplace else h + self.pos
        return self.head(h.flatten(1))


def test_embedding_inputs_and_clean_tokens_survive_in_place_edits():
    """Token ids edited in place by the forward stay the caller's; the hooked module's output,
    edited in place later in the forward (h += pos), stays the clean token that replace_with
    replaces: the copies are those of the out-of-place model."""
    ids = torch.randint(0, 25, (5, 6), generator=torch.Generator().manual_seed(4))
    given = ids.clone()
    rows = torch.randn(7, 4, generator=torch.Generator().manual_seed(5))
    opts = {"sigma": None, "replace_with": rows, "repeats": 2, "generator": 0,
            "precision": "float32", "compare": "l2"}
    edited = token_sensitivity(IdsModel(inplace=True), ids, Embedding("emb"), **opts)
    assert torch.equal(ids, given), "the caller's token ids were changed by the measurement"
    plain = token_sensitivity(IdsModel(inplace=False), ids, Embedding("emb"), **opts)
    assert plain.estimate > 0
    assert torch.allclose(edited.per_sample, plain.per_sample, rtol=1e-5, atol=1e-6)


# -- D1: a forward whose copies depend on each other -------------------------------------------


class BatchMax(nn.Module):
    """Divides its batch by the batch's largest absolute value (batch-level normalisation)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x / x.abs().amax())


def _max_one_images() -> torch.Tensor:
    """Images in [0, 1] each scaled to max 1: every example attains its batch's maximum, so
    each zero-noise copy alone agrees with the clean batch."""
    x = torch.rand(8, 1, 8, 8, generator=torch.Generator().manual_seed(6))
    return x / x.amax(dim=(1, 2, 3), keepdim=True)


def test_a_batch_max_normalisation_is_refused_although_zero_noise_copies_agree():
    """Chunks of noisy copies are divided by their largest noisy value, so the number moved
    with chunk_size (audit: 0.113 at the automatic size, 0.066 one at a time) without a word;
    noisy copies evaluated together and in halves disagree: refused, naming the cause and a
    fix."""
    model = BatchMax(_mlp())
    x = _max_one_images()
    with pytest.raises(RuntimeError, match=r"depends on the other examples in its forward "
                                           r"pass(?s:.*)batch max(?s:.*)chunk_size=1"):
        token_sensitivity(model, x, Patches(2), sigma=0.5, precision="float32")
    with pytest.raises(RuntimeError, match="depends on the other examples in its forward"):
        token_sensitivity(model, x, Patches(2), sigma=0.5, mode="whole", precision="float32")
    with pytest.raises(RuntimeError, match="depends on the other examples in its forward"):
        TokenSensitivity(model, Patches(2), sigma=0.5, eval_mode=False).update(x)


def test_a_batch_dependent_model_that_returns_labels_is_refused_in_float32():
    """A ``predict`` returning class labels skipped the batch check. Here the label is whether
    an image attains its batch's maximum: every clean image (each scaled to max 1) does, alone
    or in its batch, so the zero-noise check passes, while among noisy copies only the largest
    of each forward does: the number moved with chunk_size without a word (0 one copy at a time,
    0.94 in chunks of 16, 0.98 at the automatic size). In float32 the labels of copies
    evaluated together and in two halves are compared exactly."""
    def predict(t: torch.Tensor) -> torch.Tensor:
        return (t.flatten(1).amax(1) >= t.amax()).long()

    x = _max_one_images()
    alone = token_sensitivity(predict, x, Patches(2), sigma=0.5, precision="float32",
                              chunk_size=1, generator=0)
    assert alone.estimate == 0  # alone, every copy attains its own batch's maximum
    with pytest.raises(RuntimeError, match=r"other class labels(?s:.*)batch max"):
        token_sensitivity(predict, x, Patches(2), sigma=0.5, precision="float32", generator=0)
    ordinary = _mlp()
    b, c = (token_sensitivity(lambda t: ordinary(t).argmax(1), x, Patches(2), sigma=0.5,
                              precision="float32", generator=0, chunk_size=size)
            for size in (None, 1))
    assert b.estimate == c.estimate  # an ordinary label model passes, with the same numbers


def test_labels_of_a_bf16_model_are_not_compared_exactly(monkeypatch):
    """Under reduced precision rounding that changes with the batch may move a label, so the
    batch check compares labels exactly only in float32: a bf16 module (its own weights, not
    autocast) counts as reduced precision too."""
    flags: list[bool] = []
    real = _runner._verify_batch

    def seen(*args, **kwargs):
        flags.append(kwargs.get("labels", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(_runner, "_verify_batch", seen)

    class Labels(nn.Module):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.net(t.to(next(self.net.parameters()).dtype)).argmax(1)

    for dtype, exact in ((torch.float32, True), (torch.bfloat16, False)):
        token_sensitivity(Labels(_mlp().to(dtype)).eval(), _images(), Patches(2), sigma=0.5,
                          precision="float32", generator=0)
        assert flags[-1] is exact, dtype


def test_the_batch_check_is_skipped_when_every_copy_is_evaluated_alone():
    """alone=True (chunk_size=1 in float32: one copy per forward) has nothing to check."""
    model = BatchMax(_mlp())
    x = _max_one_images()
    with Patches(2).bind(model, x) as bound, torch.inference_mode():
        verify_copies(bound, bound.clean_output, False, None, False, alone=True)
        with pytest.raises(RuntimeError, match="depends on the other examples"):
            verify_copies(bound, bound.clean_output, False, None, False)


def test_the_batch_check_costs_three_forwards_and_leaves_the_numbers_alone(monkeypatch):
    """An ordinary model passes (also in bf16 under autocast and with a checked precision);
    the check takes three forwards on the first batch of a shape (VERIFY_BATCH copies, then
    their two halves), none later, and its noise has a generator of its own: a seed gives the
    numbers it gives without the check."""
    net = _mlp()
    calls = []

    def counted(t: torch.Tensor) -> torch.Tensor:
        calls.append(len(t))
        return net(t)

    x = _images()

    def measure(**kw):
        metric = TokenSensitivity(counted, Patches(2), sigma=0.5, repeats=2, generator=0,
                                  chunk_size=64, **kw)
        metric.update(x)
        later = len(calls)
        metric.update(x)
        return metric.compute().per_sample, later, len(calls) - later

    checked, first, again = measure(precision="float32")
    first_rows = list(calls[:first])
    for kw in ({"autocast": torch.bfloat16}, {"precision": "int8-checked"}):
        measure(**kw)  # not refused
    monkeypatch.setattr(_runner, "_verify_batch", lambda *a, **k: None)
    calls.clear()
    unchecked, bare, again_bare = measure(precision="float32")
    assert torch.equal(checked, unchecked)
    assert first - bare == 3 and again == again_bare
    extra = first_rows[1 + 2 * 2:1 + 2 * 2 + 3]  # after the clean batch and the zero-noise copies
    assert extra == [VERIFY_BATCH, VERIFY_BATCH // 2, VERIFY_BATCH - VERIFY_BATCH // 2]


# -- R3/R5 and the reuse hint: refusals name the cause --------------------------------------


def _quantized(net: nn.Module) -> nn.Module:
    if "fbgemm" not in torch.backends.quantized.supported_engines and \
            "x86" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch build has no quantised CPU kernels")
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)


def test_a_dynamically_quantised_model_is_refused_naming_the_cause_and_a_fix():
    """quantize_dynamic takes each forward's activation range from its batch; the refusal used
    to blame BatchNorm and suggest reuse_local=False, which fails the same way."""
    model = _quantized(_mlp())
    with pytest.raises(RuntimeError, match=r"dynamically quantised(?s:.*)quantize_dynamic"
                                           r"(?s:.*)int8-checked(?s:.*)chunk_size=1") as err:
        token_sensitivity(model, _images(), Patches(2), sigma=0.5, precision="float32")
    assert "reuse_local" not in str(err.value)
    # one example per update: the zero-noise check passes, the copies of a chunk do not
    with pytest.raises(RuntimeError, match=r"depends on the other examples(?s:.*)"
                                           r"quantize_dynamic"):
        TokenSensitivity(model, Patches(2), sigma=0.5, precision="float32").update(_images()[:1])


class RunningMean(nn.Module):
    """Updates a running mean of its inputs in every forward, also in eval mode."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mu", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.mu.mul_(0.9).add_(0.1 * x.mean())
        return self.net(x - 10 * self.mu)


def test_a_forward_that_updates_a_buffer_is_refused_naming_the_buffer():
    with pytest.raises(RuntimeError, match=r"changed between two evaluations(?s:.*)"
                                           r"updates the buffer\(s\) 'mu'"):
        token_sensitivity(RunningMean(_mlp()), _images() + 0.5, Patches(2), sigma=0.5,
                          precision="float32")


def test_a_refused_measurement_leaves_the_buffer_the_forward_updated_in_eval_mode():
    """The refusal above used to leave ``mu`` changed by the measurement's forwards (0 → 0.058):
    buffers were restored only with eval_mode=False."""
    model = RunningMean(_mlp())
    with pytest.raises(RuntimeError, match="updates the buffer"):
        token_sensitivity(model, _images() + 0.5, Patches(2), sigma=0.5, precision="float32")
    assert model.mu.item() == 0.0


class Reassigning(nn.Module):
    """Replaces its buffer by a new tensor in every training-mode forward (a step counter)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.steps = self.steps + 1
        return self.net(x)


def test_a_buffer_the_forward_replaces_is_put_back_by_name_outside_eval_mode():
    """With eval_mode=False the buffers were kept by tensor identity: a forward that assigns a
    new tensor to ``self.steps`` left the model holding the measurement's count (14)."""
    model = Reassigning(_mlp()).train()
    before = model.steps
    token_sensitivity(model, _images(), Patches(2), sigma=0.5, eval_mode=False,
                      precision="float32", generator=0)
    assert model.steps is before and model.steps.item() == 0.0 and model.training


def test_a_batch_dependent_refusal_suggests_reuse_options_only_when_reuse_is_on():
    class Centred(nn.Module):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x - x.mean(0, keepdim=True))

    with pytest.raises(RuntimeError, match=r"other examples in its batch(?s:.*)BatchNorm"
                                           r"(?s:.*)chunk_size=1") as err:
        token_sensitivity(Centred(_mlp()), _images(), Patches(2), sigma=0.5)
    assert "reuse_local" not in str(err.value)  # this model has no local reuse to turn off


def test_the_batch_check_runs_once_per_metric_not_per_padded_width(monkeypatch):
    """Text batches of new padded widths are new input shapes; the batch check, a property of
    the model and the options, ran again on each (+18% model calls on 16 batches of the zoo's
    RoBERTa). It runs on the first batch only; the zero-noise checks still run per shape."""
    net = _mlp(d_in=8)
    seen: list[int] = []
    real = _runner._verify_batch

    def counted(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_runner, "_verify_batch", counted)
    metric = TokenSensitivity(lambda t: net(t.flatten(1)), Sequence(), sigma=0.5, generator=0)
    for width in (2, 4, 8):  # (B, T, D): T·D = 8 features for every width
        metric.update(torch.randn(3, width, 8 // width, generator=torch.Generator()
                                  .manual_seed(width)))
    assert len(seen) == 1 and len(metric._verified) == 3


def test_buffers_on_the_meta_device_or_holding_nan_are_left_alone():
    """Restoring buffers (on in eval mode too) crashed on an unused meta placeholder buffer
    (aten::equal has no meta kernel), after the whole measurement; and a NaN buffer counted as
    changed (NaN ≠ NaN) was rewritten on every call, breaking a pending backward through it."""
    net = _mlp()
    net.register_buffer("placeholder", torch.empty(3, device="meta"))
    net.register_buffer("unset", torch.full((2,), float("nan")))
    scale = nn.Parameter(torch.ones(()))
    pending = (net.unset.nan_to_num() * scale).sum()  # a graph that saved the NaN buffer
    before = net.unset._version
    r = token_sensitivity(net, _images(), Patches(2), sigma=0.5, precision="float32",
                          generator=0)
    assert 0 <= r.estimate <= 1 and net.placeholder.is_meta
    assert net.unset._version == before
    pending.backward()  # the buffer it saved was not written
