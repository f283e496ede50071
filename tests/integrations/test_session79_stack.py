"""The training-stack callbacks resumed with another configuration: a run resumed from a
checkpoint with a callback of another sigma, subset or seed had continued the checkpoint's
series with its own values, and the jump between the two read as the training's (sigma=8 on 8
examples, 0.064 at step 4, then sigma=2 on 4 examples, 0.016 at step 6, without a word). Now
the checkpoint holds the callback's configuration, and a resumed callback of another one starts
its results anew, keeps the checkpoint's in ``set_aside`` and names the difference. Real tiny
Trainer runs on the CPU, no mocks."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

from senslab.integrations._common import Seed, config_difference, configuration
from senslab.tokens import Embedding, Patches


def _noop(raw):  # an output selector: its name, not its address, goes into the configuration
    return raw


def test_the_configuration_tells_apart_what_changes_the_number_and_only_that():
    x = torch.arange(12.0).reshape(3, 4)

    def config(inputs=x, seed=0, **options):
        return configuration(inputs, Patches(2), None, Seed(seed), options, None)

    base = config(sigma=2, repeats=4, output=_noop)
    # an int and a float sigma are one noise; equal generators one seed; a function by its name
    assert config_difference(config(sigma=2.0, repeats=4, output=_noop), base) is None
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert configuration(x, None, None, Seed(g1), {}, None) == \
        configuration(x, None, None, Seed(g2), {}, None)
    assert "sigma=2.5" in config_difference(config(sigma=2.5, repeats=4, output=_noop), base)
    assert "seed 1" in config_difference(config(seed=1, sigma=2, repeats=4, output=_noop), base)
    other = x.clone()
    other[0, 0] = -1.0  # one value of the subset
    assert config_difference(config(other, sigma=2, repeats=4, output=_noop), base) \
        .startswith("subset: ")
    assert config_difference(None, base) is None  # an older checkpoint: not known, not refused


pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from transformers import Trainer  # noqa: E402

from senslab.integrations.hf import SensitivityCallback  # noqa: E402

from .test_hf import TOKENS, Texts, arguments, tiny_bert  # noqa: E402


def _hf(out: Path, sigma: float, examples: int) -> tuple[Trainer, SensitivityCallback]:
    train, val = Texts(32, 1), Texts(8, 2)
    args = arguments(out, max_steps=6, save_strategy="steps", save_steps=2, report_to="none")
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=train, eval_dataset=val)
    callback = SensitivityCallback(val.batch(examples), Embedding(TOKENS), sigma=sigma,
                                   repeats=4, generator=3).attach(trainer)
    return trainer, callback


def test_hf_resumed_with_another_sigma_and_subset_starts_anew(tmp_path: Path):
    trainer, full = _hf(tmp_path, 8.0, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert [s for s, _ in full.results] == [2, 4, 6]
    assert any(r.estimate > 0 for _, r in full.results)  # not trivially equal zeros
    checkpoint = str(tmp_path / "checkpoint-4")

    # the same callback as before (sigma 8 given as an int): the series continues, no word
    same, callback = _hf(tmp_path, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*(flips|tokenizer|padding).*")
        same.train(resume_from_checkpoint=checkpoint)
    assert [s for s, _ in callback.results] == [2, 4, 6] and callback.set_aside == []
    assert [r.estimate for _, r in callback.results] == [r.estimate for _, r in full.results]

    # another sigma on half the subset: before, results [2, 4] of sigma 8 on 8 examples and [6]
    # of sigma 2 on 4, one series
    other, callback = _hf(tmp_path, 2.0, 4)
    with pytest.warns(UserWarning, match=r"steps \[2, 4\]\) were measured with another "
                                         r"configuration.*subset: .*\(8, 8\).*\(4, 8\).*"
                                         r"sigma=8.*sigma=2.*callback\.set_aside"):
        other.train(resume_from_checkpoint=checkpoint)
    assert [s for s, _ in callback.results] == [6]
    assert {r.sigma for _, r in callback.results} == {2.0}
    assert [[(s, r.sigma, r.num_examples) for s, r in series]
            for series in callback.set_aside] == [[(2, 8.0, 8), (4, 8.0, 8)]]


class _NeedsLabels(torch.nn.Module):
    """A model of one's own whose forward requires ``labels`` and returns (loss, logits)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.norm = torch.nn.Embedding(40, 16), torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask, labels):
        m = attention_mask[..., None].float()
        logits = self.head((self.norm(self.emb(input_ids)) * m).sum(1) / m.sum(1))
        return torch.nn.functional.cross_entropy(logits, labels), logits


def test_a_model_that_requires_the_dropped_labels_is_told_why_they_are_missing(tmp_path: Path):
    """Before: the model's own "missing 1 required positional argument: 'labels'", which read
    as a subset built wrong (the subset held its labels; the callback had dropped them)."""
    val = Texts(8, 2)
    trainer = Trainer(model=_NeedsLabels(), args=arguments(tmp_path, report_to="none"),
                      train_dataset=val, eval_dataset=val)
    SensitivityCallback(val.batch(8), Embedding("norm"), sigma=2.0).attach(trainer)
    with pytest.raises(TypeError, match="labels") as caught:
        trainer.train()
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "drops the label column(s) ['labels']" in notes and "labels=None" in notes


pytest.importorskip("lightning")

import lightning  # noqa: E402
from lightning_toys import Module, data  # noqa: E402

from senslab.integrations.lightning import SensitivityCallback as LightningCallback  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def _fit(tmp_path: Path, callback: LightningCallback, epochs: int,
         ckpt_path: str | None = None) -> lightning.Trainer:
    loader, _ = data()
    trainer = lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|flips).*")
        trainer.fit(Module(), loader, ckpt_path=ckpt_path)
    return trainer


def test_lightning_resumed_with_another_subset_starts_anew(tmp_path: Path):
    _, subset = data()
    first = LightningCallback(subset, Patches(4), sigma=0.7, repeats=2)
    _fit(tmp_path, first, 2).save_checkpoint(tmp_path / "two.ckpt")
    assert [e for e, _ in first.results] == [1, 2]
    checkpoint = str(tmp_path / "two.ckpt")

    same = LightningCallback(subset.clone(), Patches(4), sigma=0.7, repeats=2)
    _fit(tmp_path, same, 3, checkpoint)  # the same configuration: continued
    assert [e for e, _ in same.results] == [1, 2, 3] and same.set_aside == []

    other = LightningCallback(subset[:5], Patches(4), sigma=0.7, repeats=2)
    with pytest.warns(UserWarning, match=r"epochs \[1, 2\]\) were measured with another "
                                         r"configuration.*subset: '\(10, 1, 8, 8\)"):
        _fit(tmp_path, other, 3, checkpoint)
    assert [(e, r.num_examples) for e, r in other.results] == [(3, 5)]
    assert [[(e, r.num_examples) for e, r in series]
            for series in other.set_aside] == [[(1, 10), (2, 10)]]
