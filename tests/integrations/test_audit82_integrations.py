"""Audit 82 of the integrations, as a researcher uses them in their own stack:

- Hugging Face: one callback attached to one Trainer and then evaluated by another (a sweep
  reusing the callback) had logged the second Trainer's values through the first, into its
  log_history and reporters at its last step, and none into the second's.
- torchmetrics: a copy of the metric (``clone()``, a ``MetricCollection``'s or a
  ``MetricTracker``'s) copied the model's modules its options and tokens hold as objects: an
  ``output=model.head`` copy kept the head of the moment it was made (0.094 where the trained
  head gives 0.156), and an ``Embedding(module)`` copy refused the model it was built for.

Real Trainers, metrics and tiny models, no mocks."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

import copy  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchmetrics import MetricCollection, MetricTracker  # noqa: E402
from transformers import Trainer  # noqa: E402

from senslab.integrations.hf import SensitivityCallback  # noqa: E402
from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Embedding, Patches  # noqa: E402

from .test_hf import TOKENS, Texts, arguments, tiny_bert  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # few flips on a toy model


def _logged(trainer: Trainer) -> list[tuple[int, float]]:
    return [(e["step"], e["eval_sensitivity"]) for e in trainer.state.log_history
            if "eval_sensitivity" in e]


def test_a_callback_attached_to_one_trainer_logs_another_trainers_values_there(tmp_path: Path):
    """Before: the second Trainer's evaluations at steps 2, 4, 6 went into the first Trainer's
    log_history, each at its last step 4 (steps [2, 4, 4, 4, 4]), and the second's held none.
    Now each Trainer's log_history holds its own evaluations at its own steps, with a warning
    naming attach()."""
    train, val = Texts(32, 1), Texts(8, 2)
    callback = SensitivityCallback(val.batch(6), Embedding(TOKENS), sigma=2.0, generator=3)
    first = Trainer(model=tiny_bert(), args=arguments(tmp_path / "a", report_to="none"),
                    train_dataset=train, eval_dataset=val)
    callback.attach(first)
    first.train()
    second = Trainer(model=tiny_bert(),
                     args=arguments(tmp_path / "b", report_to="none", max_steps=6),
                     train_dataset=train, eval_dataset=val, callbacks=[callback])
    with pytest.warns(UserWarning, match=r"attached to another Trainer.*attach\(trainer\)"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "SensitivityCallback.*a new run starts")
            second.train()
    assert [s for s, _ in _logged(first)] == [2, 4]
    assert _logged(second) == [(s, r.estimate) for s, r in callback.results]
    assert [s for s, _ in _logged(second)] == [2, 4, 6]
    # attached again, it logs through the second Trainer without a word
    callback.attach(second)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        metrics = second.evaluate()
    assert _logged(second)[-1] == (6, metrics["eval_sensitivity"])
    assert [s for s, _ in _logged(first)] == [2, 4]


def _body_and_head() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)  # test-only: init
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh()), nn.Linear(8, 3)


def test_a_clone_of_the_metric_measures_with_the_models_head_not_a_stale_copy():
    """Before: the clone measured 0.09375 with the head as it was when cloned, the original
    0.15625 with the trained head. Now both (and a MetricCollection's and a MetricTracker's
    copies) use the model's own head; a copy of a whole module still copies its head."""
    body, head = _body_and_head()
    x = torch.randn(16, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    metric = TokenSensitivityMetric(Patches(2), sigma=0.5, output=head)
    copies = [metric.clone(),
              MetricCollection({"s": metric}, compute_groups=False).clone(prefix="val_")["s"],
              MetricTracker(metric, maximize=False)]
    copies[2].increment()
    copies[2] = copies[2][-1]
    with torch.no_grad():  # training moves the head after the copies are made
        head.weight.mul_(-3.0)
        head.bias.add_(1.0)
    metric.update(body, x)
    want = metric.compute().item()
    assert want == 0.15625
    for other in copies:
        other.update(body, x)
        assert other.compute().item() == want
        assert other.options["output"] is head

    class Whole(nn.Module):  # the metric copied with the module it measures: copied with it
        def __init__(self) -> None:
            super().__init__()
            self.sens = TokenSensitivityMetric(Patches(2), sigma=0.5, output=head)
            self.head = head

    whole = Whole()
    twin = copy.deepcopy(whole)
    assert twin.head is not head and twin.sens.options["output"] is twin.head


def test_a_clone_of_an_embedding_metric_measures_the_model_it_was_built_for():
    """Before: the clone's Embedding held a copy of the LayerNorm, and its update refused the
    model ("not a submodule of BertForSequenceClassification")."""
    model = tiny_bert()
    subset = {k: v for k, v in Texts(8, 2).batch(8).items() if k != "labels"}
    metric = TokenSensitivityMetric(Embedding(model.bert.embeddings.LayerNorm), sigma=2.0)
    twin = metric.clone()
    metric.update(model, subset)
    twin.update(model, subset)
    assert twin.compute().item() == metric.compute().item() > 0
