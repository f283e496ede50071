"""Trainer ``"sparse_frequent"``: the sparse/frequent-token task of "Transformers Learn Low
Sensitivity Functions" (ICLR 2025), §4.1 / A.1, used by ``synthetic_sparse_frequent``.

One run: dataset ``sparse_frequent`` (case and setting of ``SPARSE_FREQUENT_SETTINGS`` in
:mod:`senslab.data.synthetic`; ``train_size`` training and ``test_size`` test and OOD
sequences), model ``sparse_attention`` (f(X) = mean_i Σ_j softmax_j(x_jᵀ W x_i) vᵀx_j, init
scale ``init_scale``), logistic loss, plain SGD (``lr``, ``batch_size``, a seeded permutation
per epoch) for ``epochs`` epochs. Every ``eval_every`` epochs (and at 0 and the last): train
loss, train/test/OOD accuracy; ``align/<type>`` = cos(v, u) with u_sparse = mean(e_S₊) −
mean(e_S₋), u_frequent = mean(e_F₊) − mean(e_F₋) and u_irrelevant = mean(e_R)
(:func:`feature_directions`); ``attn/<type>``, the softmax attention mass each token type
receives (:func:`attention_by_type`); ``sens/train``, token-wise sensitivity with the replacement
token uniform over the vocabulary on the first ``sens_examples`` training sequences. The summary
adds the sensitivity of the ideal sparse and frequent classifiers (``solution/sparse``,
``solution/frequent``) to ``final``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._seeds import noise_seed
from ...data import create_dataset
from ...data.base import ArrayDataset
from ...data.synthetic import SPARSE_FREQUENT_SETTINGS, TOKEN_TYPES, feature_sensitivities
from ...measure import TokenSensitivity
from ...models import create_model
from ...models.small import SparseAttention
from ...tokens import Sequence
from ..config import ranged, seeded
from ..looprun import check_dir
from ..track import capped
from ..trainers import register_trainer
from ._common import EpochLoop, minibatch_epoch, run_epochs


@dataclass
class SparseFrequentTraining:
    """What every run of a scale shares: data sizes, initialisation, SGD, tracking, seed."""

    epochs: int = ranged(50, ge=1)
    batch_size: int = ranged(50, ge=1)
    lr: float = ranged(0.5, gt=0)
    train_size: int = ranged(1000, ge=1)
    test_size: int = ranged(1000, ge=1)
    init_scale: float = ranged(0.01, ge=0)
    eval_every: int = ranged(5, ge=1)
    sens_examples: int = ranged(256, ge=1)
    seed: int = seeded()


@dataclass
class SparseFrequentRun(SparseFrequentTraining):
    """One run: its name, the task's ``case`` (1: the sparse classifier is the less sensitive,
    2: the frequent one) and ``setting`` (0–2), and the shared fields (``test_size`` sequences
    in the test set and as many in the OOD set; ``seed`` seeds data, model and batch order)."""

    name: str = "case1-s0"
    case: int = ranged(1, ge=1, le=2)
    setting: int = ranged(0, ge=0, le=2)


def feature_directions(data: ArrayDataset) -> dict[str, Tensor]:
    """The three reference vectors the head v is compared with (one-hot token space)."""
    sets = data.meta["token_sets"]
    eye = torch.eye(data.inputs.shape[-1])

    def mean(name: str) -> Tensor:
        return eye[sets[name]].mean(0)

    return {"sparse": mean("sparse+") - mean("sparse-"),
            "frequent": mean("frequent+") - mean("frequent-"),
            "irrelevant": mean("irrelevant")}


@torch.no_grad()
def attention_by_type(model: SparseAttention, data: ArrayDataset) -> dict[str, float]:
    """Σ of the softmax attention landing on each token type, averaged over queries and
    sequences (the three values sum to 1)."""
    received = model.attention_weights(data.inputs).mean(dim=1)  # (N, L): mean over queries
    types = data.meta["token_type"]
    return {t: (received * (types == code)).sum(1).mean().item()
            for code, t in enumerate(TOKEN_TYPES)}


@torch.no_grad()
def accuracy(model: SparseAttention, data: ArrayDataset) -> float:
    return ((model(data.inputs) > 0).long() == data.targets).float().mean().item()


def example() -> SparseFrequentRun:
    """Case 1, setting 0 at 200 sequences a split: 8 epochs, an evaluation after each."""
    return SparseFrequentRun(name="example", epochs=8, train_size=200, test_size=200,
                             eval_every=1, sens_examples=32)


@register_trainer("sparse_frequent", SparseFrequentRun, example=example, check_dir=check_dir)
def train_sparse_frequent(cfg: SparseFrequentRun, path: Path, *, progress: bool | None = None,
                          log: Any = print) -> dict[str, Any]:
    def build() -> EpochLoop:
        opts = {"case": cfg.case, "setting": cfg.setting, "seed": cfg.seed}
        train = create_dataset("sparse_frequent", "train", num_samples=cfg.train_size, **opts)
        test = create_dataset("sparse_frequent", "test", num_samples=cfg.test_size, **opts)
        ood = create_dataset("sparse_frequent", "ood", num_samples=cfg.test_size, **opts)
        data_cfg = SPARSE_FREQUENT_SETTINGS[cfg.case, cfg.setting]
        vocab = data_cfg.vocab_size
        model = create_model("sparse_attention", dim=vocab, init_scale=cfg.init_scale,
                             seed=cfg.seed)
        assert isinstance(model, SparseAttention)
        solutions = feature_sensitivities(data_cfg, seed=cfg.seed)
        directions = feature_directions(train)
        # config.json keeps the count asked for: a smaller training set is said
        sens_x = train.inputs[: capped(cfg.sens_examples, train, "sens_examples",
                                       "training set", "sens/train")]
        gen = torch.Generator().manual_seed(cfg.seed)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        x, y = train.inputs, train.targets.float()

        said: set[str] = set()

        def evaluate() -> dict[str, Any]:
            with torch.no_grad():
                loss = F.binary_cross_entropy_with_logits(model(x), y).item()
                v = model.v.detach()
                align = {f"align/{k}": F.cosine_similarity(v, u, dim=0).item()
                         for k, u in directions.items()}
            metric = TokenSensitivity(model, Sequence(), replace_with=torch.eye(vocab),
                                      generator=noise_seed(cfg.seed))
            metric._said = said  # a cause the measurements warn of: said once per run
            metric.update(sens_x)
            sens = metric.compute()
            return {"train/loss": loss, "train/acc": accuracy(model, train),
                    "test/acc": accuracy(model, test), "ood/acc": accuracy(model, ood), **align,
                    **{f"attn/{k}": m for k, m in attention_by_type(model, train).items()},
                    "sens/train": sens.estimate, "sens/train_se": sens.stderr}

        return EpochLoop(
            model, opt, evaluate=evaluate, generators={"batches": gen},
            train_epoch=lambda: minibatch_epoch(model, opt, x, y,
                                                F.binary_cross_entropy_with_logits,
                                                cfg.batch_size, gen),
            final_extra={"solution/sparse": solutions["sparse"],
                         "solution/frequent": solutions["frequent"]},
            summary=lambda _: {"case": cfg.case, "setting": cfg.setting, "epochs": cfg.epochs})

    return run_epochs(cfg, path, cfg.name, build)
