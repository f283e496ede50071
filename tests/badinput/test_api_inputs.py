"""Bad inputs to the measurement API: a clear refusal, or the right number — never a wrong one.

``CASES`` is the table of calls that must be refused: each row is an id, a function making the
bad call, the exception type, and substrings that must all appear in the message (the field or
value at fault *and* the fix). ``EXACT`` holds what is accepted and the number it must give.
New names are imported inside the case functions, so this file also collects against an older
senslab (``tests/badinput/record_before.py`` counts which cases found a defect there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from senslab import Patches, token_sensitivity
from senslab.measure import TokenSensitivity, boolean_sensitivity
from senslab.measure.boolean import majority
from senslab.tokens import Embedding, Sequence

# -- small models and data ---------------------------------------------------------------------


def images(dtype: torch.dtype = torch.float32, n: int = 6, seed: int = 0) -> torch.Tensor:
    """(n, 1, 8, 8) pixel-like images in [0, 255] (integer-valued, exact in every dtype)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 1, 8, 8), generator=g).to(dtype)


def linear(classes: int = 1, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # test-only: model init
    return nn.Sequential(nn.Flatten(), nn.Linear(64, classes))


class FloatCast(nn.Module):
    """Converts the images to float itself (as a user's model with ``x.float()`` does)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.float() / 255 - 0.5)


class Sigmoid(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.inner(x))


class Wrap(nn.Module):
    """``inner``'s logits packed by ``pack`` (a dict, a tuple, an object …)."""

    def __init__(self, inner: nn.Module, pack: Callable[[torch.Tensor, torch.Tensor], Any]):
        super().__init__()
        self.inner, self.pack = inner, pack

    def forward(self, x: torch.Tensor) -> Any:
        return self.pack(x.flatten(1), self.inner(x))


class SharedNorm(nn.Module):
    """One LayerNorm applied at two places of the forward pass."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(ids))
        return self.head(self.norm(h + 1).mean(1))


class TokenEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1))


class IntegerStage(nn.Module):
    """Hooking ``ids`` would put noise on integer token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.ids = nn.Identity()
        self.inner = TokenEmbed()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner(self.ids(ids.unsqueeze(-1)).squeeze(-1))


class AlwaysDropout(nn.Module):
    """Dropout that ``eval()`` does not switch off (``training=True`` hard-coded)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(nn.functional.dropout(x, 0.5, training=True))


class BatchCentred(nn.Module):
    """Each example's output depends on the others in its batch (it is centred on their mean)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x - x.mean(0, keepdim=True))


def ids(n: int = 6, t: int = 5) -> torch.Tensor:
    return torch.randint(0, 10, (n, t), generator=torch.Generator().manual_seed(0))


def measure(model: Any = None, x: torch.Tensor | None = None, tokens: Any = None,
            **options: Any) -> Any:
    """token_sensitivity with working defaults; a case overrides one thing."""
    options.setdefault("sigma", 1.0)
    return token_sensitivity(
        linear(3) if model is None else model,
        images() / 255 if x is None else x,
        Patches(4) if tokens is None else tokens,
        **options,
    )


def merged(a: dict[str, Any], b: dict[str, Any], tokens_b: Any = None) -> Any:
    opts = {"sigma": 1.0, **a}
    m1 = TokenSensitivity(linear(3), Patches(4), **opts)
    m2 = TokenSensitivity(linear(3), tokens_b or Patches(4), **{**opts, **b})
    return m1.merge(m2)


# -- the table of refusals ---------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[], Any]
    exc: type[BaseException]
    says: tuple[str, ...]  # the field/value at fault and the fix


CASES = [
    # argument types
    Case("generator-str", lambda: measure(generator="0"), TypeError,
         ("generator", "'0'", "int seed", "manual_seed")),
    Case("generator-float", lambda: measure(generator=1.5), TypeError,
         ("generator", "1.5", "int seed")),
    Case("generator-bool", lambda: measure(generator=True), TypeError,
         ("generator", "True", "int seed")),
    Case("repeats-bool", lambda: measure(repeats=True), ValueError,
         ("repeats", "True", "positive integer")),
    Case("repeats-float", lambda: measure(repeats=2.0), ValueError,
         ("repeats", "2.0", "positive integer")),
    Case("sigma-str", lambda: measure(sigma="0.1"), TypeError,
         ("sigma", "'0.1'", "sigma=0.1")),
    Case("variance-str", lambda: measure(sigma=None, variance="2"), TypeError,
         ("variance", "'2'", "must be a number")),
    Case("sigma-bool", lambda: measure(sigma=True), TypeError, ("sigma", "True", "number")),
    Case("chunk-size-zero", lambda: measure(chunk_size=0), ValueError,
         ("chunk_size", "0", "positive integer")),
    Case("num-tokens-bool", lambda: measure(num_tokens=True), ValueError,
         ("num_tokens", "True", "positive integer")),
    Case("memory-budget-negative", lambda: measure(memory_budget=-1), ValueError,
         ("memory_budget", "-1", "positive integer")),
    Case("max-forward-bool", lambda: measure(max_forward=True, target_stderr=0.1), ValueError,
         ("max_forward", "True", "positive integer")),
    Case("compare-uppercase", lambda: measure(compare="L2"), ValueError,
         ("compare", "'L2'", "'l2'")),
    Case("mode-unknown", lambda: measure(mode="all"), ValueError, ("mode", "'all'", "'whole'")),
    Case("estimand-unknown", lambda: measure(estimand="population"), ValueError,
         ("estimand", "'population'", "'data'")),
    Case("target-stderr-str", lambda: measure(target_stderr="0.01"), TypeError,
         ("target_stderr", "'0.01'", "target_stderr=0.01")),
    Case("antithetic-str", lambda: measure(antithetic="yes", repeats=2), TypeError,
         ("antithetic", "'yes'", "True or False")),
    Case("autocast-bool", lambda: measure(autocast=True), TypeError,
         ("autocast", "True", "torch.bfloat16")),
    Case("shard-one-number", lambda: measure(shard=(0,)), ValueError,
         ("shard", "(0,)", "shard=(0, 2)")),
    Case("tokens-int", lambda: token_sensitivity(linear(3), images() / 255, 4, sigma=1.0),
         TypeError, ("tokens", "4", "Patches(4)")),
    Case("mask-list", lambda: measure(mask=[[True] * 4] * 6), TypeError,
         ("mask", "list", "tensor")),
    Case("replace-with-list", lambda: measure(sigma=None, replace_with=[[0.0] * 16]), TypeError,
         ("replace_with", "list", "torch.eye")),
    Case("replace-with-wrong-dim", lambda: measure(sigma=None, replace_with=torch.eye(5)),
         ValueError, ("replace_with", "5 entries", "16")),
    Case("output-selector-float", lambda: measure(output=1.5), TypeError,
         ("output=", "1.5", "output=1")),
    Case("model-not-callable", lambda: measure(model="resnet18"), TypeError,
         ("model", "str", "callable")),
    # decision rule
    Case("output-kind-unknown", lambda: measure(output_kind="sigmoid"), ValueError,
         ("output_kind", "'sigmoid'", "'probabilities'")),
    Case("threshold-without-scores", lambda: measure(threshold=0.5), ValueError,
         ("threshold=0.5", "output_kind='scores'")),
    Case("scores-without-threshold", lambda: measure(output_kind="scores"), ValueError,
         ("output_kind='scores'", "threshold=")),
    Case("threshold-str", lambda: measure(output_kind="scores", threshold="0.5"), TypeError,
         ("threshold", "'0.5'", "threshold=0.5")),
    Case("sigmoid-output-ambiguous", lambda: measure(Sigmoid(linear(1))), ValueError,
         ("[0, 1]", "output_kind='probabilities'")),
    Case("sigmoid-output-ambiguous-flat", lambda: measure(
        Wrap(linear(1), lambda f, z: torch.sigmoid(z).squeeze(1))), ValueError,
         ("[0, 1]", "output_kind")),
    Case("probabilities-not-in-unit-interval",
         lambda: measure(linear(1), images(), output_kind="probabilities"), ValueError,
         ("output_kind='probabilities'", "outside [0, 1]", "output_kind='logits'")),
    Case("scores-on-several-columns", lambda: measure(output_kind="scores", threshold=0.0),
         ValueError, ("threshold=", "(6, 3)", "drop output_kind='scores'")),
    Case("declared-kind-unknown", lambda: measure(
        _declare(linear(3), "softmax")), ValueError, ("output_kind is 'softmax'", "'logits'")),
    # output containers and shapes
    Case("tuple-features-logits", lambda: measure(Wrap(linear(3), lambda f, z: (f, z))),
         TypeError, ("Tensor(6, 64)", "Tensor(6, 3)", "output=1")),
    Case("dict-without-logits", lambda: measure(Wrap(linear(3), lambda f, z: {"scores": z})),
         TypeError, ("'scores'", "output='scores'")),
    Case("selector-out-of-range", lambda: measure(Wrap(linear(3), lambda f, z: (f, z)), output=2),
         TypeError, ("output=2", "does not select")),
    Case("selector-wrong-key", lambda: measure(Wrap(linear(3), lambda f, z: {"logits": z}),
                                               output="logit"), TypeError,
         ("output='logit'", "'logits'")),
    Case("output-one-row-for-batch", lambda: measure(Wrap(linear(3), lambda f, z: z[:1])),
         ValueError, ("1 rows", "6 examples", "one output row per example")),
    Case("output-reduced-over-batch", lambda: measure(Wrap(linear(3), lambda f, z: z.mean())),
         ValueError, ("single number", "6 examples", "per-example outputs")),
    Case("output-3d-with-class", lambda: measure(Wrap(linear(6), lambda f, z: z.view(-1, 2, 3))),
         ValueError, ("(6, 2, 3)", "compare='l1'", "output=")),
    # dtypes
    Case("uint8-images", lambda: measure(FloatCast(linear(3)), images(torch.uint8), sigma=30.0),
         TypeError, ("torch.uint8", "images.float()", "/ 255")),
    Case("int64-images", lambda: measure(FloatCast(linear(3)), images(torch.int64), sigma=30.0),
         TypeError, ("torch.int64", "images.float()")),
    Case("bool-images", lambda: measure(FloatCast(linear(3)), images() > 100), TypeError,
         ("torch.bool", "images.float()")),
    Case("int-sequence", lambda: token_sensitivity(
        lambda s: s.float().sum(1), torch.ones(4, 3, 2, dtype=torch.long), Sequence(), sigma=1.0),
         TypeError, ("torch.int64", "inputs.float()", "Embedding")),
    Case("float64-into-float32-model", lambda: measure(linear(3), images(torch.float64) / 255),
         TypeError, ("torch.float64", "torch.float32", "inputs.to(torch.float32)")),
    Case("float16-into-float32-model", lambda: measure(linear(3), images(torch.float16) / 255),
         TypeError, ("torch.float16", "inputs.to(torch.float32)")),
    # forwards whose copies cannot be compared with the clean output
    Case("random-forward", lambda: measure(AlwaysDropout(linear(3))), RuntimeError,
         ("changed between two evaluations", "random", "dropout", "deterministic")),
    Case("output-depends-on-batch", lambda: measure(BatchCentred(linear(3))), RuntimeError,
         ("example 0", "other examples in its batch", "BatchNorm")),
    Case("train-mode-batchnorm-in-own-mode", lambda: measure(
        nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).train(),
        eval_mode=False), ValueError,
         ("eval_mode=False", "BatchNorm", "(2:", "chunk_size", "eval_mode=True")),
    # Embedding hooks
    Case("embedding-hook-runs-twice", lambda: token_sensitivity(
        SharedNorm(), ids(), Embedding("norm"), sigma=1.0), ValueError,
         ("'norm'", "2 times", "runs once per forward")),
    Case("embedding-hook-integer-output", lambda: token_sensitivity(
        IntegerStage(), ids(), Embedding("ids"), sigma=1.0), TypeError,
         ("'ids'", "torch.int64", "hook the embedding")),
    # merge
    Case("merge-sigma", lambda: merged({"sigma": 0.1}, {"sigma": 0.2}), ValueError,
         ("cannot merge", "sigma 0.1 vs 0.2", "same options")),
    Case("merge-compare", lambda: merged({}, {"compare": "l2"}), ValueError,
         ("compare 'class' vs 'l2'",)),
    Case("merge-mode", lambda: merged({}, {"mode": "whole"}), ValueError,
         ("mode 'token' vs 'whole'",)),
    Case("merge-tokens", lambda: merged({}, {}, Patches(2)), ValueError,
         ("tokens", "size=4", "size=2")),
    Case("merge-replace-with", lambda: merged(
        {"sigma": None, "replace_with": torch.eye(16)}, {"replace_with": torch.eye(16).flip(0)}),
         ValueError, ("cannot merge", "replace_with")),
    Case("merge-output-kind", lambda: merged({}, {"output_kind": "probabilities"}), ValueError,
         ("output_kind 'logits' vs 'probabilities'",)),
    Case("merge-threshold", lambda: merged({"output_kind": "scores", "threshold": 0.1},
                                           {"threshold": 0.2}), ValueError,
         ("threshold 0.1 vs 0.2",)),
    Case("merge-align", lambda: merged({}, {"align": "right"}), ValueError,
         ("align 'left' vs 'right'",)),
    Case("merge-output-selector", lambda: merged({"output": 0}, {"output": 1}), ValueError,
         ("output 0 vs 1",)),
    # boolean_sensitivity
    Case("boolean-table-list", lambda: boolean_sensitivity([1, -1, -1, 1]), TypeError,
         ("list", "torch.tensor(table)")),
    Case("boolean-generator-str", lambda: boolean_sensitivity(
        majority, 25, method="sample", generator="seed"), TypeError,
         ("generator", "'seed'", "int seed")),
    Case("boolean-generator-float", lambda: boolean_sensitivity(
        majority, 25, method="sample", generator=0.5), TypeError, ("generator", "0.5")),
    Case("boolean-num-samples-bool", lambda: boolean_sensitivity(
        majority, 25, method="sample", num_samples=True), ValueError, ("num_samples", "True")),
    Case("boolean-threshold-str", lambda: boolean_sensitivity(
        majority, 5, threshold="0.5"), TypeError, ("threshold", "'0.5'", "number")),
]


def _declare(model: nn.Module, kind: str) -> nn.Module:
    model.output_kind = kind  # type: ignore[assignment]
    return model


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_with_a_message_that_names_the_fault_and_the_fix(case: Case) -> None:
    with pytest.raises(case.exc) as info:
        case.call()
    message = str(info.value)
    missing = [s for s in case.says if s not in message]
    assert not missing, f"message lacks {missing}: {message}"


# -- what is accepted, and the number it gives -------------------------------------------------


def _flip_rate_of_linear(model: nn.Module, x: torch.Tensor, sigma: float) -> float:
    """Exact token-wise flip rate of a one-logit linear model: for patch t the noisy logit is
    z + w_t·ε, so P(flip) = Φ(−|z| / (σ‖w_t‖)), averaged over patches and examples."""
    lin = model.inner[1] if isinstance(model, FloatCast) else model[1]
    w = lin.weight.detach().double().view(1, 2, 4, 2, 4).permute(0, 1, 3, 2, 4).reshape(4, 16)
    w = w / (255 if isinstance(model, FloatCast) else 1)
    with torch.no_grad():
        z = model(x).double().reshape(-1)
    p = torch.special.ndtr(-z.abs()[:, None] / (sigma * w.norm(dim=1)[None]))
    return p.mean().item()


def exact_int_seed_in_boolean_sensitivity() -> None:
    a = boolean_sensitivity(majority, 25, method="sample", num_samples=200, generator=7)
    b = boolean_sensitivity(majority, 25, method="sample", num_samples=200,
                            generator=torch.Generator().manual_seed(7))
    assert a.average == b.average and torch.equal(a.influence, b.influence)


def exact_dict_output_equals_tensor() -> None:
    base = measure(linear(3), repeats=3).estimate
    for pack in (lambda f, z: {"logits": z, "features": f},
                 lambda f, z: SimpleNamespace(logits=z, hidden_states=f),
                 lambda f, z: (z,), lambda f, z: [z]):
        assert measure(Wrap(linear(3), pack), repeats=3).estimate == base


def exact_selected_output_equals_tensor() -> None:
    base = measure(linear(3), repeats=3).estimate
    pair = Wrap(linear(3), lambda f, z: (f, z))
    assert measure(pair, repeats=3, output=1).estimate == base
    assert measure(pair, repeats=3, output=lambda o: o[1]).estimate == base
    keyed = Wrap(linear(3), lambda f, z: {"scores": z})
    assert measure(keyed, repeats=3, output="scores").estimate == base


def exact_probabilities_equal_logits() -> None:
    x = images() / 255
    logits = measure(linear(1), x, repeats=8)
    probs = measure(Sigmoid(linear(1)), x, repeats=8, output_kind="probabilities")
    assert probs.estimate == logits.estimate > 0
    assert torch.equal(probs.per_sample, logits.per_sample)
    shifted = measure(Wrap(linear(1), lambda f, z: z + 3.0), x, repeats=8,
                      output_kind="scores", threshold=3.0)
    assert shifted.estimate == logits.estimate


def exact_declared_kind_is_used() -> None:
    x = images() / 255
    logits = measure(linear(1), x, repeats=8).estimate
    declared = Sigmoid(linear(1))
    declared.output_kind = "probabilities"  # type: ignore[assignment]
    assert measure(declared, x, repeats=8).estimate == logits


def exact_float_images_give_the_closed_form_and_uint8_is_refused() -> None:
    model = FloatCast(linear(1))
    x8 = images(torch.uint8, n=20)
    with pytest.raises(TypeError, match="images.float"):
        measure(model, x8, sigma=30.0)
    r = measure(model, x8.float(), sigma=30.0, repeats=400, estimand="subset")
    exact = _flip_rate_of_linear(model, x8.float(), 30.0)
    assert abs(r.estimate - exact) < 4 * r.stderr + 1e-9


def exact_float64_model_on_float64_images() -> None:
    model = linear(3).double()
    x = images(torch.float64) / 255
    r64 = measure(model, x, repeats=3)
    r32 = measure(linear(3), x.float(), repeats=3)
    assert r64.estimate == r32.estimate


def exact_embedding_keeps_integer_ids() -> None:
    r = token_sensitivity(TokenEmbed(), ids(), Embedding("embed"), sigma=1.0, repeats=2)
    assert 0.0 <= r.estimate <= 1.0 and r.num_examples == 6


def exact_eval_mode_false_leaves_batchnorm_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.Flatten(),
                          nn.Linear(128, 3))
    model.train()
    model[1].eval()  # train-mode BatchNorm itself is refused (batch statistics)
    model[1].running_mean.fill_(0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    measure(model, eval_mode=False, repeats=2)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.training and not model[1].training


def exact_control_variate_with_probabilities() -> None:
    x = images(n=30) / 255
    plain = measure(linear(1), x, sigma=2.0, repeats=16, estimand="subset")
    cv = measure(Sigmoid(linear(1)), x, sigma=2.0, repeats=16, estimand="subset",
                 output_kind="probabilities", control_variate="linear")
    assert abs(cv.estimate - plain.estimate) < 4 * math.hypot(cv.stderr, plain.stderr) + 1e-9


def exact_merge_of_compatible_metrics() -> None:
    x = images(n=8) / 255
    one = TokenSensitivity(linear(3), Patches(4), sigma=1.0, generator=1)
    one.update(x)
    a = TokenSensitivity(linear(3), Patches(4), sigma=1.0, generator=1)
    # a seed of its own: two metrics of other examples under one seed are merged with a warning
    b = TokenSensitivity(linear(3), Patches(4, reuse_local=False), sigma=1.0, generator=2)
    a.update(x[:4])
    b.update(x[4:])
    assert a.merge(b).compute().num_examples == 8


EXACT = [
    exact_int_seed_in_boolean_sensitivity,
    exact_dict_output_equals_tensor,
    exact_selected_output_equals_tensor,
    exact_probabilities_equal_logits,
    exact_declared_kind_is_used,
    exact_float_images_give_the_closed_form_and_uint8_is_refused,
    exact_float64_model_on_float64_images,
    exact_embedding_keeps_integer_ids,
    exact_eval_mode_false_leaves_batchnorm_alone,
    exact_control_variate_with_probabilities,
    exact_merge_of_compatible_metrics,
]


@pytest.mark.parametrize("check", EXACT, ids=[f.__name__[6:] for f in EXACT])
def test_accepted_inputs_give_the_right_number(check: Callable[[], None]) -> None:
    check()


# -- properties: any dtype, any output convention ----------------------------------------------

DTYPES = [torch.uint8, torch.int32, torch.int64, torch.bool, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]


@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from(DTYPES), casts=st.booleans(), seed=st.integers(0, 50))
def test_any_input_dtype_is_refused_clearly_or_measured_exactly(dtype, casts, seed):
    """Integer inputs: refused (noise would be rounded). Floating inputs the model cannot take:
    refused with the conversion. Otherwise: the float32 number (the noise is added in the input
    dtype, which float64 holds exactly; half precision rounds the inputs, so only its range is
    checked)."""
    x32 = images(n=4, seed=seed) / 255
    inner = linear(3, seed=seed)
    model = Wrap(inner, lambda f, z: z) if not casts else _Cast(inner)
    x = (x32 * 255).to(dtype) if not dtype.is_floating_point else x32.to(dtype)
    if dtype == torch.bool:
        x = x32 > 0.5
    try:
        r = measure(model, x, sigma=0.5, repeats=2)
    except TypeError as err:
        text = str(err)
        if not dtype.is_floating_point:
            assert "images.float()" in text
        else:
            assert not casts and "inputs.to(torch.float32)" in text
        return
    assert dtype.is_floating_point
    assert 0.0 <= r.estimate <= 1.0
    if dtype in (torch.float32, torch.float64):
        assert r.estimate == measure(model, x32, sigma=0.5, repeats=2).estimate


class _Cast(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.float())


PACKS: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], Any], Any]] = {
    "tensor": (lambda f, z: z, None),
    "dict": (lambda f, z: {"logits": z}, None),
    "model-output": (lambda f, z: SimpleNamespace(logits=z), None),
    "one-tuple": (lambda f, z: (z,), None),
    "pair-index": (lambda f, z: (f, z), 1),
    "pair-negative-index": (lambda f, z: (f, z), -1),
    "dict-key": (lambda f, z: {"out": z, "h": f}, "out"),
    "callable": (lambda f, z: {"nested": [f, z]}, lambda o: o["nested"][1]),
    "pair-no-selector": (lambda f, z: (f, z), None),
    "dict-no-logits": (lambda f, z: {"out": z}, None),
}


@settings(max_examples=30, deadline=None)
@given(pack=st.sampled_from(sorted(PACKS)), classes=st.sampled_from([1, 2, 4]),
       kind=st.sampled_from(["logits", "probabilities", "scores", None]),
       seed=st.integers(0, 50))
def test_any_output_convention_is_refused_clearly_or_equals_the_logits(pack, classes, kind,
                                                                        seed):
    """Whatever the container and the declared kind, the estimate equals the plain-logits one
    or the call is refused with a message naming output= / output_kind."""
    x = images(n=5, seed=seed) / 255
    inner = linear(classes, seed=seed)
    reference = measure(inner, x, repeats=2, output_kind="logits").estimate
    fn, selector = PACKS[pack]

    def as_kind(z: torch.Tensor) -> torch.Tensor:
        if classes == 1 and kind == "probabilities":
            return torch.sigmoid(z)
        if classes == 1 and kind == "scores":
            return z + 2.0
        return z

    model = Wrap(inner, lambda f, z: fn(f, as_kind(z)))
    opts: dict[str, Any] = {"output": selector, "output_kind": kind}
    if kind == "scores":
        opts["threshold"] = 2.0
    try:
        r = measure(model, x, repeats=2, **opts)
    except (TypeError, ValueError) as err:
        text = str(err)
        assert "output=" in text or "output_kind" in text or "threshold" in text, text
        assert pack in ("pair-no-selector", "dict-no-logits") or (
            kind == "scores" and classes > 1
        ) or (kind is None and classes == 1 and "[0, 1]" in text), text
        return
    assert r.estimate == reference


@settings(max_examples=25, deadline=None)
@given(generator=st.one_of(st.none(), st.integers(0, 2**31), st.booleans(), st.floats(),
                           st.text(max_size=3)))
def test_any_generator_value_is_a_seed_or_refused(generator):
    x = images(n=3) / 255
    try:
        r = measure(linear(3), x, generator=generator)
    except TypeError as err:
        assert "generator" in str(err) and "int seed" in str(err)
        assert not isinstance(generator, int) or isinstance(generator, bool)
        return
    assert generator is None or (isinstance(generator, int) and not isinstance(generator, bool))
    seeded = torch.Generator().manual_seed(0 if generator is None else generator)
    assert r.estimate == measure(linear(3), x, generator=seeded).estimate


@settings(max_examples=25, deadline=None)
@given(rows=st.sampled_from(["all", "first", "mean", "repeat"]),
       layout=st.sampled_from(["(B,)", "(B, 1)", "(B, C)", "(B, 2, C)"]),
       compare=st.sampled_from(["class", "l2"]), seed=st.integers(0, 50))
def test_any_output_shape_is_refused_clearly_or_measured(rows, layout, compare, seed):
    """One row per example in, the per-example number out; any other row count is refused, and
    compare='class' refuses outputs that are not (B,) / (B, C)."""
    x = images(n=4, seed=seed) / 255
    classes = 1 if layout in ("(B,)", "(B, 1)") else 3
    inner = linear(classes * (2 if layout == "(B, 2, C)" else 1), seed=seed)

    def shape(f: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if layout == "(B,)":
            z = z.reshape(-1)
        elif layout == "(B, 2, C)":
            z = z.reshape(len(z), 2, -1)
        if rows == "first":
            return z[:1]
        if rows == "mean":
            return z.mean(0)
        return torch.cat([z, z]) if rows == "repeat" else z

    # output_kind reads a class: compare='l2' reads none and refuses it
    opts = {"compare": compare, "repeats": 2,
            **({"output_kind": "logits"} if compare == "class" else {})}
    try:
        r = measure(Wrap(inner, shape), x, **opts)
    except ValueError as err:
        text = str(err)
        if rows != "all":
            assert "one output row per example" in text or "single number" in text, text
        else:
            assert layout == "(B, 2, C)" and compare == "class" and "compare='l1'" in text
        return
    assert rows == "all"
    reference = measure(Wrap(inner, lambda f, z: z.reshape(len(z), -1)), x, **opts)
    if compare == "l2" or layout != "(B, 2, C)":
        assert r.estimate == pytest.approx(reference.estimate, abs=1e-6)


def test_verification_tolerance_follows_the_precision() -> None:
    """The zero-noise check allows float32 rounding in float32, bf16-class rounding otherwise."""
    from senslab.measure._runner import _tolerance

    clean = torch.zeros(2, 3)
    assert _tolerance(clean, low_precision=False) == 1e-3
    assert _tolerance(clean, low_precision=True) == 5e-2
    assert _tolerance(clean.bfloat16(), low_precision=False) == 5e-2
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # TF32 / bf16x3 products
        assert _tolerance(clean, low_precision=False) == 5e-2
    finally:
        torch.set_float32_matmul_precision(before)
