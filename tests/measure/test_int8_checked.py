"""Checked int8 (``precision="int8-checked"``, senslab.measure._int8 and ._precision): the
model's linear layers as int8 products, copies near a class boundary again in float32 — the
flips of a float32 run, copy by copy — and ``"auto"``'s timed judgement of whether checking
pays."""

from __future__ import annotations

import copy
import functools
import re
from types import SimpleNamespace

import pytest
import torch
from checked_flips import (
    PAD,
    Recorder,
    assert_float32_flips,
    assert_paired_comparison_equals_float32,
    right_padded,
    run,
)
from torch import nn

from senslab.measure import TokenSensitivity, _chunks, _int8, _precision, _runner
from senslab.models import create_model
from senslab.tokens import Embedding, Patches, Sequence
from senslab.tokens.patches import _BoundPatches

pytestmark = pytest.mark.skipif(not _int8.available(),
                                reason="this torch has no x86 quantised linear kernels")


def mlp(seed: int = 0) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model.eval()


# -- the int8 linear layers ---------------------------------------------------------------------


def test_linear_layers_run_in_int8_and_the_head_in_float32():
    model, x = mlp(), torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model(x)
        mode = _int8.Int8Linears()
        with mode:
            low = model(x)
    assert mode.calls == 2  # the 3-wide head is narrower than MIN_FEATURES
    err = float((low - full).norm() / full.norm())
    assert 0 < err < 0.05  # an int8 product: close to float32, not equal
    with torch.inference_mode(), mode:
        h = model[:4](x)
        head = model[4](h)  # inside the mode, on the int8 hidden state
    with torch.inference_mode():
        # the head, narrower than MIN_FEATURES, ran in float32: exactly float32's product
        assert torch.equal(head, torch.nn.functional.linear(h, model[4].weight, model[4].bias))


def test_ineligible_calls_keep_float32_exactly():
    model, x = mlp(), torch.randn(8, 128)
    mode = _int8.Int8Linears()
    with torch.inference_mode():
        full = model(x)
        with mode, mode.off():  # suspended (the clean caches of prefix and local reuse)
            assert torch.equal(model(x), full)
    with mode:  # gradients to carry: float32
        y = model(x.requires_grad_())
    assert torch.equal(y.detach(), full) and mode.calls == 0
    with torch.inference_mode(), mode:  # float64 input and weights: float64
        y64 = model.double()(x.detach().double())
    assert y64.dtype == torch.float64 and mode.calls == 0


def test_packed_weights_follow_in_place_updates():
    model, x = mlp(), torch.randn(16, 128)
    mode = _int8.Int8Linears()
    with torch.inference_mode(), mode:
        before = model[0](x)
        model[0].weight.mul_(2)  # an in-place update bumps the version: packed again
        model[0].bias.mul_(2)
        after = model[0](x)
    assert torch.allclose(after, 2 * before, rtol=0.02, atol=0.02)
    assert len(mode.packs) == 2


class _ComputedBias(nn.Module):
    """timm's EVA/BEiT attention: the query/key/value bias concatenated inside ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.w = nn.Parameter(torch.randn(128, 64, generator=g) / 8)
        self.b = nn.Parameter(torch.randn(128, generator=g))
        self.head = nn.Linear(128, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = torch.cat([self.b[:64], torch.zeros_like(self.b[64:])])
        return self.head(nn.functional.linear(x.flatten(1), self.w, bias).relu())


def test_a_bias_made_inside_the_forward_runs_in_int8_with_float32_flips():
    """A bias made in the forward under inference mode has no version counter: keying the
    packed-weight cache on it raised a raw "Inference tensors do not track version counter"
    under the default precision (timm's EVA on an int8 CPU)."""
    model, x = _ComputedBias().eval(), torch.randn(8, 1, 8, 8,
                                                   generator=torch.Generator().manual_seed(3))
    mode = _int8.Int8Linears()
    with torch.inference_mode(), mode:
        model(x)
        model(x)
    assert mode.calls == 2 and len(mode.packs) == 0  # packed afresh, never cached
    ref = TokenSensitivity(model, Patches(2), sigma=1.0, precision="float32", estimand="subset")
    ref.update(x)
    low = TokenSensitivity(model, Patches(2), sigma=1.0, precision="int8-checked",
                           estimand="subset")
    low.update(x)
    assert torch.equal(low.compute().per_sample, ref.compute().per_sample)


# -- float32's flips --------------------------------------------------------------------------


@functools.cache
def hf_bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=128,
                                     max_position_embeddings=32, num_labels=3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     pad_token_id=PAD)
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    return transformers.BertForSequenceClassification(config).eval()


def test_hf_bert_from_config_gets_float32_flips():
    model = hf_bert()
    assert_float32_flips(model, right_padded(32, 12), Embedding("bert.embeddings.LayerNorm"),
                         low="int8", sigma=2.0, repeats=2)


def test_zoo_text_model_where_plain_int8_changes_decisions(monkeypatch):
    model = create_model("roberta", vocab_size=50, max_len=16, dim=64, layers=2, heads=2,
                         dropout=0.0, seed=3)
    batch, tokens = right_padded(32, 12), Embedding("embed_ln")
    opts = {"sigma": 3.0, "repeats": 16, "mode": "whole"}
    full = run(model, batch, tokens, precision="float32", **opts)
    with monkeypatch.context() as patch:  # no band: int8's own decisions after calibration
        patch.setattr(_precision, "SAFETY", 0.0)
        plain = run(model, batch, tokens, precision="int8-checked", **opts)
    assert plain.check_bound == 0.0
    assert int((plain.copies != full.copies).sum()) > 0  # int8 alone changes some flips …
    assert_float32_flips(model, batch, tokens, low="int8", **opts)  # … checked int8: none


class Branching(nn.Module):
    """A small CNN whose forward branches on a tensor's value: FX cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8, 3)  # narrower than int8's linear layers

    def forward(self, x):
        h = self.conv(x)
        if float(h.mean()) > 1e9:  # never taken, but a tensor's value decides
            h = -h
        return self.head(h.relu().mean((2, 3)))


def test_a_model_without_layers_to_run_in_int8_stays_float32():
    """No linear layer wide enough, and convolutions FX cannot trace: float32, said so."""
    torch.manual_seed(0)
    model = Branching().eval()
    assert not _int8.StaticInt8.applies(model)
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    m = run(model, x, Patches(2), sigma=0.5, precision="int8-checked")
    r = m.compute()
    assert m.checked_precision == "float32" and r.recheck_fraction is None
    assert r.num_forward_fp32 == 0 and m.check_bound is None
    assert m.float32_reason == (f"int8 found no linear layer with {_int8.MIN_FEATURES} or more "
                                "input and output features to run")


def strips(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """16×16 images in [−1, 1], labelled by which of three vertical strips is brightest."""
    x = torch.rand(n, 1, 16, 16, generator=g) * 2 - 1
    y = torch.stack([x[..., :, s:s + 5].mean((1, 2, 3)) for s in (0, 5, 11)], 1).argmax(1)
    return x, y


@functools.cache
def trained_resnet() -> nn.Module:
    """A narrow zoo ResNet (two stages of one block) trained 60 Adam steps on :func:`strips`
    (about 2 s): margins as training leaves them, where a random network's are either far
    wider or far narrower than int8's error."""
    torch.manual_seed(0)  # test-only: the zoo's vision models initialise from the global RNG
    model = create_model("resnet18", image_size=16, in_channels=1, num_classes=3, width=0.25,
                         blocks=(1, 1))
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        x, y = strips(64, g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.heavy
def test_a_convolutional_model_runs_its_static_int8_copy_with_float32_flips(monkeypatch):
    """A CNN that FX traces runs as a static int8 graph (its first and last layer float) on
    whole copies — local reuse off for the int8 pass, on for the float32 re-checks — with
    float32's flips; without the band, the int8 graph's own decisions differ on some copies."""
    model = trained_resnet()
    x, _ = strips(48, torch.Generator().manual_seed(1))
    opts = {"sigma": 1.5, "repeats": 2}
    m = assert_float32_flips(model, x, Patches(4), low="int8", **opts)
    static = m._check._static
    assert static is not None and static.model is not None and not static.failed
    kinds = [type(mod).__name__ for mod in static.model.modules()]
    assert "ConvReLU2d" in kinds  # convolutions fused with their ReLU
    assert any(type(mod).__module__.startswith("torch.ao.nn.quantized") for mod in
               static.model.modules())  # int8 layers …
    convs = [mod for mod in static.model.modules() if isinstance(mod, nn.Conv2d)]
    assert convs and type(convs[0]) is nn.Conv2d  # … the first convolution float
    # the int8 graph gave the low outputs (float32 re-evaluated by local reuse would leave a
    # band of rounding size)
    assert m.check_bound > 1e-3
    full = run(model, x, Patches(4), precision="float32", **opts)
    with monkeypatch.context() as patch:
        patch.setattr(_precision, "SAFETY", 0.0)
        plain = run(model, x, Patches(4), precision="int8-checked", **opts)
    assert int((plain.copies != full.copies).sum()) > 0


def test_building_the_static_int8_copy_leaves_the_global_generator_alone():
    """torch's FX conversion draws from the global generator; a measurement must not move the
    caller's stream (their shuffling or initialisation after it would change)."""
    model = trained_resnet()
    x, _ = strips(8, torch.Generator().manual_seed(1))
    before = torch.get_rng_state()
    m = TokenSensitivity(model, Patches(4), sigma=1.5, precision="int8-checked", generator=0)
    m.update(x)
    assert m._check._static is not None and m._check._static.model is not None
    assert torch.equal(torch.get_rng_state(), before)


def test_a_calibrated_check_gathers_its_rechecks_over_several_chunks(monkeypatch):
    """Past the calibration, int8 runs a chunk (here 16 copies) per forward, and float32
    re-checks the near-boundary copies of several chunks together, in forwards of up to a
    chunk: fewer, fuller float32 forwards — and still float32's flips."""
    model = trained_resnet()
    x, _ = strips(48, torch.Generator().manual_seed(1))
    calls: list[tuple[bool, int]] = []  # (int8 pass?, copies) of every perturbed forward
    forward = _BoundPatches.forward_perturbed

    def spy(self, src, tok, noise):
        calls.append((bool(getattr(self.model, "full_copies", False)), len(src)))
        return forward(self, src, tok, noise)

    monkeypatch.setattr(_BoundPatches, "forward_perturbed", spy)
    opts = {"sigma": 1.5, "repeats": 2, "chunk_size": 16}
    m = assert_float32_flips(model, x, Patches(4), low="int8", **opts)
    share = m._check.predicted_recheck
    assert share is not None and 0 < share < 0.5
    gather = _runner.ChunkRunner._gather(SimpleNamespace(check=m._check, whole=False))
    assert gather == min(_runner.GATHER_MAX, int(1 / max(share, 1 / _runner.GATHER_MAX))) > 1
    checked = calls[len(calls) // 2:]  # the checked run's calls (the float32 run's first)
    low = [n for is_int8, n in checked if is_int8]
    assert max(low) <= 16
    # after the calibration (its copies: float32 chunk by chunk), a gathered call's re-checks
    # fill forwards of a chunk (never more), the last one of the call partly
    chunks = len(x) * 16 * 2 // 16
    calibration = _precision.CALIBRATION_COPIES // 16
    rechecks = [n for is_int8, n in checked[calibration * 2:] if not is_int8]
    calls = -(-(chunks - calibration) // gather)
    assert max(rechecks) <= 16 and len(rechecks) <= calls + sum(rechecks) // 16
    # fuller than one chunk's share (as it came out: the calibration's prediction is the
    # machine's int8 error's, and overshot it 0.39 against 0.31 on a Zen 4), and fewer than
    # one per chunk (a gathered call splits into forwards of a chunk); without gathering the
    # mean would be that share exactly, and there would be one forward a chunk
    came = sum(rechecks) / ((chunks - calibration) * 16)
    assert sum(rechecks) / len(rechecks) > 1.5 * 16 * came
    assert len(rechecks) < (chunks - calibration) / min(gather, 2) + sum(rechecks) // 16


def test_a_later_batch_of_another_shape_probes_its_chunk_size_on_a_probe_alone(monkeypatch):
    """Past the calibration, a batch of another width sizes its chunks afresh: its probe
    evaluates the probe's copies alone, not the chunks a calibrated check would gather (their
    peak over that many copies would size chunks several times too large)."""
    model = create_model("roberta", vocab_size=50, max_len=16, dim=64, layers=2, heads=2,
                         dropout=0.0, seed=3)
    probed: list[int] = []
    sized = _runner.ChunkRunner._sized

    def spy(self, width, full, own):
        probed.append(int(own.sum()))
        sized(self, width, full, own)

    monkeypatch.setattr(_runner.ChunkRunner, "_sized", spy)
    m = TokenSensitivity(model, Embedding("embed_ln"), sigma=3.0, repeats=16, generator=0,
                         precision="int8-checked")
    m.update(right_padded(32, 12))
    assert m._check.bound is not None  # calibrated: later chunks are gathered
    assert _runner.ChunkRunner._gather(SimpleNamespace(check=m._check, whole=False)) > 1
    m.update(right_padded(32, 16, seed=1))  # another width: a new probe
    assert probed == [_chunks.PROBE_COPIES] * 2


def test_gathering_follows_the_predicted_share():
    check = _precision.PrecisionCheck()
    runner = SimpleNamespace(check=check, whole=False)
    gather = functools.partial(_runner.ChunkRunner._gather, runner)
    assert gather() == 1  # calibrating
    check.bound = 1.0
    for share, k in ((None, 1), (1.0, 1), (0.6, 1), (0.3, 3), (0.14, 7), (0.01, 8), (0.0, 8)):
        check.predicted_recheck = share
        assert gather() == k
    check.idle = True  # float32 from here on
    assert gather() == 1
    check.idle, runner.whole = False, True  # whole-input noise: one chunk's noise per call
    assert gather() == 1


def test_the_static_int8_copy_is_remade_when_the_weights_change():
    """Between batches the model trains (here: its head flipped in place, which changes most
    decisions): the int8 copy of the old weights would decide them wrongly with wide margins,
    so a changed parameter or buffer makes a new copy, calibrated afresh — float32's flips."""
    x, _ = strips(24, torch.Generator().manual_seed(1))
    opts = {"sigma": 1.5, "repeats": 2}
    model = copy.deepcopy(trained_resnet())
    checked = Recorder(model, Patches(4), generator=5, precision="int8-checked", **opts)
    checked.update(x)
    first = checked._check._static
    with torch.no_grad():
        model.head.weight.neg_()  # in place: the same tensor, a new version
    checked.update(x)
    assert checked._check._static is not first and checked._check._static.model is not None
    # float32 on the new weights, the same two batches' draws
    reference = Recorder(copy.deepcopy(model), Patches(4), generator=5, precision="float32",
                         **opts)
    reference.update(x)
    reference.update(x)
    half = len(checked.copies) // 2
    assert torch.equal(checked.copies[half:], reference.copies[half:])
    assert not torch.equal(checked.copies[:half], checked.copies[half:])  # decisions changed


class ConvText(nn.Module):
    """Token ids → embedding → LayerNorm (the tokens) → a 2-D convolution over (position,
    feature) → mean → head: FX traces it, but its inputs are token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.embed_ln = nn.LayerNorm(8)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)

    def forward(self, ids):
        return self.head(self.conv(self.embed_ln(self.embedding(ids))[:, None]).mean((2, 3)))


def test_a_convolutional_model_fed_token_ids_gets_no_static_copy():
    """The noise enters inside the model (``Embedding``), so whole copies are token ids with
    nothing to calibrate int8 activations on: no static copy, float32's flips."""
    torch.manual_seed(0)
    model = ConvText().eval()
    assert _int8.StaticInt8.applies(model)
    ids = torch.randint(0, 20, (6, 10), generator=torch.Generator().manual_seed(0))
    m = run(model, ids, Embedding("embed_ln"), sigma=3.0, repeats=4,
            precision="int8-checked")
    full = run(model, ids, Embedding("embed_ln"), sigma=3.0, repeats=4, precision="float32")
    assert m._check._static is None and m.checked_precision == "float32"
    assert torch.equal(m.copies, full.copies) and 0 < full.compute().estimate < 1


def test_a_training_step_between_batches_starts_a_new_calibration():
    """The bound is measured on the model's own errors; after its weights change (here: a
    hidden layer scaled in place, which scales every later value and int8's error with it)
    the next batch calibrates afresh, and nothing changes while the weights stay."""
    model = mlp()
    flat = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), model).eval()
    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    m = TokenSensitivity(flat, Patches(2), sigma=3.0, repeats=4, generator=0,
                         precision="int8-checked")
    m.update(x)
    first = m.check_bound
    m.update(x)
    assert m.check_bound == first  # the same weights: the same calibration
    with torch.no_grad():
        model[2].weight.mul_(8.0)
    m.update(x)
    assert m.check_bound is not None and m.check_bound > 2 * first


@pytest.mark.parametrize("low", ["int8", "bf16"])
def test_a_write_through_data_between_batches_is_seen(low):
    """``p.data.copy_``/``p.data.mul_`` (a manual SGD step written the old way) bump no version
    counter and keep the address: the content fingerprint still sees them, so the second batch
    is not run with the old packed int8 weights or the old bound."""
    g = torch.Generator().manual_seed(2)
    x1, x2 = torch.randn(64, 8, 16, generator=g), torch.randn(64, 8, 16, generator=g)
    new = torch.randn(128, 128, generator=torch.Generator().manual_seed(9)) * 0.2
    copies = {}
    for precision in ("float32", f"{low}-checked"):
        gen = torch.Generator().manual_seed(1)
        model = nn.Sequential(nn.Flatten(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128),
                              nn.ReLU(), nn.Linear(128, 4)).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        m = Recorder(model, Sequence(), generator=5, precision=precision, sigma=1.0,
                     chunk_size=64)
        m.update(x1)
        version = model[3].weight._version
        model[3].weight.data.copy_(new)
        model[1].weight.data.mul_(-1.0)
        assert model[3].weight._version == version  # what a version check alone misses
        m.update(x2)
        copies[precision] = m.copies
    assert torch.equal(copies[f"{low}-checked"], copies["float32"])
    assert 0 < copies["float32"].float().mean() < 1


def test_the_static_int8_copy_falls_back_to_float_if_it_cannot_run(monkeypatch):
    """A quantised graph that fails on its first inputs leaves every call to the float model:
    float32's numbers, the rest of the copies in float32."""
    model = trained_resnet()
    x, _ = strips(3, torch.Generator().manual_seed(1))

    def broken(*args, **kwargs):
        raise RuntimeError("no int8 kernel")

    monkeypatch.setattr("torch.ao.quantization.quantize_fx.convert_fx", broken)  # imports it
    full = run(model, x, Patches(4), precision="float32", sigma=1.5, repeats=2)
    m = run(model, x, Patches(4), precision="int8-checked", sigma=1.5, repeats=2)
    assert m._check._static.failed and m.checked_precision == "float32"
    assert m.float32_reason.startswith("the static int8 copy of the model could not be made")
    assert torch.equal(m.copies, full.copies)


class _RefusingGraph(nn.Module):
    """A quantised graph whose kernels refuse the inputs of a later batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"no int8 kernel for inputs of shape {tuple(x.shape)}")


def test_a_static_int8_copy_failing_on_a_later_batch_names_float32(monkeypatch):
    """A static copy that ran the first batch and fails on a later one falls back to the
    float model (said once): the result names float32 and why, not int8-checked, and the
    flips stay float32's. Before, checked_precision still said "int8" and every later copy
    was 'checked' against float32 again, at twice float32's cost."""
    model = trained_resnet()
    x, _ = strips(18, torch.Generator().manual_seed(1))
    opts = {"sigma": 1.5, "repeats": 2, "generator": 5}
    full = Recorder(model, Patches(4), precision="float32", **opts)
    m = Recorder(model, Patches(4), precision="int8-checked", **opts)
    for metric in (full, m):  # 384 copies: calibrated (256), then checked
        metric.update(x[:12])
    static = m._check._static
    assert static is not None and static.model is not None and not static.failed
    assert m.checked_precision == "int8" and m.check_bound is not None
    monkeypatch.setattr(static, "model", _RefusingGraph())
    with pytest.warns(RuntimeWarning, match="static int8 copy of the model failed"):
        m.update(x[12:16])
    assert static.failed
    assert m.checked_precision == "float32"
    assert m.float32_reason.startswith("the static int8 copy of the model could not be made")
    checked = m.state.checked
    m.update(x[16:])  # later batches: float32 alone, none checked
    assert m.state.checked == checked
    for batch in (x[12:16], x[16:]):
        full.update(batch)
    assert torch.equal(m.copies, full.copies)


def test_paired_comparison_in_checked_int8_equals_float32():
    assert_paired_comparison_equals_float32("int8", dim=64)


def test_the_bound_widens_with_the_chunks_quantisation_steps():
    """int8's error grows with each call's input range (its quantisation step), which a chunk
    shares: a chunk whose ranges exceed the calibration's gets a proportionally wider band;
    so does bf16's, whose rounding grows with the values. A static int8 copy's ranges are
    fixed: a copy past them is widened in proportion, and one far past them (clamped) is
    always re-checked."""
    check = _precision.PrecisionCheck()
    check.use("int8")
    check._ranges = [1.0, 2.0]
    for now, widening in (([0.5, 2.0], 1.0), ([3.0, 2.0], 3.0), ([1.0, 5.0], 2.5),
                          ([1.0, 2.0, 0.1], float("inf"))):  # a call never calibrated
        check._int8.ranges = now
        assert check._widening(4) == widening
    check.use("bf16")
    check._ranges = [1.0, 2.0]
    check._recorder().ranges = [torch.tensor(3.0), torch.tensor(1.0)]
    assert check._widening(4) == 3.0
    static = _precision.PrecisionCheck()
    static.use("int8")
    static._static = _int8.StaticInt8(nn.Sequential())
    static._ranges = [2.0, 2.0]  # one hand-over: its reach above 0, and below 0
    static._recorder().ranges = [torch.tensor([1.0, 2.5, 4.0]), torch.zeros(3)]  # per copy
    assert static._widening(3).tolist() == [1.0, 1.25, float("inf")]
    # an affine range reaching far above 0 and barely below it: a copy 2 below 0 is clamped
    # at -0.1 (its largest |x| of 2 was well within the 5 above 0, and read as no widening)
    static._ranges = [5.0, 0.1]
    static._recorder().ranges = [torch.tensor([4.0, 1.0]), torch.tensor([0.05, 2.0])]
    assert static._widening(2).tolist() == [1.0, float("inf")]
    rec = _precision._Ranges("static")  # what the hand-over records: each side apart
    with rec:
        torch.quantize_per_tensor(torch.tensor([[4.0, -0.5], [1.0, -2.0]]), 0.1, 0,
                                  torch.quint8)
    assert [r.tolist() for r in rec.ranges] == [[4.0, 1.0], [0.5, 2.0]]
    static._ranges = [5.0, 0.0]  # never below 0 in the calibration: 0 is its low end
    static._recorder().ranges = [torch.tensor([4.0, 4.0]), torch.tensor([0.0, 0.5])]
    assert static._widening(2).tolist() == [1.0, float("inf")]


def test_a_batch_with_wider_activations_than_the_calibration_keeps_float32_flips():
    model, g = mlp(), torch.Generator().manual_seed(0)
    wide = nn.Linear(64, 128)
    with torch.no_grad():  # seeded: drawn from the global generator it varied with test order
        w = torch.Generator().manual_seed(1)
        wide.weight.copy_(torch.randn(128, 64, generator=w) / 8)
        wide.bias.copy_(torch.randn(128, generator=w) / 8)
    flat = nn.Sequential(nn.Flatten(), wide, model).eval()
    first = torch.randn(32, 1, 8, 8, generator=g)
    second = torch.randn(32, 1, 8, 8, generator=g) * 10  # every layer's inputs wider

    def run(precision):
        m = TokenSensitivity(flat, Patches(2), sigma=3.0, repeats=4, generator=0,
                             precision=precision)
        m.update(first)
        before = (m.state.checked, m.state.forward_fp32)
        m.update(second)
        return m, before

    full, _ = run("float32")
    checked, (copies, rechecked) = run("int8-checked")
    r = checked.compute()
    assert torch.equal(r.per_sample, full.compute().per_sample)
    assert 0 < full.compute().estimate < 1
    # past the calibration, the first batch's share re-checked; the second's, with its band
    # widened by its wider ranges, far larger (without the widening, its margins and outputs
    # grow alike and its share stays near the first's: 0.014 against 0.002 where this was
    # written, 0.187 with it)
    first_share = (rechecked - _precision.CALIBRATION_COPIES) / (
        copies - _precision.CALIBRATION_COPIES)
    second_share = (checked.state.forward_fp32 - rechecked) / (checked.state.checked - copies)
    assert second_share > 5 * first_share + 0.05
    print(f"re-checked: first batch {first_share:.3f}, second {second_share:.3f}")


# -- "auto" ------------------------------------------------------------------------------------


def _auto(monkeypatch, pays: bool, int8_speedup: float = 4.0) -> None:
    monkeypatch.setattr(_precision, "bf16_pays", lambda device: False)
    monkeypatch.setattr(_precision, "int8_pays", lambda device: True)
    monkeypatch.setattr(_precision, "_int8_gemm_speedup", lambda threads: int8_speedup)
    # the timed judgement finds a gain, or none, whatever this machine's speeds
    monkeypatch.setattr(_precision.PrecisionCheck, "_pays",
                        lambda self: pays or not self.judge)


@pytest.mark.parametrize("pays", [True, False])
def test_auto_checks_int8_or_falls_back_to_float32(monkeypatch, pays):
    _auto(monkeypatch, pays)
    model = hf_bert()
    batch, tokens = right_padded(32, 12), Embedding("bert.embeddings.LayerNorm")
    full = run(model, batch, tokens, precision="float32", sigma=2.0, repeats=2)
    auto = run(model, batch, tokens, sigma=2.0, repeats=2)
    assert torch.equal(auto.copies, full.copies)
    r = auto.compute()
    if pays:
        assert auto.checked_precision == "int8" and auto.check_bound is not None
        assert auto.float32_reason is None
    else:
        assert re.fullmatch(r"\"auto\"'s timed calibration found no gain: int8 would re-check "
                            r"\d+% of the copies in float32, and a checked copy would cost "
                            r"\d\.\d\d of a float32 one", auto.float32_reason)
        # judged once JUDGE_AFTER calibration copies are in: the copies of the chunk that
        # reached them were all evaluated in float32 too, every later one only in float32
        assert auto.checked_precision == "float32" and auto.check_bound is None
        assert 0 < r.num_forward_fp32
        assert r.num_forward_fp32 < _precision.CALIBRATION_COPIES


@pytest.mark.parametrize("large", [True, False], ids=["large-batch", "small-batch"])
def test_auto_builds_a_static_int8_copy_on_large_batches_only(monkeypatch, large):
    """``"auto"`` runs a convolutional model's static int8 copy — judged like the linear
    layers, with float32's flips — only where the first batch makes AUTO_STATIC_COPIES copies
    or more; on a smaller one it does not build it (and this CNN has no linear layer to run in
    int8, so it stays in float32)."""
    _auto(monkeypatch, True)
    monkeypatch.setattr(_precision, "AUTO_STATIC_COPIES", 1000)
    model = trained_resnet()
    x, _ = strips(48 if large else 8, torch.Generator().manual_seed(1))  # 16 patches × 2 draws
    opts = {"sigma": 1.5, "repeats": 2}
    full = run(model, x, Patches(4), precision="float32", **opts)
    auto = run(model, x, Patches(4), **opts)
    assert torch.equal(auto.copies, full.copies)
    static = auto._check._static
    if large:
        assert static is not None and static.model is not None and not static.failed
        assert auto.checked_precision == "int8" and auto.check_bound > 1e-3
    else:
        assert static is None and auto.checked_precision == "float32"


@pytest.mark.parametrize("reuse", [True, False], ids=["local-reuse", "whole-copies"])
def test_auto_builds_no_static_copy_against_local_reuse_where_int8_is_barely_faster(
        monkeypatch, reuse):
    """The static int8 copy runs whole copies; local reuse runs a cheaper part of one in
    float32. Where the int8 product is only 1.5× float32's (an AVX2 CPU without VNNI, whose
    static ResNet-18 copy cost as much per copy as local reuse), "auto" does not build it for
    copies local reuse would run — they stay float32 (this CNN has no linear layer to run in
    int8) — but does where every copy is a whole forward anyway."""
    _auto(monkeypatch, True, int8_speedup=1.5)
    monkeypatch.setattr(_precision, "AUTO_STATIC_COPIES", 1000)
    x, _ = strips(48, torch.Generator().manual_seed(1))  # 1,536 copies
    auto = run(trained_resnet(), x, Patches(4, reuse_local=reuse), sigma=1.5, repeats=2)
    if reuse:
        assert auto._check._static is None and auto.checked_precision == "float32"
    else:
        assert auto._check._static is not None and auto.checked_precision == "int8"


def test_auto_counts_an_allocations_first_round_for_the_static_copy(monkeypatch):
    """An allocation sizes its rounds as it goes, so the batch's tokens × draws overstate what
    the calibration's first round makes: the static int8 copy is judged on the first round's
    copies (a share ``budget`` of the tokens). On an AVX2 CPU, building it for token sampling
    on 256 MNIST images (16,384 tokens, a first round of 1,024) cost seconds that the
    calibration then threw away."""
    _auto(monkeypatch, True)
    monkeypatch.setattr(_precision, "AUTO_STATIC_COPIES", 1000)
    model = trained_resnet()
    x, _ = strips(80, torch.Generator().manual_seed(1))  # 1,280 patches, a first round of 640
    auto = run(model, x, Patches(4), sigma=1.5, allocation="uniform", budget=0.5)
    assert auto._check._static is None
    assert auto.checked_precision == "float32"  # the CNN has no linear layer to run in int8
    whole = run(model, x, Patches(4), sigma=1.5, repeats=1)  # 1,280 copies at once
    assert whole._check._static is not None and whole.checked_precision == "int8"


def test_the_judgement_counts_the_low_copy_and_the_rechecked_share():
    check = _precision.PrecisionCheck()
    check.use("int8", judge=True)
    check.predicted_recheck = 0.3
    check._seconds = [1.0, 3.0]  # a low copy costs a third of a float32 copy
    assert check._pays()  # 1/3 + 0.3 = 0.63 ≤ 1/1.2
    check.predicted_recheck = 0.6
    assert not check._pays()  # 0.93 > 0.83
    check.use("int8", judge=False)  # an explicit request always runs checked
    assert check._pays()


def test_the_judgement_is_checked_against_the_checked_copies():
    """The calibration's copies (the first of the first batch) predicted 10% re-checked and a
    third of a float32 copy's time: checking pays. Once CALIBRATION_COPIES copies ran
    checked, their measured share (59%) and times decide: a loss (0.92 > 1/1.2), so the rest
    run in float32, with the measured numbers in the reason. Fewer checked copies, or an
    explicit request, leave the calibration's verdict."""
    check = _precision.PrecisionCheck()
    check.use("int8", judge=True)
    cal = _precision.CALIBRATION_COPIES
    check._copies, check._seconds, check.predicted_recheck = cal, [0.5, 1.5], 0.1
    assert check._pays()  # 1/3 + 0.1
    check._timed = [0.5, cal - 1, 1.8, 300]
    check._rejudge()
    assert not check.idle  # not yet enough checked copies
    check._timed = [1.0, 2 * cal, 1.8, 300]
    per_low, per_full = 1.5 / (3 * cal), 3.3 / (cal + 300)
    assert check._checked_cost() == pytest.approx(per_low / per_full + 300 / (2 * cal))
    check._rejudge()
    assert check.idle and check.why_idle == (
        f"\"auto\" measured no gain over {2 * cal} checked copies: int8 re-checked 59% of them "
        "in float32, and a checked copy cost 0.92 of a float32 one")
    explicit = _precision.PrecisionCheck()
    explicit.use("int8", judge=False)
    explicit._copies, explicit._seconds, explicit._timed = cal, [0.5, 1.5], [1.0, 2 * cal, 1.8, 300]
    explicit._rejudge()
    assert not explicit.idle


def test_auto_stops_checking_mid_batch_with_float32_flips(monkeypatch):
    """"auto" judged checking to pay on its calibration copies, then found it a loss on the
    checked copies (as on an AVX2 CPU whose static int8 ResNet-18 ran no faster than local
    reuse in float32 and re-checked 15× the share the calibration predicted): the rest of
    the batch, and later batches, run in float32 alone; every flip is float32's."""
    monkeypatch.setattr(_precision, "bf16_pays", lambda device: False)
    monkeypatch.setattr(_precision, "int8_pays", lambda device: True)
    # the calibration's prediction pays, the measured checked copies do not, whatever this
    # machine's speeds
    monkeypatch.setattr(_precision.PrecisionCheck, "_pays", lambda self: not self.judge or (
        self._timed[1] < _precision.CALIBRATION_COPIES))
    model = hf_bert()
    batch, tokens = right_padded(64, 12), Embedding("bert.embeddings.LayerNorm")
    opts = {"sigma": 2.0, "repeats": 3}
    full = run(model, batch, tokens, precision="float32", **opts)
    auto = run(model, batch, tokens, chunk_size=128, **opts)
    assert len(auto.copies) > 3 * _precision.CALIBRATION_COPIES  # copies left after the switch
    assert torch.equal(auto.copies, full.copies)
    checked = auto._check._timed[1]
    assert _precision.CALIBRATION_COPIES <= checked < len(auto.copies) - 256
    assert auto.checked_precision == "float32" and auto.check_bound is None
    assert auto.float32_reason.startswith(f"\"auto\" measured no gain over {checked} checked "
                                          "copies: int8 re-checked ")
    r = auto.compute()
    assert r.estimate == full.compute().estimate
    assert 0 < r.num_forward_fp32 < _precision.CALIBRATION_COPIES + checked


def test_int8_checked_options_are_checked():
    with pytest.raises(ValueError, match="measures output distances"):
        TokenSensitivity(mlp(), Patches(2), sigma=1.0, precision="int8-checked", compare="l1")
    metric = SimpleNamespace(precision="int8-checked", autocast=None, compare="class",
                             model=mlp())
    with pytest.raises(ValueError, match="Use precision='bf16-checked' there"):
        _precision.checked(metric, torch.device("cuda"), torch.zeros(2, 3))
    assert _precision.checked(metric, torch.device("cpu"), torch.zeros(2, 3)) == ("int8", False)


def test_the_int8_product_never_saturates():
    """On a CPU without VNNI fbgemm adds 8-bit pair products in 16 bits, and 8-bit inputs
    saturate them: one product erred by 11% of its largest entry. The input then gets 7 bits
    (:func:`_int8.reduce_range`), and the error stays at the quantisation's."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 384, generator=g)
    w, b = torch.randn(384, 384, generator=g) * 0.05, torch.zeros(384)
    ref = torch.nn.functional.linear(x, w, b)
    with _int8.Int8Linears() as mode:
        out = torch.nn.functional.linear(x, w, b)
    assert mode.calls == 1
    assert float((out - ref).abs().max() / ref.abs().max()) < 0.04
    vnni = {"avx512_vnni", "avx_vnni", "amx_int8"} & _int8.cpu_flags()
    assert _int8.reduce_range() == (not vnni)


def _checked_and_float32(model, batches, tokens, low, **options):
    out = {}
    for precision in ("float32", f"{low}-checked"):
        m = Recorder(model, tokens, generator=5, precision=precision, **options)
        for b in batches:
            m.update(b)
        out[precision] = m
    return out["float32"], out[f"{low}-checked"]


def test_later_copies_past_the_static_copys_ranges_keep_float32_flips():
    """A static int8 copy's activation ranges are fixed from its first examples; later examples
    of 8× their scale are clamped at the hand-over to int8 (177 of 1,024 copies flipped
    otherwise than float32 before the copies past the calibrated ranges were re-checked)."""
    torch.manual_seed(1)  # test-only: nn.Conv2d initialises from the global RNG
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    g = torch.Generator().manual_seed(2)
    small = torch.randn(64, 3, 16, 16, generator=g)
    big = torch.randn(64, 3, 16, 16, generator=g) * 8
    full, checked = _checked_and_float32(model, [torch.cat([small, big])], Patches(4), "int8",
                                         sigma=0.5, chunk_size=256)
    assert checked._check._static is not None and checked._check._static.model is not None
    assert torch.equal(checked.copies, full.copies)
    assert checked.compute().estimate == full.compute().estimate > 0


def test_bf16_copies_with_larger_hidden_values_than_the_calibration_keep_float32_flips():
    """A LayerNorm hides from the output how large the values before it are, and bf16's
    rounding of them: a later batch with an offset of 300 on one input feature kept the
    calibration's band and 123 of 768 copies flipped otherwise than float32, until the band
    widened with the products' input ranges."""

    class Offset(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)  # test-only: nn.Linear initialises from the global RNG
            self.l1, self.ln, self.head = nn.Linear(8, 64), nn.LayerNorm(64), nn.Linear(64, 3)
            with torch.no_grad():
                self.l1.weight[:, 0] = 1.0  # the feature adds to every unit

        def forward(self, x):
            return self.head(self.ln(self.l1(x)).mean(1))

    def batch(offset, seed):
        x = torch.randn(96, 4, 8, generator=torch.Generator().manual_seed(seed))
        x[..., 0] += offset
        return x

    full, checked = _checked_and_float32(Offset().eval(), [batch(0.0, 1), batch(300.0, 2)],
                                         Sequence(), "bf16", sigma=0.3)
    assert checked.checked_precision == "bf16"
    assert torch.equal(checked.copies, full.copies)
    assert 0 < full.compute().estimate < 1


class _Shifted(nn.Module):
    """A model whose forward reads a plain Python float: a traced copy bakes it in."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.shift = inner, 0.0
        self.register_buffer("first", torch.tensor([1.0, 0.0, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.shift * self.first


def test_a_python_attribute_changed_between_batches_remakes_the_static_copy():
    """The static int8 copy is a traced graph with the model's Python attributes as constants:
    a logit shift changed between two batches was not seen, and the second batch ran the old
    model's int8 copy with the old bound (21 of 4,096 copies flipped otherwise than float32 on
    the zoo ResNet trained on digits)."""
    x, _ = strips(24, torch.Generator().manual_seed(1))
    runs = {}
    for precision in ("float32", "int8-checked"):
        model = _Shifted(copy.deepcopy(trained_resnet())).eval()
        m = Recorder(model, Patches(4), generator=5, precision=precision, sigma=1.5, repeats=2)
        m.update(x)
        first = m._check._static
        model.shift = 3.0  # favour class 0
        m.update(x)
        runs[precision] = (m, first)
    (full, _), (checked, first) = runs["float32"], runs["int8-checked"]
    assert checked._check._static is not first and checked._check._static.model is not None
    half = len(full.copies) // 2
    assert torch.equal(checked.copies, full.copies)
    assert not torch.equal(full.copies[:half], full.copies[half:])  # the shift changed flips
