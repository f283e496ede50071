"""Audit 81 of the paired comparison (``compare_sensitivity``/``CompareSensitivity``).

* A model swapped into a comparison (``metric.metrics[name].model = other``) and refused by its
  first update (an MC-dropout model: random in eval mode) was accepted on the retry, its
  dropout counted as flips (0.375 for 0.109): the failed update had handed it the old model's
  checked shapes back.
* Two models that differ on some copies, with every per-example difference the same, got a
  paired standard error of 0 and a 95% interval of one point, without a word.
* Warnings said during a comparison's ``update`` (a model reading its padding) did not say
  which of the models they meant.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from metric_models import Logit
from torch import nn

from senslab.measure import CompareSensitivity, TokenSensitivity, compare_sensitivity
from senslab.tokens import Embedding, Sequence

T, D = 4, 2


def _w() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(0))


def _caught(fn) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in rec]


# -- a swapped-in model refused once is refused again --------------------------------------------


class Net(nn.Module):
    """A small MLP; ``mc`` > 0: dropout on in eval mode too (MC dropout), a random forward."""

    def __init__(self, seed: int, mc: float = 0.0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1, self.l2, self.mc = nn.Linear(8, 32), nn.Linear(32, 3), mc
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.4 * torch.randn(p.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.l1(x.flatten(1)))
        return self.l2(F.dropout(h, self.mc, training=self.mc > 0))


def test_a_swapped_in_model_refused_once_is_refused_again_after_the_failed_update() -> None:
    """The first update checked the old model's input shape; after a swap the new model's
    update refused its random forward, and the failed comparison update put the old model's
    checked shapes back: the retry skipped the check and counted the dropout as flips."""
    x = torch.randn(16, T, D, generator=torch.Generator().manual_seed(1))
    metric = CompareSensitivity({"a": Net(0), "b": Net(1)}, Sequence(), sigma=0.3, repeats=2,
                                generator=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(x)
    metric.reset()
    metric.metrics["a"].model = Net(2, mc=0.5)
    for _ in range(2):  # the retry is refused as the first try was
        with pytest.raises(RuntimeError, match="model 'a': .*changed between two evaluations"):
            metric.update(x)
        assert metric.metrics["a"].state.n == 0 and metric.paired["a", "b"].n == 0
    # back to a deterministic model: measured, as one metric that measured both would
    metric.metrics["a"].model = Net(2)
    own = TokenSensitivity(Net(0), Sequence(), sigma=0.3, repeats=2, generator=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(x)
        r = metric.compute()
        own.update(x)
        own.reset()
        own.model = Net(2)
        own.update(x)
        want = own.compute()
    assert r.results["a"].estimate == want.estimate
    assert torch.equal(r.results["a"].per_sample, want.per_sample)


# -- a paired standard error of no spread --------------------------------------------------------


def test_a_paired_standard_error_of_no_spread_is_warned_once_per_pair() -> None:
    """Biases 0 and 0.15 on 2 examples: the models differ on 4 of the 32 copies, 2 in each
    example, so both per-example differences are -0.125 and the data standard error is 0:
    ``-0.1250 ± 0.0000 (95% CI -0.1250–-0.1250)``, with no warning (each model had 10 or more
    flips), where the unpaired one is 0.22."""
    w = _w()
    x = 0.3 * torch.randn(2, T, D, generator=torch.Generator().manual_seed(34))
    metric = CompareSensitivity({"a": Logit(w, 0.0), "b": Logit(w, 0.15)}, Sequence(),
                                sigma=1.0, repeats=4, generator=34)
    metric.update(x)
    r, said = _caught(metric.compute)
    d = r.difference("a", "b")
    assert d.estimate == -0.125 and d.stderr == 0.0 and d.ci95 == (-0.125, -0.125)
    assert d.stderr_unpaired > 0.1
    assert metric.paired["a", "b"].events == 4
    spread = [m for m in said if "rests on no spread" in m]
    assert len(spread) == 1, said
    assert "differ on 4 of the 32 perturbed copies" in spread[0]
    assert "every one of the 2 per-example differences is the same (-0.125)" in spread[0]
    assert "more examples" in spread[0]
    assert not any("rests on no copy on which" in m for m in said)  # they did differ
    _, again = _caught(metric.compute)
    assert not any("rests on no spread" in m for m in again)  # once per pair


def test_no_spread_of_the_subset_estimand_is_warned_too() -> None:
    """mode="whole", repeats=2, estimand="subset": both draws of each example differ alike."""
    w = _w()
    x = 0.3 * torch.randn(2, T, D, generator=torch.Generator().manual_seed(2))
    r, said = _caught(lambda: compare_sensitivity(
        {"a": Logit(w, 0.0), "b": Logit(w, 0.15)}, x, Sequence(), sigma=1.0, mode="whole",
        repeats=2, estimand="subset", generator=2))
    d = r.difference("a", "b")
    assert d.estimate == -0.5 and d.stderr == 0.0
    spread = [m for m in said if "rests on no spread" in m]
    assert len(spread) == 1 and "more draws (repeats=)" in spread[0], said


def test_a_paired_standard_error_with_spread_is_not_warned_of_it() -> None:
    w = _w()
    x = torch.randn(16, T, D, generator=torch.Generator().manual_seed(1))
    r, said = _caught(lambda: compare_sensitivity(
        {"a": Logit(w, 0.0), "b": Logit(w, 0.3)}, x, Sequence(), sigma=1.0, repeats=4,
        generator=0))
    assert r.difference("a", "b").stderr > 0
    assert not any("rests on no spread" in m for m in said)


# -- an update's warnings name the model -----------------------------------------------------


class Text(nn.Module):
    """Mean of its embeddings over the real tokens, or (``reads_pad``) over every position."""

    def __init__(self, reads_pad: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb, self.head, self.reads_pad = nn.Embedding(20, 4), nn.Linear(4, 3), reads_pad
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        e, m = self.emb(input_ids), attention_mask[..., None].float()
        return self.head(e.mean(1) if self.reads_pad else (e * m).sum(1) / m.sum(1))


def _text() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 20, (6, 7), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(7)[None] < torch.tensor([7, 3, 5, 2, 6, 4])[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def test_an_updates_warnings_name_the_model_they_are_about() -> None:
    """Of a model that reads its padding and one that does not, the warning that the padding
    is read (and the copies run at full width) said nothing of which model it meant."""
    metric = CompareSensitivity({"masked": Text(False), "reads_pad": Text(True)},
                                Embedding("emb"), sigma=0.8, repeats=2, generator=3)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        metric.update(_text())
    padding = [w for w in rec if "padding-aware batching is off" in str(w.message)]
    assert len(padding) == 1
    assert str(padding[0].message).startswith("model 'reads_pad': ")
    assert padding[0].filename == __file__  # still the user's call
    assert metric.metrics["masked"].last_trimmed and not metric.metrics["reads_pad"].last_trimmed


def test_an_updates_warning_raised_as_an_error_names_the_model_and_adds_nothing() -> None:
    metric = CompareSensitivity({"masked": Text(False), "reads_pad": Text(True)},
                                Embedding("emb"), sigma=0.8, repeats=2, generator=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="^model 'reads_pad': padding-aware batching"):
            metric.update(_text())
    assert metric.metrics["masked"].state.n == 0 and metric.paired["masked", "reads_pad"].n == 0
