"""Checked bf16 (``precision="bf16-checked"``, senslab.measure._precision): copies evaluated in
bf16, those near a class boundary again in float32 — the flips of a float32 run, copy by copy,
for less than a float32 forward per copy."""

from __future__ import annotations

import functools

import pytest
import torch
from checked_flips import (
    PAD,
    assert_float32_flips,
    assert_paired_comparison_equals_float32,
    right_padded,
    run,
)
from torch import nn

from senslab.measure import TokenSensitivity, _precision, token_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding, Patches

# -- the zoo ----------------------------------------------------------------------------------

ZOO = {
    "mlp": dict(widths=(32,)),
    "vit_small": dict(patch_size=2, dim=16, depth=2, heads=2, dim_head=8, mlp_dim=16,
                      dropout=0.0, emb_dropout=0.0),
    "resnet18": dict(width=0.125),  # local reuse in eval mode
}


@functools.cache
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8×8 digits in [0, 1] (offline), (N, 1, 8, 8) and labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16
    return x, torch.tensor(data.target)


def trained_on_digits(name: str, steps: int = 30) -> nn.Module:
    """A zoo model trained briefly on digits: decisions that depend on the input, margins still
    small."""
    torch.manual_seed(0)  # test-only: the zoo's vision models initialise from the global RNG
    model = create_model(name, image_size=8, in_channels=1, **ZOO[name]).train()
    x, y = digits()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, 1500, (64,), generator=g)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_vision_models_trained_on_digits_get_float32_flips(name):
    model = trained_on_digits(name)
    x = digits()[0][1500:1532]  # held-out digits
    assert_float32_flips(model, x, Patches(2), sigma=0.5, repeats=2)


@pytest.mark.parametrize("name", ["roberta", "lstm"])  # the LSTM resumes from clean prefixes
def test_zoo_text_models_get_float32_flips(name):
    model = create_model(name, vocab_size=50, max_len=16, dim=16, layers=2, heads=2,
                         dropout=0.0, seed=3)
    sigma = 20.0 if name == "lstm" else 3.0
    assert_float32_flips(model, right_padded(32, 12), Embedding("embed_ln"), sigma=sigma,
                         repeats=2)


class PlainLSTM(nn.Module):
    """A user's LSTM classifier (not the zoo's, which falls back to float32 by itself)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.embed = nn.Embedding(50, 16)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.lstm(self.embed(input_ids))[0]
        last = attention_mask.sum(1) - 1
        return self.head(out[torch.arange(len(out)), last])


def _bf16_lstm_runs() -> bool:
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            nn.LSTM(4, 4, batch_first=True)(torch.randn(1, 2, 4))
    except RuntimeError:
        return False
    return True


def test_zoo_lstm_runs_in_autocast_on_every_cpu():
    """On a CPU whose oneDNN has no bf16 LSTM (AVX2), the zoo's LSTM runs its recurrence in
    float32 under autocast instead of failing; its head still runs in bf16."""
    model = create_model("lstm", vocab_size=50, max_len=16, dim=16, layers=2, heads=2,
                         dropout=0.0, seed=3).eval()
    batch = right_padded(4, 12)
    with torch.inference_mode():
        full = model(**batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(**batch)
    assert low.dtype == torch.bfloat16
    assert torch.allclose(low.float(), full, atol=0.1)


def test_user_lstm_in_bf16_is_measured_or_refused_naming_float32():
    """A user's nn.LSTM in checked bf16: float32's flips where this CPU has a bf16 LSTM, else an
    error that says to measure in float32 (not oneDNN's bare "primitive descriptor")."""
    # 32 sentences: more copies than the calibration takes, so some are decided in bf16
    model, batch = PlainLSTM().eval(), right_padded(32, 10)
    if _bf16_lstm_runs():
        assert_float32_flips(model, batch, Embedding("embed"), sigma=3.0, repeats=2)
        return
    with pytest.raises(RuntimeError, match=r"no bf16 kernel.*precision='float32'"):
        run(model, batch, Embedding("embed"), sigma=3.0, precision="bf16-checked")
    plain = run(model, batch, Embedding("embed"), sigma=3.0, precision="float32").compute()
    assert 0.0 < plain.estimate < 1.0


# -- Hugging Face BERT built from a config ----------------------------------------------------


def hf_bert(seed: int = 0) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=PAD,
    )
    torch.manual_seed(seed)  # test-only: HF initialises from the global RNG
    return transformers.BertForSequenceClassification(config).eval()


def trained_bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """BERT trained for a few steps on a toy task (is the mean of the first six token ids above
    26?): decisions that depend on many tokens, and perturbed copies close to the boundary."""
    model = hf_bert(1).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(25):
        batch = right_padded(32, 12, seed=100 + step)
        labels = (batch["input_ids"][:, :6].float().mean(1) > 26).long()
        loss = model(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), right_padded(64, 12, seed=7)


def test_hf_bert_from_config_gets_float32_flips():
    batch = right_padded(32, 12)
    assert_float32_flips(hf_bert(), batch, Embedding("bert.embeddings.LayerNorm"), sigma=2.0,
                         repeats=2)


def test_trained_bert_where_plain_bf16_changes_decisions():
    model, batch = trained_bert()
    # whole-input noise: every copy a new point of input space, many of them near the boundary
    tokens = Embedding("bert.embeddings.LayerNorm")
    opts = {"sigma": 3.0, "repeats": 64, "mode": "whole"}
    full = run(model, batch, tokens, precision="float32", **opts)
    plain = run(model, batch, tokens, autocast=torch.bfloat16, **opts)
    differ = int((plain.copies != full.copies).sum())
    # bf16's own decisions differ (2 of 4,096 copies with the AVX-512 kernels this case was
    # built on; other kernels round elsewhere and may change a different number, possibly none)
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert differ > 0
    checked = assert_float32_flips(model, batch, tokens, **opts)  # … checked ones do not
    print(f"trained BERT: plain bf16 changes {differ} of "
          f"{len(full.copies)} flips; checked re-checks {checked.recheck_fraction:.3f} "
          f"(bound {checked.bf16_bound:.3g})")


# -- with the estimator's other options --------------------------------------------------------

OPTIONS = [
    {"repeats": 4, "antithetic": True},
    {"repeats": 2, "control_variate": "linear"},
    {"repeats": 2, "num_tokens": 5, "chunk_size": 37},
    {"repeats": 2, "target_stderr": 0.01, "max_forward": 3000},
    {"repeats": 16, "mode": "whole"},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_checked_with_padding_aware_batching_and_estimator_options(options):
    """Right-padded text (copies cut after their last real token) with every estimator
    option: still float32's flips."""
    model = create_model("roberta", vocab_size=50, max_len=16, dim=16, layers=2, heads=2,
                         dropout=0.0, seed=3)
    checked = assert_float32_flips(model, right_padded(32, 12), Embedding("embed_ln"),
                                   sigma=3.0, **options)
    assert checked.last_trimmed


def test_paired_comparison_in_checked_bf16_equals_float32():
    assert_paired_comparison_equals_float32("bf16", dim=16)


# -- calibration, bookkeeping and the automatic choice -----------------------------------------


def test_later_updates_reuse_the_bound_and_reset_recalibrates():
    model = trained_on_digits("mlp")
    x = digits()[0][1500:1564]
    metric = TokenSensitivity(model, Patches(2), sigma=0.5, repeats=2, generator=0,
                              precision="bf16-checked")
    metric.update(x[:32])
    bound, first = metric.bf16_bound, metric.state.forward_fp32
    assert bound is not None and first >= _precision.CALIBRATION_COPIES
    metric.update(x[32:])
    assert metric.bf16_bound == bound  # not calibrated again
    second = metric.state.forward_fp32 - first
    copies = 32 * 16 * 2
    assert second < 0.25 * copies  # without calibration, a small share is re-checked
    r = metric.compute()
    assert r.num_forward_fp32 == first + second and r.num_forward == 64 + 2 * copies
    assert r.recheck_fraction == metric.recheck_fraction == (first + second) / (2 * copies)
    full = token_sensitivity(model, x, Patches(2), sigma=0.5, repeats=2, generator=0,
                             precision="float32")
    assert torch.equal(r.per_sample, full.per_sample)
    metric.reset()
    assert metric.bf16_bound is None and metric.recheck_fraction is None


def test_a_small_batch_continues_the_calibration():
    model = trained_on_digits("mlp")
    x = digits()[0][1500:1532]
    metric = TokenSensitivity(model, Patches(2), sigma=0.5, generator=0,
                              precision="bf16-checked")
    metric.update(x[:4])  # 64 copies: all decided in float32, the bound still unknown
    assert metric.bf16_bound is None and metric.state.forward_fp32 == 64
    metric.update(x[4:])
    assert metric.bf16_bound is not None


def test_float64_models_and_distances_keep_their_precision(monkeypatch):
    monkeypatch.setattr(_precision, "bf16_pays", lambda device: True)
    model = trained_on_digits("mlp")
    x = digits()[0][1500:1532]
    m = run(model.double(), x.double(), Patches(2), sigma=0.5, precision="auto")
    assert m.bf16_bound is None and m.compute().num_forward_fp32 == 0
    # float64 weights: autocast would not apply; asked for explicitly, that is said
    with pytest.warns(RuntimeWarning, match="weights are torch.float64"):
        m = run(model.double(), x.double(), Patches(2), sigma=0.5, precision="bf16-checked")
    assert m.bf16_bound is None and m.compute().num_forward_fp32 == 0
    m = run(model.float(), x, Patches(2), sigma=0.5, compare="l2")  # auto: distances in float32
    assert m.bf16_bound is None and m.compute().recheck_fraction is None
    m = run(lambda v: model(v), x, Patches(2), sigma=0.5)  # auto leaves plain callables alone
    assert m.bf16_bound is None


@pytest.mark.parametrize("pays", [True, False])
def test_auto_picks_checked_bf16_where_bf16_pays(monkeypatch, pays):
    monkeypatch.setattr(_precision, "bf16_pays", lambda device: pays)
    monkeypatch.setattr(_precision, "int8_pays", lambda device: False)
    # the timed judgement of the calibration (test_int8_checked) finds a gain here
    monkeypatch.setattr(_precision.PrecisionCheck, "_pays", lambda self: True)
    model = trained_on_digits("mlp")
    x = digits()[0][1500:1532]
    m = run(model, x, Patches(2), sigma=0.5)  # precision="auto" is the default
    assert (m.bf16_bound is not None) == pays
    assert (m.compute().num_forward_fp32 > 0) == pays
    plain = run(model, x, Patches(2), sigma=0.5, autocast=torch.bfloat16)  # user's choice wins
    assert plain.bf16_bound is None


def test_auto_on_this_hardware_is_consistent():
    """``bf16_pays`` agrees with its two parts on this machine (whatever they are)."""
    cpu = torch.device("cpu")
    if not _precision.native_bf16(cpu):
        assert not _precision.bf16_pays(cpu)
    else:
        speedup = _precision._bf16_gemm_speedup(torch.get_num_threads())
        assert _precision.bf16_pays(cpu) == (speedup >= _precision.MIN_SPEEDUP)


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "bf16"},
     "precision must be 'auto', 'float32', 'bf16-checked' or 'int8-checked'"),
    ({"precision": "bf16-checked", "autocast": torch.bfloat16}, "Pass one of them"),
    ({"precision": "float32", "autocast": torch.bfloat16}, "Pass one of them"),
    ({"precision": "bf16-checked", "compare": "l1"}, "measures output distances"),
    # torch.autocast would warn, switch itself off and run the model's own precision
    ({"autocast": torch.float64}, r"model.double\(\)"),
    ({"autocast": torch.float32}, "only switches to torch.bfloat16 or torch.float16"),
])
def test_bad_precision_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenSensitivity(nn.Linear(4, 2), Patches(2), sigma=1.0, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_checked_bf16_on_cuda_gets_float32_flips():
    model = create_model("roberta", vocab_size=50, max_len=16, dim=16, layers=2, heads=2,
                         dropout=0.0, seed=3).cuda()
    batch = {k: v.cuda() for k, v in right_padded(32, 12).items()}
    assert_float32_flips(model, batch, Embedding("embed_ln"), sigma=3.0, repeats=2)


# -- the recorder's own bf16 linear -------------------------------------------------------------


class TwoLinears(nn.Module):
    """A linear of float32 input, then one of the first's bf16 output (autocast's), one
    without bias: the recorder casts each as autocast would."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = nn.Linear(24, 40)
        self.b = nn.Linear(40, 8, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def forward_bf16(model: nn.Module, x: torch.Tensor,
                 rec: _precision._Ranges | None) -> torch.Tensor:
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        if rec is None:
            return model(x)
        with rec:
            return model(x)


def test_recorder_linears_equal_autocast_and_record_input_and_weight_sizes():
    """The recorder runs float32 linears in bf16 itself (keeping the weights' bf16 copies):
    the outputs are autocast's bit for bit, and each call records the larger of its input's
    and weight's sizes, as every other product does."""
    model = TwoLinears().eval()
    x = torch.randn(5, 3, 24, generator=torch.Generator().manual_seed(1))
    rec = _precision._Ranges("bf16")
    out = forward_bf16(model, x, rec)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, forward_bf16(model, x, None))
    assert len(rec._cast) == 2  # both weights kept in bf16
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        h = model.a(x)
    expected = [torch.maximum(_precision._extents(x), _precision._extents(model.a.weight)),
                torch.maximum(_precision._extents(torch.relu(h)),
                              _precision._extents(model.b.weight))]
    assert torch.allclose(torch.stack(rec.ranges).view(2, 3), torch.stack(expected), rtol=1e-2)
    rec.forget()
    assert not rec._cast


def test_extents_read_dense_layouts_in_memory_order_with_the_same_values():
    """A channels-last map (what local reuse keeps) or a transposed weight is reduced as a
    1-D view of its memory, not copied, with the same sizes as its contiguous twin; a layout
    with gaps (a slice) is reduced as it is."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, 4, 3, generator=g) * 3 + 1
    last = x.contiguous(memory_format=torch.channels_last)
    view = _precision._in_memory_order(last)
    assert view.dim() == 1 and view.data_ptr() == last.data_ptr()
    w = torch.randn(7, 9, generator=g)
    assert _precision._in_memory_order(w.t()).data_ptr() == w.data_ptr()
    gaps = x[:, ::2]
    assert _precision._in_memory_order(gaps) is gaps
    for a, twin in ((last, x), (w.t(), w.t().contiguous()), (gaps, gaps.contiguous()),
                    (last.to(torch.bfloat16), x.to(torch.bfloat16))):
        ours, plain = _precision._extents(a), _precision._extents(twin)
        assert torch.equal(ours[[0, 2]], plain[[0, 2]])  # max |x| and range: exact
        assert torch.allclose(ours[1], plain[1], rtol=1e-5)


def test_recorder_recasts_a_weight_changed_in_place():
    """A weight updated in place between forwards (an optimizer step between two updates)
    is cast again, not read from the kept bf16 copy."""
    model = TwoLinears().eval()
    x = torch.randn(4, 24, generator=torch.Generator().manual_seed(2))
    rec = _precision._Ranges("bf16")
    before = forward_bf16(model, x, rec)
    with torch.no_grad():
        model.a.weight.mul_(-3.0)
    after = forward_bf16(model, x, rec)
    assert not torch.equal(before, after)
    assert torch.equal(after, forward_bf16(model, x, None))


def test_checked_bf16_drops_the_kept_weights_after_each_batch():
    """The weights' bf16 copies live for one batch: a trained model between updates is
    measured with its new weights, and no copy outlives the update."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    x = torch.randn(24, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    m = TokenSensitivity(model.eval(), Patches(2), sigma=0.5, repeats=2,
                         precision="bf16-checked", generator=0)
    m.update(x)
    assert m._check._rec is not None and not m._check._rec._cast
    full = TokenSensitivity(model, Patches(2), sigma=0.5, repeats=2, precision="float32",
                            generator=0)
    full.update(x)
    assert torch.equal(m.compute().per_sample, full.compute().per_sample)


def test_auto_times_the_low_precision_after_an_untimed_first_call(monkeypatch):
    """``"auto"``'s timed calibration runs the first calibration chunk in bf16 once untimed:
    kernels made on a first call would count against bf16. An explicit "bf16-checked", which
    does not judge, does not pay for it."""
    monkeypatch.setattr(_precision, "bf16_pays", lambda device: True)
    monkeypatch.setattr(_precision, "int8_pays", lambda device: False)
    monkeypatch.setattr(_precision.PrecisionCheck, "_pays", lambda self: True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).eval()
    calls = []
    model.register_forward_hook(lambda mod, args, out: calls.append(
        (torch.is_autocast_enabled("cpu"), len(args[0]))))
    x = digits()[0][:4]
    sizes = {}
    for precision in ("auto", "bf16-checked"):
        calls.clear()
        TokenSensitivity(model, Patches(2), sigma=0.5, repeats=2, precision=precision,
                         generator=0).update(x)
        sizes[precision] = [n for low, n in calls if low]
    clean = _precision.CALIBRATION_CLEAN
    # the clean examples' bf16 calibration, then the first chunk in bf16 twice under "auto"
    assert sizes["auto"][1] == sizes["auto"][2] and len(sizes["auto"]) == \
        len(sizes["bf16-checked"]) + 1
    assert sizes["auto"][0] <= clean
