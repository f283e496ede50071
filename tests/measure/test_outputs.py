"""The one decision rule (senslab.measure.outputs) and the output selector it reads through."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from senslab.measure.outputs import (
    OUTPUT_KINDS,
    check_kind,
    check_rows,
    declared_kind,
    is_scalar,
    margins,
    predictions,
    resolve_kind,
    threshold_of,
)
from senslab.tokens.base import check_selector, select_output


def test_is_scalar_shapes():
    assert is_scalar(torch.zeros(4)) and is_scalar(torch.zeros(4, 1))
    assert not is_scalar(torch.zeros(4, 2)) and not is_scalar(torch.zeros(4, 1, 1))


@pytest.mark.parametrize("kind, threshold, boundary", [
    ("logits", None, 0.0), ("probabilities", None, 0.5), ("scores", 2.5, 2.5),
])
def test_one_column_boundary_per_kind(kind, threshold, boundary):
    assert threshold_of(kind, threshold) == boundary
    out = torch.tensor([boundary - 1e-3, boundary, boundary + 1e-3])
    # strictly above the boundary is class 1; the boundary itself is class 0
    assert predictions(out, kind, threshold).tolist() == [False, False, True]
    assert predictions(out[:, None], kind, threshold).tolist() == [False, False, True]


@pytest.mark.parametrize("kind", OUTPUT_KINDS)
def test_several_columns_are_argmax_whatever_the_kind(kind):
    out = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]])
    if kind == "scores":
        with pytest.raises(ValueError, match="one-column"):
            resolve_kind(out, kind, 0.5)
        return
    assert predictions(out, kind).tolist() == [1, 0]


def test_integer_outputs_are_labels():
    labels = torch.tensor([3, 0, 7])
    assert predictions(labels).tolist() == [3, 0, 7]
    assert predictions(labels, "scores", 2).tolist() == [True, False, True]


def test_margins_agree_with_predictions():
    g = torch.Generator().manual_seed(0)
    for out, kind, thr in [
        (torch.randn(50, generator=g), "logits", None),
        (torch.rand(50, 1, generator=g), "probabilities", None),
        (torch.randn(50, generator=g) + 3, "scores", 3.0),
        (torch.randn(50, 4, generator=g), "logits", None),
    ]:
        ref = predictions(out, kind, thr)
        m = margins(out, ref, kind, thr)
        assert (m >= 0).all()  # the clean class is always on its own side
        if is_scalar(out):
            # the margin is the distance to the boundary in the output's own units
            assert torch.allclose(m, (out.reshape(-1) - threshold_of(kind, thr)).abs())
            flipped = margins(out, ~ref, kind, thr)
            assert torch.allclose(flipped, -m)
    out = torch.tensor([[1.0, 3.0, 2.5]])
    assert margins(out, torch.tensor([1])).item() == pytest.approx(0.5)
    assert margins(out, torch.tensor([0])).item() == pytest.approx(-2.0)


def test_resolve_refuses_one_column_in_zero_one():
    """A one-column output in [0, 1] with values strictly inside is refused without a kind,
    saturated sigmoid heads included."""
    p = torch.tensor([0.2, 0.6, 0.9])
    with pytest.raises(ValueError, match="output_kind='probabilities'"):
        resolve_kind(p, None)
    assert resolve_kind(p, "probabilities") == "probabilities"
    assert resolve_kind(p, "logits") == "logits"
    assert resolve_kind(torch.tensor([-0.2, 0.6]), None) == "logits"  # not all in (0, 1)
    # a sigmoid head whose confident examples round to exactly 1 (or 0) in float32 is still one
    saturated = torch.sigmoid(torch.tensor([1.5, 1.2, 20.0, -120.0]))
    assert saturated.max().item() == 1.0 and saturated.min().item() == 0.0
    for out in (saturated, torch.tensor([0.0, 0.6]), torch.tensor([1.0, 0.3])):
        with pytest.raises(ValueError, match=r"every value in \[0, 1\]"):
            resolve_kind(out, None)
    assert resolve_kind(saturated, "probabilities") == "probabilities"
    # exact 0s and 1s (hard decisions) read the same as logits and as probabilities
    assert resolve_kind(torch.tensor([0.0, 1.0, 1.0]), None) == "logits"
    assert resolve_kind(torch.tensor([-0.5, 0.0, 1.0]), None) == "logits"  # not all in [0, 1]
    assert resolve_kind(torch.rand(5, 3), None) == "logits"  # several columns: argmax
    assert resolve_kind(torch.tensor([0, 1]), None) == "logits"  # integer labels
    with pytest.raises(ValueError, match="not probabilities"):
        resolve_kind(torch.tensor([-1.0, 2.0]), "probabilities")


@pytest.mark.parametrize("kind, threshold, exc, message", [
    ("probs", None, ValueError, "'logits', 'probabilities' or 'scores'"),
    ("scores", None, ValueError, "needs threshold="),
    ("logits", 0.3, ValueError, "output_kind='scores', threshold=0.3"),
    (None, 0.3, ValueError, "output_kind='scores'"),
    ("scores", "0.5", TypeError, "threshold must be a number"),
    ("scores", True, TypeError, "threshold must be a number"),
    ("scores", float("nan"), ValueError, "finite"),
])
def test_check_kind_errors(kind, threshold, exc, message):
    with pytest.raises(exc, match=message):
        check_kind(kind, threshold)


def test_declared_kind_reads_the_model_attribute():
    class Declared(nn.Module):
        output_kind = "probabilities"

    assert declared_kind(Declared(), None) == "probabilities"
    assert declared_kind(Declared(), "logits") == "logits"  # the option wins
    assert declared_kind(nn.Linear(2, 1), None) is None
    bad = nn.Linear(2, 1)
    bad.output_kind = "sigmoid"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="Linear.output_kind is 'sigmoid'"):
        declared_kind(bad, None)


def test_check_rows():
    check_rows(torch.zeros(4, 3), 4, "examples")
    with pytest.raises(ValueError, match="returned 1 rows .* for 8 examples"):
        check_rows(torch.zeros(1, 3), 8, "examples")
    with pytest.raises(ValueError, match="single number"):
        check_rows(torch.tensor(0.5), 8, "examples")


def test_one_rule_in_the_training_loop():
    """loss_function/correct read outputs with the same rule as the measurement."""
    from senslab.train.loop import correct, loss_function

    g = torch.Generator().manual_seed(1)
    scalar, multi = torch.randn(20, generator=g), torch.randn(20, 4, generator=g)
    y2, y4 = torch.randint(0, 2, (20,), generator=g), torch.randint(0, 4, (20,), generator=g)
    assert int(correct(scalar, y2)) == int((predictions(scalar).long() == y2).sum())
    assert int(correct(scalar[:, None], y2)) == int((predictions(scalar).long() == y2).sum())
    assert int(correct(multi, y4)) == int((predictions(multi) == y4).sum())
    bce = loss_function("auto", scalar)(scalar, y2)
    assert bce.item() == pytest.approx(
        nn.functional.binary_cross_entropy_with_logits(scalar, y2.float()).item())
    ce = loss_function("auto", multi)(multi, y4)
    assert ce.item() == pytest.approx(nn.functional.cross_entropy(multi, y4).item())


# -- the output selector ----------------------------------------------------------------------


def test_select_output_defaults():
    z = torch.randn(3, 2)
    assert select_output(z) is z
    assert select_output({"logits": z, "hidden": z + 1}) is z
    assert select_output(OrderedDict(logits=z)) is z
    assert select_output(SimpleNamespace(logits=z)) is z  # Hugging Face ModelOutput style
    assert select_output((z,)) is z  # one element: unambiguous
    with pytest.raises(TypeError, match=r"\[0\] Tensor\(3, 5\), \[1\] Tensor\(3, 2\).*output=1"):
        select_output((torch.zeros(3, 5), z))
    with pytest.raises(TypeError, match="output='scores'"):
        select_output({"scores": z})
    with pytest.raises(TypeError, match="not a logits tensor"):
        select_output("text")
    # a base model's output: no head, so no class; the hint named last_hidden_state, which
    # measured the argmax over the hidden units of the last token (0.106 on MiniLM)
    hidden = OrderedDict(last_hidden_state=torch.randn(3, 5, 8), pooler_output=z)
    with pytest.raises(TypeError, match="the model has no head.*compare='l2'") as err:
        select_output(hidden)
    assert "output='last_hidden_state'" not in str(err.value)


def test_select_output_explicit():
    z = torch.randn(3, 2)
    assert select_output((torch.zeros(3, 5), z), 1) is z
    assert select_output((torch.zeros(3, 5), z), -1) is z
    assert select_output({"scores": z}, "scores") is z
    assert select_output(SimpleNamespace(scores=z), "scores") is z
    assert torch.equal(select_output((z, z), lambda o: o[0] + o[1]), 2 * z)
    with pytest.raises(TypeError, match="output=2 does not select"):
        select_output((z, z), 2)
    with pytest.raises(TypeError, match="indexes a tuple/list output"):
        select_output(z, 0)
    with pytest.raises(TypeError, match="selected a str"):
        select_output({"name": "x"}, "name")
    with pytest.raises(TypeError, match="output= selects the logits"):
        check_selector(1.5)
    with pytest.raises(TypeError, match="output= selects the logits"):
        check_selector(True)


def test_output_sharpness_reads_the_same_rule():
    from senslab.measure.sharpness import output_sharpness

    torch.manual_seed(0)  # test-only: model init
    logit = nn.Linear(6, 1)
    prob = nn.Sequential(logit, nn.Sigmoid())
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
    ref = output_sharpness(logit, x, sigma_w=0.5, generator=0)
    assert output_sharpness(prob, x, sigma_w=0.5, generator=0).shpred is None  # ambiguous
    got = output_sharpness(prob, x, sigma_w=0.5, generator=0, output_kind="probabilities")
    assert got.shpred is not None and ref.shpred is not None
    assert got.shpred.estimate == ref.shpred.estimate > 0
