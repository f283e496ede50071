"""How outputs are read and which models and options are refused, for the variants a researcher
brings: a threshold in a low-precision dtype, multi-label heads, autocast on float64 weights, a
forward with its own autocast, TorchScript and torch.export programs, and -inf masked logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab.measure import TokenSensitivity, _precision, outputs, token_sensitivity
from senslab.measure.outputs import margins, predictions
from senslab.tokens import Patches, Sequence


def mlp(classes: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, classes))


def images(n: int = 8) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_threshold_is_compared_exactly_in_a_low_precision_dtype(dtype):
    """``out > 0.3`` in bf16 compared with 0.3 rounded to bf16 (0.30078125): an output of
    exactly 0.30078125, above 0.3, was read as class 0 (float32 at one value too). The
    decision is now the exact s > t, and the margins agree in sign with it."""
    t = 0.3
    near = torch.tensor(t, dtype=dtype)
    step = torch.finfo(dtype).eps
    values = torch.stack([near * (1 + k * step) for k in range(-3, 4)]).to(dtype)
    exact = values.double() > t
    assert exact.any() and not exact.all()
    got = predictions(values[:, None], "scores", t)
    assert torch.equal(got, exact), (values.tolist(), got.tolist())
    for ref in (got, ~got):  # ≥ 0 where the prediction is the reference class
        m = margins(values[:, None].float(), ref, "scores", t)
        assert bool((m[got == ref] >= 0).all())
    # thresholds the dtype holds, and the other kinds, read as before
    assert torch.equal(predictions(values[:, None], "scores", 0.25), values > 0.25)
    assert torch.equal(predictions(values - 0.3, "logits"), values - 0.3 > 0)


def test_a_score_at_the_rounded_threshold_is_above_it_in_a_measurement():
    """End to end: a bf16 score model whose clean output is 0.30078125 (class 1 under
    threshold 0.3) and whose perturbed outputs stay above 0.3 never flips; read with the
    rounded threshold every copy was counted as a flip."""
    def scores(x: torch.Tensor) -> torch.Tensor:
        moved = x.flatten(1).abs().amax(dim=1) > 1e-3
        return torch.where(moved, 0.5, 0.30078125).to(torch.bfloat16)

    r = token_sensitivity(scores, torch.zeros(4, 3, 2), Sequence(), sigma=1.0,
                          output_kind="scores", threshold=0.3, precision="float32")
    assert r.estimate == 0.0


def test_a_threshold_on_several_columns_names_the_multi_label_routes():
    """The refusal said "(the argmax decides): drop output_kind='scores'/threshold", which on a
    multi-label head (a sigmoid per column) measures the argmax, not its label set."""
    model = lambda t: torch.sigmoid(mlp(6)(t))  # noqa: E731
    with pytest.raises(ValueError, match=r"reads the argmax.*one label at a time, "
                       r"output=lambda o: o\[:, k\], output_kind='scores', threshold=0.5.*"
                       r"compare='l1'/'l2'"):
        token_sensitivity(model, images(), Patches(4), sigma=0.5, output_kind="scores",
                          threshold=0.5)
    # the route it names measures one label
    r = token_sensitivity(model, images(), Patches(4), sigma=0.5, output=lambda o: o[:, 2],
                          output_kind="scores", threshold=0.5)
    assert r.num_examples == 8


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_autocast_on_a_float64_model_is_refused(low):
    """torch's autocast never casts float64 tensors: every forward ran in float64 and the
    result showed nothing of the reduced precision asked for."""
    with pytest.raises(ValueError, match=r"float64 model.*model\.float\(\)"):
        TokenSensitivity(mlp().double(), Patches(4), sigma=1.0, autocast=low)
    assert TokenSensitivity(mlp(), Patches(4), sigma=1.0, autocast=low).autocast == low


class FunctionalOwnAutocast(nn.Module):
    """Functional ops on its own parameters inside its own autocast: no submodule runs there."""

    def __init__(self) -> None:
        super().__init__()
        src = mlp()
        self.w1, self.b1 = src[1].weight, src[1].bias
        self.w2, self.b2 = src[3].weight, src[3].bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = F.relu(F.linear(x.flatten(1), self.w1, self.b1))
            return F.linear(h, self.w2, self.b2).float()


def test_a_forward_with_its_own_autocast_is_refused_without_submodules():
    """A module calling functional ops in its own autocast, and a predict function around a
    model, escaped the pre-hook probe: bf16's decisions were reported as float32's."""
    net = mlp()

    def predict(t: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return net(t).float()

    for model in (FunctionalOwnAutocast(), predict):
        metric = TokenSensitivity(model, Patches(4), sigma=1.0, precision="float32")
        with pytest.raises(ValueError, match="switches autocast on by itself"):
            metric.update(images())
        assert metric.state.n == 0
        # senslab's own autocast is no model's own
        r = token_sensitivity(model, images(), Patches(4), sigma=1.0, autocast=torch.bfloat16)
        assert r.num_examples == 8


def test_the_autocast_probe_watches_the_clean_forward_only():
    """The torch function mode that looks at the autocast state is entered for the first
    forward alone: the perturbed copies run without it (no cost per torch call)."""
    net, stacks = mlp(), []

    def model(t: torch.Tensor) -> torch.Tensor:
        stacks.append(torch._C._len_torch_function_stack())
        return net(t)

    metric = TokenSensitivity(model, Patches(4), sigma=1.0, precision="float32")
    metric.update(images())
    assert stacks[0] == 1 and len(stacks) > 2 and set(stacks[1:]) == {0}
    stacks.clear()
    metric.update(images())  # looked at once per metric
    assert set(stacks) == {0}


def test_accelerates_patched_forward_is_still_bypassed():
    """accelerate replaces ``model.forward`` with one that enters autocast and keeps the
    original as ``_original_forward``: measured through the original, not refused."""
    model = mlp()
    plain = token_sensitivity(model, images(), Patches(4), sigma=1.0, precision="float32",
                              generator=0)
    original = model.forward

    def patched(*args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return original(*args, **kwargs).float()

    model.forward, model._original_forward = patched, original
    r = token_sensitivity(model, images(), Patches(4), sigma=1.0, precision="float32",
                          generator=0)
    assert torch.equal(r.per_sample, plain.per_sample)
    assert vars(model)["forward"] is patched  # the patch is put back


def test_a_scripted_module_is_refused_naming_the_wrapper_that_measures_it():
    """torch.jit.script modules take no hooks: a raw "register_forward_pre_hook is not
    supported on ScriptModules". The named wrapper measures the eager model's number; a traced
    module (hooks allowed) is measured as it is."""
    model, x = mlp().eval(), images()
    scripted = torch.jit.script(model)
    with pytest.raises(TypeError, match=r"lambda t: scripted\(t\)"):
        token_sensitivity(scripted, x, Patches(4), sigma=1.0)
    eager = token_sensitivity(model, x, Patches(4), sigma=1.0, precision="float32", generator=0)
    wrapped = token_sensitivity(lambda t: scripted(t), x, Patches(4), sigma=1.0,
                                precision="float32", generator=0)
    assert torch.equal(wrapped.per_sample, eager.per_sample)
    traced = token_sensitivity(torch.jit.trace(model, x[:2]), x, Patches(4), sigma=1.0,
                               precision="float32", generator=0)
    assert torch.equal(traced.per_sample, eager.per_sample)


def test_an_exported_program_names_eval_mode_false():
    """``ep.module().eval()`` raises NotImplementedError ("Calling eval() is not supported
    yet."), which reached the user raw; eval_mode=False measures it."""
    model, x = mlp().eval(), images()
    exported = torch.export.export(model, (x,),
                                   dynamic_shapes=({0: torch.export.Dim("batch")},)).module()
    with pytest.raises(ValueError, match=r"Export the model in eval mode.*eval_mode=False"):
        token_sensitivity(exported, x, Patches(4), sigma=1.0)
    eager = token_sensitivity(model, x, Patches(4), sigma=1.0, precision="float32", generator=0)
    r = token_sensitivity(exported, x, Patches(4), sigma=1.0, precision="float32", generator=0,
                          eval_mode=False)
    assert torch.equal(r.per_sample, eager.per_sample)


MASK = torch.tensor([0.0, 0.0, 0.0, float("-inf")])


class Masked(nn.Module):
    """Logits with the last class masked out by -inf (finite, clamped: the same argmax)."""

    def __init__(self, clamp: bool = False) -> None:
        super().__init__()
        self.net, self.clamp = mlp(), clamp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x) + MASK
        return out.clamp(min=-1e4) if self.clamp else out


def test_check_finite_lets_masked_classes_through():
    check_finite = outputs.check_finite
    ok = torch.tensor([[1.0, float("-inf"), 0.5], [float("-inf"), 2.0, 0.0]])
    check_finite(ok, "clean examples")
    for bad in ([[float("nan"), 1.0, 0.0]], [[float("inf"), 1.0, 0.0]],
                [[float("-inf"), float("-inf"), float("-inf")]]):
        with pytest.raises(FloatingPointError, match="NaN or infinite on 1 clean"):
            check_finite(torch.tensor(bad + [[0.0, 1.0, 2.0]]), "clean examples")
    with pytest.raises(FloatingPointError, match="NaN or infinite"):
        check_finite(torch.tensor([float("-inf"), 1.0]), "clean examples")  # one column
    with pytest.raises(FloatingPointError, match=r"compare='l2'.*clamp"):
        check_finite(ok, "clean examples", "l2")


@pytest.mark.parametrize("options", [{}, {"allocation": "linear"},
                                     {"autocast": torch.bfloat16}])
def test_masked_logits_are_measured(options):
    """-inf for disallowed classes leaves the argmax defined; it was refused as "NaN or
    infinite". The number is the clamped model's."""
    x = images(16)
    common = dict(sigma=1.0, generator=0, **options)
    if "autocast" not in options:
        common["precision"] = "float32"
    r = token_sensitivity(Masked(), x, Patches(4), **common)
    ref = token_sensitivity(Masked(clamp=True), x, Patches(4), **common)
    assert torch.equal(r.per_sample, ref.per_sample)
    assert 0 < r.estimate < 1


def test_masked_logits_and_checked_precisions(monkeypatch):
    """A checked precision bounds its error by the size of the outputs, which -inf makes
    infinite (int8-checked then decided copies otherwise than float32): asked for, refused;
    "auto" measures such batches in float32."""
    x = images(16)
    with pytest.raises(ValueError, match=r"precision='bf16-checked' with -inf.*"
                       r"precision='float32'"):
        token_sensitivity(Masked(), x, Patches(4), sigma=1.0, precision="bf16-checked")
    monkeypatch.setattr(_precision, "bf16_pays", lambda device: True)
    auto = token_sensitivity(Masked(), x, Patches(4), sigma=1.0, generator=0)
    ref = token_sensitivity(Masked(), x, Patches(4), sigma=1.0, generator=0,
                            precision="float32")
    assert torch.equal(auto.per_sample, ref.per_sample)
    assert auto.recheck_fraction is None  # float32 alone
    clamped = token_sensitivity(Masked(clamp=True), x, Patches(4), sigma=1.0, generator=0)
    # auto calibrates bf16 where the outputs are finite (re-evaluating its copies in float32;
    # whether it then keeps checking depends on the timing, so recheck_fraction may be None)
    assert clamped.num_forward_fp32 > 0 and auto.num_forward_fp32 == ref.num_forward_fp32 == 0


class _NoisyMasked(nn.Module):
    """Random in eval mode, with class 0 masked by -inf: must be refused as random."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x.flatten(1)) + 0.5 * torch.randn(len(x), 4)
        return torch.cat([torch.full_like(out[:, :1], float("-inf")), out[:, 1:]], 1)


class _BatchMaxMasked(nn.Module):
    """Normalised by its batch's maximum, with class 0 masked by -inf: must be refused."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin((x / x.abs().amax()).flatten(1)) * 10
        return torch.cat([torch.full_like(out[:, :1], float("-inf")), out[:, 1:]], 1)


@pytest.mark.parametrize("make,words", [(_NoisyMasked, "changed between two evaluations"),
                                        (_BatchMaxMasked, "zero noise gives another output")])
def test_masked_logits_keep_the_copy_checks_on(make, words):
    """A -inf logit made every tolerance of the copy checks infinite (sized from the clean
    outputs), so a random or batch-dependent forward with a masked class was measured without
    a word (0.3906 and 0.2812); the tolerances are sized from the finite entries."""
    torch.manual_seed(0)  # test-only: the layers' initialisation
    model = make().eval()
    x = torch.randn(8, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match=words):
        token_sensitivity(model, x, Patches(2), sigma=1.0, repeats=2)


@pytest.mark.parametrize("compare", ["l1", "l2"])
@pytest.mark.parametrize("rule", [{"output_kind": "probabilities"},
                                  {"output_kind": "scores", "threshold": 0.3}])
def test_a_decision_rule_with_a_distance_is_refused(compare, rule):
    """compare='l1'/'l2' reads no class: an output_kind or threshold given with it changed
    nothing (accepted and ignored), so a user's threshold=0.3 went unread without a word."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(8, 1))
    with pytest.raises(ValueError, match=f"compare='{compare}' measures how far") as said:
        TokenSensitivity(model, Sequence(), sigma=1.0, compare=compare, **rule)
    assert "drop output_kind=" in str(said.value)
    # without them the distance is measured as before, and with compare='class' both are read
    TokenSensitivity(model, Sequence(), sigma=1.0, compare=compare)
    TokenSensitivity(model, Sequence(), sigma=1.0, compare="class", **rule)
