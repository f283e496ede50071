"""Trainer ``"grokking"``: modular addition until it generalises ("Transformers Learn Low
Sensitivity Functions", ICLR 2025, §7.3 / A.5), used by the ``grokking`` experiment.

One run: dataset ``modular_addition`` ((a + b) mod ``p``, tokens ``a b =``, a seeded
``train_fraction`` of all pairs for training, the rest for testing), model ``modadd_transformer``
(one layer, no LayerNorm; ``dim``, ``heads``, ``mlp_dim`` and the structure options of
:func:`grokking_model`), full-batch AdamW (``lr``, ``weight_decay``, β = (``beta1``,
``beta2``)), one step per epoch, at most ``epochs`` epochs and ``post_epochs`` more after the
first evaluation with test acc ≥ 0.95. Every ``eval_every`` epochs
(and at 0 and the last): train and test loss/accuracy, ``weight_norm`` (L2 norm of all
parameters) and ``sens/train``, the probability that the predicted class changes when
N(0, ``sigma``²) noise is added to one of the two number embeddings, or to both at once with
``sens_mode="whole"`` (never the ``=`` token), in eval mode, on the first ``sens_examples``
training pairs, with the same noise seed at every evaluation (:func:`~senslab._seeds.noise_seed`: a
stream of its own, not the model's). The summary holds the phases (:func:`grokking_phases`) and the
epochs trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..._seeds import noise_seed
from ...data import create_dataset
from ...measure import TokenSensitivity
from ...models import create_model
from ...tokens import Embedding
from ..config import one_of, ranged, seeded
from ..looprun import check_dir
from ..steps import weight_norm
from ..track import capped
from ..trainers import register_trainer
from ._common import EpochLoop, classification_record, run_epochs, sgd_step

MEMORISED = 0.99
GENERALISED = 0.95
#: test accuracy that marks the jump (``sens_before_jump`` is measured just before it)
JUMP = 0.5


@dataclass
class GrokkingTraining:
    """The problem, the model, AdamW, the epoch budget, the tracking and the seed.

    ``residual``, ``pos_init``, ``attn_init`` and ``eq_logit`` are
    :class:`~senslab.models.small.ModAddConfig`'s options (the paper code's model: False,
    "zeros", "mha", True). ``sens_mode``: "token" perturbs one number at a time, "whole" both
    numbers at once (the paper code's protocol), each draw N(0, ``sigma``²) per coordinate.
    """

    p: int = ranged(113, ge=2)
    train_fraction: float = ranged(0.3, gt=0, lt=1)  # 1 leaves no test pair
    dim: int = ranged(128, ge=1)
    heads: int = ranged(4, ge=1)
    mlp_dim: int = ranged(512, ge=1)
    residual: bool = True
    pos_init: str = one_of("normal", "zeros")
    attn_init: str = one_of("linear", "mha")
    eq_logit: bool = False
    lr: float = ranged(1e-3, gt=0)
    weight_decay: float = ranged(1.0, ge=0)
    beta1: float = ranged(0.9, ge=0, lt=1)
    beta2: float = ranged(0.98, ge=0, lt=1)
    epochs: int = ranged(20000, ge=1)
    post_epochs: int = ranged(1000, ge=0)
    eval_every: int = ranged(1, ge=1)
    sigma: float = ranged(0.1, gt=0)  # 0 is no noise, refused by the measurement
    sens_mode: str = one_of("token", "whole")
    sens_examples: int = ranged(1000, ge=1)
    seed: int = seeded()


@dataclass
class GrokkingRun(GrokkingTraining):
    """One run: its name and the shared fields (AdamW's β default to Nanda et al.'s
    (0.9, 0.98))."""

    name: str = "modadd-p113-s0"


def grokking_model(cfg: GrokkingTraining) -> torch.nn.Module:
    """The ``modadd_transformer`` a run of ``cfg`` trains (before any step)."""
    return create_model("modadd_transformer", p=cfg.p, dim=cfg.dim, heads=cfg.heads,
                        mlp_dim=cfg.mlp_dim, residual=cfg.residual, pos_init=cfg.pos_init,
                        attn_init=cfg.attn_init, eq_logit=cfg.eq_logit, seed=cfg.seed)


def grokking_phases(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Phase epochs and the sensitivities the claim compares, from the logged evaluations.

    ``memorisation_epoch``: first train acc ≥ 0.99; ``generalisation_epoch``: first test acc ≥
    0.95 (after memorisation); ``sens_peak``/``peak_epoch``: the largest sensitivity from
    memorisation up to generalisation; ``sens_at_generalisation``; ``sens_before_jump``: the
    sensitivity at the last evaluation before test acc first reaches 0.5 (``jump_epoch``, from
    memorisation on), None when test acc is ≥ 0.5 at memorisation already (no evaluation lies
    between the two). None where a phase never happened.
    """
    def first(pred: Any, start: int = 0) -> int | None:
        return next((i for i in range(start, len(history)) if pred(history[i])), None)

    mem = first(lambda r: r["train/acc"] >= MEMORISED)
    gen = None if mem is None else first(lambda r: r["test/acc"] >= GENERALISED, mem)
    out: dict[str, Any] = {
        "memorisation_epoch": None if mem is None else history[mem]["epoch"],
        "generalisation_epoch": None if gen is None else history[gen]["epoch"],
        "sens_peak": None, "peak_epoch": None, "sens_at_generalisation": None,
        "sens_before_jump": None, "jump_epoch": None,
        "sens_start": history[0]["sens/train"], "sens_final": history[-1]["sens/train"],
        "weight_norm_start": history[0]["weight_norm"],
        "weight_norm_final": history[-1]["weight_norm"],
    }
    if mem is None or gen is None:
        return out
    peak = max(range(mem, gen + 1), key=lambda i: history[i]["sens/train"])
    jump = first(lambda r: r["test/acc"] >= JUMP, mem)
    assert jump is not None  # generalised: test acc ≥ 0.95 ≥ 0.5 from memorisation on
    # jump == mem: clamping "before" to mem gave the value *at* the jump, not before it
    out.update(sens_peak=history[peak]["sens/train"], peak_epoch=history[peak]["epoch"],
               sens_at_generalisation=history[gen]["sens/train"],
               sens_before_jump=history[jump - 1]["sens/train"] if jump > mem else None,
               jump_epoch=history[jump]["epoch"])
    return out


def example() -> GrokkingRun:
    """p = 23 and a 32-wide model: 200 epochs, an evaluation every 20."""
    return GrokkingRun(name="example", p=23, dim=32, heads=2, mlp_dim=64, lr=0.01, epochs=200,
                       eval_every=20, sens_examples=50)


#: every grokking run's summary label (its configuration has no ``label``)
LABEL = "modadd"


@register_trainer("grokking", GrokkingRun, example=example, check_dir=check_dir,
                  label=lambda config: LABEL)
def train_grokking(cfg: GrokkingRun, path: Path, *, progress: bool | None = None,
                   log: Any = print) -> dict[str, Any]:
    def build() -> EpochLoop:
        opts = {"p": cfg.p, "train_fraction": cfg.train_fraction, "seed": cfg.seed}
        train = create_dataset("modular_addition", "train", **opts)
        test = create_dataset("modular_addition", "test", **opts)
        model = grokking_model(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                betas=(cfg.beta1, cfg.beta2))
        # config.json keeps the count asked for: a smaller training set is said
        sens_x = train.inputs[: capped(cfg.sens_examples, train, "sens_examples",
                                       "training set", "sens/train")]
        sens_mask = model.number_mask(sens_x)
        x, y = train.inputs, train.targets

        said: set[str] = set()  # a cause the measurements warn of: said once per run

        def measure() -> dict[str, Any]:
            metric = TokenSensitivity(model, Embedding("embed"), sigma=cfg.sigma,
                                      mode=cfg.sens_mode, generator=noise_seed(cfg.seed))
            metric._said = said
            metric.update(sens_x, sens_mask)
            sens = metric.compute()
            return {"sens/train": sens.estimate, "sens/train_se": sens.stderr,
                    "weight_norm": weight_norm(model)}

        def train_epoch() -> int:  # full batch: one step per epoch
            sgd_step(opt, F.cross_entropy(model(x), y))
            return 1

        def evaluate() -> dict[str, Any]:
            """Losses and accuracies, then (their outputs finite) the measurements."""
            rec = classification_record(model, train, test, dict)
            bad = [f"{k}={rec[k]}" for k in ("train/loss", "test/loss")
                   if not math.isfinite(rec[k])]
            if bad:
                # a finite training loss whose step made the outputs NaN: the run went on to
                # the sensitivity, which failed with "model output is NaN or infinite ... check
                # the model's weights and the inputs", not saying that the training diverged
                state = opt.state[next(model.parameters())]
                done = int(state["step"]) if "step" in state else 0
                raise FloatingPointError(
                    f"the model's outputs became NaN or infinite ({', '.join(bad)}) at the "
                    f"evaluation after epoch {done}: the training diverged; lower lr (now "
                    f"{cfg.lr})")
            model.eval()
            try:
                rec.update(measure())
            finally:
                model.train()
            return rec

        def after_eval(rec: dict[str, Any], end: int) -> int:
            if rec["epoch"] % (50 * cfg.eval_every) == 0:
                log(f"  epoch {rec['epoch']}: train {rec['train/acc']:.3f} test "
                    f"{rec['test/acc']:.3f} sens {rec['sens/train']:.4f}")
            if rec["test/acc"] >= GENERALISED and end == cfg.epochs:
                end = min(cfg.epochs, rec["epoch"] + cfg.post_epochs)
            return end

        return EpochLoop(
            model, opt, train_epoch=train_epoch, after_eval=after_eval,
            evaluate=evaluate,
            summary=lambda h: {"epochs": h[-1]["epoch"], "phases": grokking_phases(h)})

    return run_epochs(cfg, path, LABEL, build)
