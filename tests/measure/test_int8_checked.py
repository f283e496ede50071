"""Checked int8 (``precision="int8-checked"``, senslab.measure._int8 and ._precision): the
model's linear layers as int8 products, copies near a class boundary again in float32 — the
flips of a float32 run, copy by copy — and ``"auto"``'s timed judgement of whether checking
pays."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from checked_flips import PAD, assert_float32_flips, right_padded, run
from torch import nn

from senslab.measure import TokenSensitivity, _int8, _precision, compare_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding, Patches

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


def test_a_model_without_linear_layers_to_run_stays_float32():
    torch.manual_seed(0)  # test-only: the zoo's vision models initialise from the global RNG
    model = create_model("resnet18", image_size=8, in_channels=1, width=0.125).eval()
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    m = run(model, x, Patches(2), sigma=0.5, precision="int8-checked")
    r = m.compute()
    assert m.checked_precision == "float32" and r.recheck_fraction is None
    assert r.num_forward_fp32 == 0 and m.check_bound is None


def test_paired_comparison_in_checked_int8_equals_float32():
    models = {name: create_model(name, vocab_size=50, max_len=16, dim=64, layers=2, heads=2,
                                 dropout=0.0, seed=3) for name in ("roberta", "gpt2")}
    batch, tokens = right_padded(32, 12), Embedding("embed_ln")
    runs = [compare_sensitivity(models, batch, tokens, sigma=3.0, repeats=2, precision=p)
            for p in ("float32", "int8-checked")]
    d = [r.difference("roberta", "gpt2") for r in runs]
    assert d[0].estimate == d[1].estimate and d[0].stderr == d[1].stderr
    assert runs[0].results["gpt2"].num_forward_fp32 == 0
    assert runs[1].results["gpt2"].num_forward_fp32 > 0


def test_the_bound_widens_with_the_chunks_quantisation_steps():
    """int8's error grows with each call's input range (its quantisation step), which a chunk
    shares: a chunk whose ranges exceed the calibration's gets a proportionally wider band."""
    check = _precision.PrecisionCheck()
    check.use("int8")
    check._ranges = [1.0, 2.0]
    for now, widening in (([0.5, 2.0], 1.0), ([3.0, 2.0], 3.0), ([1.0, 5.0], 2.5),
                          ([1.0, 2.0, 0.1], float("inf"))):  # a call never calibrated
        check._int8.ranges = now
        assert check._widening() == widening
    check.use("bf16")  # bf16's rounding is per element: no widening
    check._int8.ranges = [9.0]
    assert check._widening() == 1.0


def test_a_batch_with_wider_activations_than_the_calibration_keeps_float32_flips():
    model, g = mlp(), torch.Generator().manual_seed(0)
    flat = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), model).eval()
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


def _auto(monkeypatch, pays: bool) -> None:
    monkeypatch.setattr(_precision, "bf16_pays", lambda device: False)
    monkeypatch.setattr(_precision, "int8_pays", lambda device: True)
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
    else:
        # judged once JUDGE_AFTER calibration copies are in: the copies of the chunk that
        # reached them were all evaluated in float32 too, every later one only in float32
        assert auto.checked_precision == "float32" and auto.check_bound is None
        assert 0 < r.num_forward_fp32
        assert r.num_forward_fp32 < _precision.CALIBRATION_COPIES


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


def test_int8_checked_options_are_checked():
    with pytest.raises(ValueError, match="measures output distances"):
        TokenSensitivity(mlp(), Patches(2), sigma=1.0, precision="int8-checked", compare="l1")
    metric = SimpleNamespace(precision="int8-checked", autocast=None, compare="class",
                             model=mlp())
    with pytest.raises(ValueError, match="Use precision='bf16-checked' there"):
        _precision.checked(metric, torch.device("cuda"), torch.zeros(2, 3))
    assert _precision.checked(metric, torch.device("cpu"), torch.zeros(2, 3)) == ("int8", False)
