"""The training callbacks refuse before training what their first measurement would refuse:
an output it cannot read (``ModelOutput(loss=..., scores=...)``, a ``(features, logits)``
pair), a regression head. Before, the Hugging Face callback refused it at the first evaluation,
after ``eval_steps`` of training, and the Lightning one at the end of the first epoch — the
crash lost that training. The Hugging Face callback also drops the Trainer's ``label_names``
(``TrainingArguments(label_names=["targets"])``) from its subset: kept, every perturbed copy
carried the labels and the model computed a loss on each. Real tiny runs on CPU, no mocks."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it
pytest.importorskip("lightning")

import lightning  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)
from transformers.utils import ModelOutput  # noqa: E402

from senslab.integrations import hf  # noqa: E402
from senslab.integrations import lightning as pl_callback  # noqa: E402
from senslab.integrations._common import check_before_training  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding, Patches  # noqa: E402


@dataclass
class Scored(ModelOutput):
    loss: torch.Tensor | None = None
    scores: torch.Tensor | None = None


class Scorer(nn.Module):
    """A text classifier taking its labels as ``targets`` and returning ``Scored``; it counts
    the forwards that got targets outside autograd (the measurement's) and the training ones."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(40, 16), nn.Linear(16, 2)
        self.measured_with_targets = self.trained = 0

    def forward(self, input_ids, attention_mask, targets=None) -> Scored:
        h = self.emb(input_ids)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        scores = self.head((h * m).sum(1) / m.sum(1))
        loss = None
        if targets is not None:
            if torch.is_grad_enabled():
                self.trained += 1
            else:
                self.measured_with_targets += 1
            loss = nn.functional.cross_entropy(scores, targets)
        return Scored(loss=loss, scores=scores)


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 40, (n, 6), generator=g)
        self.targets = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(6, dtype=torch.long),
                "targets": self.targets[i]}

    def batch(self, n: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[:n], "attention_mask": torch.ones(n, 6, dtype=torch.long),
                "targets": self.targets[:n]}


def _args(out: Path, **extra) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out), max_steps=4, per_device_train_batch_size=8, eval_strategy="steps",
        eval_steps=2, logging_steps=2, save_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, seed=0, dataloader_num_workers=0, remove_unused_columns=False,
        **extra)


@pytest.mark.parametrize("attached", [True, False])
def test_the_trainers_label_names_are_dropped(tmp_path: Path, attached: bool):
    """Before: "targets" stayed in the subset and the model computed a loss in 28 forwards of
    the two measurements (30 forwards outside autograd got targets, not the Trainer's 2); the
    values are the same, as this model's scores do not depend on its targets."""
    model = Scorer()
    subset = Rows(8, 2).batch(6)
    trainer = Trainer(model=model, args=_args(tmp_path, label_names=["targets"]),
                      train_dataset=Rows(32, 1), eval_dataset=Rows(8, 2))
    callback = hf.SensitivityCallback(subset, Embedding("emb"), sigma=1.0, output="scores",
                                      generator=4)
    if attached:
        callback.attach(trainer)
    else:
        trainer.add_callback(callback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert sorted(callback.inputs) == ["attention_mask", "input_ids"]
    assert model.trained == 4 and model.measured_with_targets == 2  # the Trainer's evaluations
    assert [step for step, _ in callback.results] == [2, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few flips
        ref = token_sensitivity(model, {k: v for k, v in subset.items() if k != "targets"},
                                Embedding("emb"), sigma=1.0, output="scores", generator=4)
    assert callback.results[-1][1].estimate == ref.estimate


def _tiny_bert(labels: int) -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=labels))


class Texts(Rows):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(6, dtype=torch.long),
                "labels": self.targets[i].float()}


@pytest.mark.parametrize("case", ["scores", "regression"])
def test_an_output_it_cannot_read_is_refused_before_training(tmp_path: Path, case: str):
    """Before: the Trainer ran eval_steps=2 optimizer steps, then the first evaluation's
    measurement refused the output (TypeError naming output='scores'; a one-output BERT with no
    problem_type, a regression head to Hugging Face), and the training was lost."""
    if case == "scores":
        model: nn.Module = Scorer()
        trainer = Trainer(model=model, args=_args(tmp_path, label_names=["targets"]),
                          train_dataset=Rows(32, 1), eval_dataset=Rows(8, 2))
        tokens, error, match = Embedding("emb"), TypeError, r"output='scores'"
    else:
        model = _tiny_bert(1)
        trainer = Trainer(model=model, args=_args(tmp_path), train_dataset=Texts(32, 1),
                          eval_dataset=Texts(8, 2))
        tokens = Embedding("bert.embeddings.LayerNorm")
        error, match = ValueError, r"regression head"
    callback = hf.SensitivityCallback(Rows(8, 2).batch(6), tokens, sigma=1.0).attach(trainer)
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    with pytest.raises(error, match=match) as caught:
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert "found before training" in " ".join(getattr(caught.value, "__notes__", [])) \
        or sys.version_info < (3, 11)
    assert model.training and callback.results == []


class Pair(lightning.LightningModule):
    """Returns ``(features, logits)``; counts its training steps."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.body(x)
        return f, self.head(f)

    def training_step(self, batch, _):
        self.steps += 1
        x, y = batch
        return nn.functional.cross_entropy(self(x)[1], y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _fit(module: lightning.LightningModule, callback) -> lightning.Trainer:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    return trainer


def test_lightning_refuses_an_unreadable_output_at_fit_start():
    """Before: the epoch's 4 training steps ran, then on_train_epoch_end's measurement
    refused the (features, logits) pair. With output=1 the same run measures."""
    subset = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    module = Pair()
    with pytest.raises(TypeError, match=r"output=1 for \(features, logits\)"):
        _fit(module, pl_callback.SensitivityCallback(subset, Patches(4), sigma=0.7))
    assert module.steps == 0 and module.training
    module = Pair()
    callback = pl_callback.SensitivityCallback(subset, Patches(4), sigma=0.7, output=1)
    _fit(module, callback)
    assert module.steps == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few flips
        ref = token_sensitivity(module, subset, Patches(4), sigma=0.7, output=1, generator=0)
    assert [(e, r.estimate) for e, r in callback.results] == [(1, ref.estimate)]


class Dropped(nn.Module):
    """Dropout and a BatchNorm with running statistics: a train-mode forward changes both."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8),
                                 nn.Dropout(0.5), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize("eval_mode", [True, False])
def test_the_check_leaves_the_model_as_it_was(eval_mode: bool):
    """Modes (the top module's and a submodule set apart), buffers, gradients and the global
    random state are the same after the check; it runs in the measurement's mode. With
    eval_mode=False a train-mode forward draws dropout masks from the global generator: kept,
    a Trainer with the callback trained on other masks than one without (a tiny BERT's weights
    differed by 0.06 after 6 steps)."""
    model = Dropped().train()
    model.net[3].eval()  # a submodule's own mode
    seen = []
    model.net[2].register_forward_hook(lambda m, a, o: seen.append(m.training))
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    x = torch.randn(20, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    model.net[3].train(not eval_mode)  # dropout draws in the model's own (train) mode
    check_before_training(model, x, Patches(4), mask=None, batch=None,
                          options={"sigma": 0.5, "eval_mode": eval_mode}, where="test")
    assert seen == [not eval_mode]  # one forward, in the measurement's mode
    assert model.training and model.net[2].training and model.net[3].training != eval_mode
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in buffers.items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())


def test_the_check_runs_the_first_examples_only():
    """One forward of at most 8 examples (at most the first measuring batch)."""
    model = Dropped()
    sizes = []
    model.register_forward_hook(lambda m, a, o: sizes.append(a[0].shape[0]))
    x = torch.randn(20, 1, 8, 8)
    for batch, want in ((None, 8), (3, 3)):
        sizes.clear()
        check_before_training(model, x, Patches(4), mask=None, batch=batch,
                              options={"sigma": 0.5}, where="test")
        assert sizes == [want]


def test_a_failure_on_another_process_stops_this_one():
    """A process whose own check passed raises, naming the other process's failure, when the
    processes' decision says one failed (what the all-reduce reports)."""
    x = torch.randn(4, 1, 8, 8)
    with pytest.raises(RuntimeError, match="failed on another process"):
        check_before_training(Dropped(), x, Patches(4), mask=None, batch=None,
                              options={"sigma": 0.5}, where="SensitivityCallback",
                              any_failed=lambda failed: True)
    check_before_training(Dropped(), x, Patches(4), mask=None, batch=None,
                          options={"sigma": 0.5}, where="SensitivityCallback",
                          any_failed=lambda failed: failed)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model = Dropped()
    if rank == 1:  # this process's model returns a pair
        model.forward = lambda x: (x.flatten(1), Dropped.forward(model, x))  # type: ignore
    try:
        check_before_training(model, torch.randn(4, 1, 8, 8), Patches(4), mask=None,
                              batch=None, options={"sigma": 0.5}, where="SensitivityCallback")
        said = "passed"
    except Exception as err:  # noqa: BLE001 - what each process raised is the result
        said = f"{type(err).__name__}: {err}"
    Path(out, f"rank{rank}").write_text(said)
    dist.destroy_process_group()


@pytest.mark.heavy
def test_every_process_stops_when_one_fails(tmp_path: Path):
    """Two gloo processes, the check failing on rank 1 alone: rank 0 stops too (it had gone
    on to train and waited for rank 1 at its first collective)."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "rank1").read_text().startswith("TypeError: model returned tuple")
    assert (tmp_path / "rank0").read_text().startswith(
        "RuntimeError: SensitivityCallback: the check before training failed on another")


if __name__ == "__main__":
    import torch.multiprocessing as mp

    target = sys.argv[1]
    mp.start_processes(_worker, args=(2, "file://" + os.path.join(target, "rendezvous"), target),
                       nprocs=2, join=True, start_method="fork")
