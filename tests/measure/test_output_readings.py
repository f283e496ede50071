"""Output conventions that were read wrongly without a word: a declared
``output_kind`` on a multi-label head of several labels (its argmax measured), class labels
returned as floats (read as logits: labels 1, 2, ... one class), a comparison's shared
``output_kind`` overriding a model's own, refusals in a comparison naming no model, a
``.squeeze()`` on a batch of one, and bool bits given to the reference functions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import compare_sensitivity, token_sensitivity
from senslab.measure.functions import majority, parity
from senslab.measure.sharpness import output_sharpness
from senslab.tokens import Sequence

pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests on")

KW = dict(sigma=1.0, repeats=4, precision="float32", generator=0)


def _linear(d_in: int, d_out: int) -> nn.Linear:
    torch.manual_seed(0)  # test-only: layer init
    return nn.Linear(d_in, d_out)


def _tokens(b: int = 32, t: int = 6, d: int = 4) -> torch.Tensor:
    return torch.randn(b, t, d, generator=torch.Generator().manual_seed(1))


# ------------------------------------------------ a declared kind on several-label HF heads
def _bert(problem: str, labels: int) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        vocab_size=60, max_position_embeddings=32, num_labels=labels, problem_type=problem)
    return transformers.BertForSequenceClassification(config).eval()


def _ids() -> torch.Tensor:
    return torch.randint(3, 60, (4, 7), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize(("problem", "labels"), [("multi_label_classification", 4),
                                                 ("regression", 2)])
def test_a_declared_kind_on_a_head_of_several_outputs_is_refused(problem, labels):
    """output_kind='logits' skipped the multi-label/regression guard, yet it reads one column
    only: the 4 independent sigmoids were measured by their argmax without a word."""
    model = _bert(problem, labels)
    with pytest.raises(ValueError, match=f"num_labels={labels}.*argmax.*one output at a time"):
        token_sensitivity(model, _ids(), sigma=0.5, repeats=2, output_kind="logits")
    with pytest.raises(ValueError, match=f"num_labels={labels}"):
        output_sharpness(model, _ids(), sigma_w=0.05, repeats=2, generator=0,
                         output_kind="logits")
    # the route the message names measures one output
    kind = dict(output_kind="logits") if problem.startswith("multi") else dict(
        output_kind="scores", threshold=0.0)
    r = token_sensitivity(model, _ids(), sigma=5.0, repeats=4, output=lambda o: o.logits[:, 1],
                          **kind)
    assert r.estimate > 0
    if problem.startswith("multi"):  # one label: the declared kind reads its one column
        one = token_sensitivity(_bert(problem, 1), _ids(), sigma=5.0, repeats=4,
                                output_kind="logits")
        assert one.estimate > 0


# ---------------------------------------------------------------- class labels as floats
def test_float_class_labels_are_refused_not_read_as_logits():
    """argmax(...).float(): read as logits (class 1 iff > 0) labels 1..4 were one class, and
    the sensitivity came out about a third of the labels' own (0.086 vs 0.246)."""
    lin = _linear(4, 5)
    x = _tokens()
    labels = token_sensitivity(lambda z: lin(z).sum(1).argmax(1), x, Sequence(), **KW)
    assert labels.estimate > 0.15
    with pytest.raises(ValueError, match=r"whole numbers from 0 to \d: class labels as floats"):
        token_sensitivity(lambda z: lin(z).sum(1).argmax(1).float(), x, Sequence(), **KW)
    # logits that happen to be whole numbers: declared, taken as is
    declared = token_sensitivity(lambda z: lin(z).sum(1).argmax(1).float(), x, Sequence(),
                                 output_kind="logits", **KW)
    assert declared.estimate < labels.estimate
    # logits that are not all whole numbers pass (every one > 0: class 1, nothing flips)
    lin1 = _linear(4, 1)
    r = token_sensitivity(lambda z: 3.0 + lin1(z).sum((1, 2)).abs(), x, Sequence(), **KW)
    assert r.estimate == 0.0


def test_float_labels_seen_only_on_perturbed_copies_are_refused():
    """Clean labels all 0 or 1 read as logits provisionally; a perturbed copy's label 2 (read
    as class 1, like label 1) is refused instead of never counted."""
    x = torch.zeros(8, 3, 3)
    x[:4, 0, 0] = 2.0  # class 0
    x[4:, 0, 1] = 2.0  # class 1

    def f(z):
        return z.sum(1).argmax(1).float()

    with pytest.raises(ValueError, match="perturbed inputs it returns one column of whole"):
        token_sensitivity(f, x, Sequence(), sigma=3.0, repeats=8, precision="float32",
                          generator=0)
    ok = token_sensitivity(lambda z: z.sum(1).argmax(1), x, Sequence(), sigma=3.0, repeats=8,
                           precision="float32", generator=0)
    assert ok.estimate > 0


# ------------------------------------------------------- comparisons and their shared options
def _logit_and_prob():
    lin = _linear(4, 1)

    def logit(z):
        return lin(z).sum((1, 2))

    def prob(z):
        return torch.sigmoid(lin(z).sum((1, 2)))

    return logit, prob


def test_a_shared_kind_overriding_a_models_declared_one_is_refused():
    """The option applied to every model: a sigmoid head declaring 'probabilities' was read
    as logits (0.0) and the difference came out significant without a word."""
    logit, prob = _logit_and_prob()
    prob.output_kind = "probabilities"
    x = _tokens(16, 5)
    models = {"logit": logit, "prob": prob}
    with pytest.raises(ValueError, match="model 'prob' declares output_kind='probabilities'"):
        compare_sensitivity(models, x, Sequence(), output_kind="logits", **KW)
    r = compare_sensitivity(models, x, Sequence(), **KW)
    own = token_sensitivity(prob, x, Sequence(), **KW)
    assert r.results["prob"].estimate == own.estimate > 0
    # the same decisions: sign of the logit and p > 1/2
    assert r.difference("logit", "prob").estimate == 0.0


def test_a_refusal_in_a_comparison_names_the_model():
    logit, prob = _logit_and_prob()
    x = _tokens(16, 5)
    models = {"logit": logit, "prob": prob}
    with pytest.raises(ValueError, match="model 'prob': the model returns one column"):
        compare_sensitivity(models, x, Sequence(), **KW)
    with pytest.raises(ValueError, match="model 'logit': output_kind='probabilities'.*every "
                                         "model.*model.output_kind"):
        compare_sensitivity(models, x, Sequence(), output_kind="probabilities", **KW)


# ------------------------------------------------------------------------- a batch of one
def test_a_squeeze_on_a_batch_of_one_is_named():
    lin = _linear(4, 3)
    with pytest.raises(ValueError, match=r"3 rows.*\.squeeze\(\) drops the batch axis"):
        token_sensitivity(lambda z: lin(z).sum(1).squeeze(), _tokens(1), Sequence(), **KW)


# ------------------------------------------------------------------ reference functions
@pytest.mark.parametrize("f", [parity, majority])
def test_bool_bits_are_refused_naming_the_conversion(f):
    """A bool batch failed with NotImplementedError '"abs_cpu" not implemented for 'Bool''."""
    bits = torch.tensor([[True, False, True], [False, False, True]])
    with pytest.raises(ValueError, match="bool tensor.*1 − 2·x.float"):
        f(bits)
    assert f(1 - 2 * bits.float()).shape == (2,)
