"""Trainer ``"sparse_parity"``: a transformer learning a k-sparse parity, with Boolean
sensitivity as a progress measure ("Transformers Learn Low Sensitivity Functions", ICLR 2025,
A.6), used by the ``sparse_parity`` experiment.

One run: dataset ``sparse_parity`` (x uniform on {±1}ⁿ with n = ``n_bits``, y the parity of a
seeded subset S of ``k`` bits; ``train_size`` training and ``test_size`` test strings), model
``parity_transformer`` (``layers`` pre-LN layers of ``width``, ``heads`` heads, MLP
``mlp_dim`` (default 4 × width), mean pooling, 2-class head), cross-entropy, Adam (``lr``),
minibatches of ``batch_size`` in a seeded order, ``epochs`` epochs. Every ``eval_every`` epochs
(and at 0 and the last): train/test loss and accuracy and ``bool_sens`` = the sampled average
sensitivity E_x Σᵢ 1[ŷ(x) ≠ ŷ(x^⊕i)] of the predicted class on the same ``bool_samples`` strings
at every evaluation, its standard error ``bool_sens_se`` and the part on the relevant bits,
``bool_sens/relevant`` = Σ_{i∈S} Inf_i. The summary holds ``k``, ``n_bits`` and the plateau
measures (:func:`parity_progress`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..._seeds import noise_seed
from ..._stack import said_once
from ...data import create_dataset
from ...measure import boolean_sensitivity
from ...models import create_model
from ..config import ranged, seeded
from ..looprun import check_dir
from ..trainers import register_trainer
from ._common import EpochLoop, classification_record, minibatch_epoch, run_epochs

#: the plateau ends at the first evaluation with test accuracy ≥ PLATEAU_ACC ("≈ 50%" before)
PLATEAU_ACC = 0.6


@dataclass
class SparseParityTraining:
    """The problem, the model's depth and heads, the epochs and the tracking."""

    n_bits: int = ranged(20, ge=1)
    k: int = ranged(3, ge=1)
    epochs: int = ranged(40, ge=1)
    test_size: int = ranged(1000, ge=1)
    eval_every: int = ranged(1, ge=1)
    bool_samples: int = ranged(500, ge=1)
    heads: int = ranged(4, ge=1)
    layers: int = ranged(2, ge=1)


@dataclass
class SparseParityRun(SparseParityTraining):
    """One run: its name, the shared fields, and the training set, batch, width, Adam learning
    rate and seed (data, model and batch order) of the run; ``mlp_dim`` None is 4 × width."""

    name: str = "sparse-parity"
    train_size: int = ranged(2000, ge=1)
    batch_size: int = ranged(32, ge=1)
    width: int = ranged(32, ge=1)
    mlp_dim: int | None = ranged(None, ge=1)
    lr: float = ranged(1e-3, gt=0)
    seed: int = seeded()


def parity_progress(history: list[dict[str, Any]]) -> dict[str, Any]:
    """What the claim compares: the plateau (evaluations before test acc first reaches 0.6),
    the sensitivity at its start and its largest value inside it, and the final values."""
    end = next((i for i, r in enumerate(history) if r["test/acc"] >= PLATEAU_ACC), len(history))
    plateau = history[:end]
    top = max(plateau, key=lambda r: r["bool_sens"]) if plateau else None
    return {
        "plateau_evals": len(plateau),
        "plateau_end_epoch": history[end]["epoch"] if end < len(history) else None,
        "sens_start": history[0]["bool_sens"], "sens_start_se": history[0]["bool_sens_se"],
        "sens_plateau_max": None if top is None else top["bool_sens"],
        "sens_plateau_max_se": None if top is None else top["bool_sens_se"],
        "sens_plateau_max_epoch": None if top is None else top["epoch"],
        "plateau_max_test_acc": None if top is None else top["test/acc"],
        "sens_final": history[-1]["bool_sens"], "test_acc_final": history[-1]["test/acc"],
    }


def example() -> SparseParityRun:
    """n = 10, k = 2, 512 training strings, width 16: 10 epochs, an evaluation after each (with
    n = 6 the 512 training strings held all 64, and no test string could be held out)."""
    return SparseParityRun(name="example", n_bits=10, k=2, epochs=10, test_size=128,
                           bool_samples=64, train_size=512, batch_size=16, width=16)


@register_trainer("sparse_parity", SparseParityRun, example=example, check_dir=check_dir)
def train_sparse_parity(cfg: SparseParityRun, path: Path, *, progress: bool | None = None,
                        log: Any = print) -> dict[str, Any]:
    def build() -> EpochLoop:
        opts = {"n_bits": cfg.n_bits, "k": cfg.k, "train_size": cfg.train_size,
                "test_size": cfg.test_size, "seed": cfg.seed}
        train = create_dataset("sparse_parity", "train", **opts)
        test = create_dataset("sparse_parity", "test", **opts)
        subset = train.meta["subset"]
        mlp_dim = 4 * cfg.width if cfg.mlp_dim is None else cfg.mlp_dim
        model = create_model("parity_transformer", n_bits=cfg.n_bits, dim=cfg.width,
                             heads=cfg.heads, layers=cfg.layers, mlp_dim=mlp_dim, seed=cfg.seed)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        gen = torch.Generator().manual_seed(cfg.seed)

        said: set[str] = set()  # a cause the measurements warn of: said once per run

        def measure() -> dict[str, Any]:
            with said_once(said):
                bs = boolean_sensitivity(model, cfg.n_bits, method="sample", output="sign",
                                         num_samples=cfg.bool_samples,
                                         generator=torch.Generator().manual_seed(
                                             noise_seed(cfg.seed)))
            return {"bool_sens": bs.average, "bool_sens_se": bs.stderr,
                    "bool_sens/relevant": bs.influence[subset].sum().item()}

        return EpochLoop(
            model, opt, generators={"batches": gen},
            train_epoch=lambda: minibatch_epoch(model, opt, train.inputs, train.targets,
                                                F.cross_entropy, cfg.batch_size, gen),
            evaluate=lambda: classification_record(model, train, test, measure),
            summary=lambda h: {"k": cfg.k, "n_bits": cfg.n_bits, "progress": parity_progress(h)})

    return run_epochs(cfg, path, cfg.name, build)
