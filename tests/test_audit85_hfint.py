"""Audit 85 of the Hugging Face callback (``senslab.integrations.hf``): a model with a complex
buffer (a LLaMA-style rotary ``freqs_cis``) stopped the training at its first evaluation — the
digest that tells a model's weights apart had no XOR kernel for complex tensors — where
``token_sensitivity`` measures it; a subset of 0 examples was taken, and stopped the run before
training with the model's own error on an empty batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
pytest.importorskip("accelerate")  # the Trainer needs it

sys.path.insert(0, str(Path(__file__).parent))
from integrations.test_hf import TOKENS, Texts, arguments  # noqa: E402
from transformers import Trainer  # noqa: E402

from senslab.integrations.hf import SensitivityCallback  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding  # noqa: E402


class Rotary(nn.Module):
    """Mean-pooled embeddings turned by rotary positions kept as a complex buffer, as LLaMA's
    original code keeps them (``freqs_cis``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(40, 8)
        angles = torch.outer(torch.arange(8.0), torch.tensor([1.0, 0.1, 0.01, 0.001]))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask, labels=None):
        h = self.embed(input_ids)
        turned = torch.view_as_complex(h.reshape(*h.shape[:-1], 4, 2)) * self.freqs_cis[
            : h.shape[1]]
        h = torch.view_as_real(turned).reshape(h.shape)
        m = attention_mask.unsqueeze(-1).float()
        logits = self.head((h * m).sum(1) / m.sum(1))
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
def test_a_model_with_a_complex_buffer_is_measured_at_each_evaluation(tmp_path: Path):
    subset = Texts(8, 2).batch(6)
    inputs = {k: v for k, v in subset.items() if k != "labels"}
    opts = {"sigma": 2.0, "output": "logits", "generator": 3}
    model = Rotary()
    trainer = Trainer(model=model, args=arguments(tmp_path, report_to="none"),
                      train_dataset=Texts(32, 1), eval_dataset=Texts(8, 2))
    callback = SensitivityCallback(subset, Embedding("embed"), **opts).attach(trainer)
    trainer.train()  # raised NotImplementedError ("xor_sum_cpu" ... 'ComplexFloat') at step 2
    assert [step for step, _ in callback.results] == [2, 4]
    ref = token_sensitivity(model, inputs, Embedding("embed"), **opts)
    assert callback.results[-1][1].estimate == ref.estimate
    assert torch.equal(callback.results[-1][1].per_sample, ref.per_sample)

    # the rotations conjugated through .data (no version counter moves; the real parts, all a
    # cast to float64 keeps, stay): other weights at the same step, measured again
    with torch.no_grad():
        model.freqs_cis.data.copy_(model.freqs_cis.conj())
    ref = token_sensitivity(model, inputs, Embedding("embed"), **opts)
    assert trainer.evaluate()["eval_sensitivity"] == ref.estimate
    assert len(callback.results) == 3
    assert torch.equal(callback.results[-1][1].per_sample, ref.per_sample)


def test_a_subset_of_no_example_is_refused_when_the_callback_is_made():
    subset = {k: v[:0] for k, v in Texts(8, 2).batch(6).items()}
    with pytest.raises(ValueError, match="subset of 0 examples"):
        SensitivityCallback(subset, Embedding(TOKENS), sigma=2.0)
    with pytest.raises(ValueError, match="subset of 0 examples"):
        SensitivityCallback(subset["input_ids"], Embedding(TOKENS), sigma=2.0)


def test_lightnings_callback_refuses_a_subset_of_no_example_too():
    pytest.importorskip("lightning")
    from senslab.integrations.lightning import SensitivityCallback as LightningCallback
    from senslab.tokens import Patches

    with pytest.raises(ValueError, match="SensitivityCallback got a subset of 0 examples"):
        LightningCallback(torch.zeros(0, 1, 8, 8), Patches(4), sigma=0.5)
