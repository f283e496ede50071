"""The ``"attention"`` trainer: Φ(X) = vᵀ Xᵀ softmax(X W x₁) on ``maxmargin_attention`` data, with
the decoder v fixed or trained, and the attention-geometry metrics of Vasudeva, Deora &
Thrampoulidis (docs/definitions.md#self-attention-optimization).

One run (:class:`AttentionConfig`) is: a seeded ``maxmargin_attention`` training set
(:class:`AttentionData`) in float64 with its max-margin targets W_mm and v_mm
(docs/definitions.md#max-margin-attention, #max-margin-decoder); a model whose head is
``fixed`` (v = the data's unit decoder v*, a buffer; W₀ = N(0, init_scale²)) or ``joint`` (W and a
random unit v both trained); ``steps`` updates of one optimiser (``sgd``, ``ngd``: normalised
steps, docs/definitions.md#normalized-gradient-descent; ``polyak``: the full-batch Polyak step,
``sps``: SPS_max, docs/definitions.md#polyak-step; ``adam``), on the full batch or on minibatches
of ``batch_size`` (a seeded reshuffle every epoch, the ragged end dropped); and evaluations on the
whole training set at log-spaced steps (``per_decade`` per factor 10, :func:`log_schedule`),
each logged and checkpointed (docs/definitions.md#attention-metrics).

The loss: with a ``joint`` head the logistic loss log(1 + e^{−yΦ}); with a ``fixed`` head the
*excess* logistic loss L − L* (:func:`excess_loss`): with v fixed the logistic loss has the floor
L* = mean_i log(1 + e^{−γ_{i,opt}}) > 0, and the excess form has the same gradient while staying
free of cancellation, so the Polyak step can use f* = 0 on it (``train/excess`` is logged too).

Everything runs in float64: once the softmax saturates, the off-optimal attention weights are
~e^{−‖W‖·margin}, and in float32 their gradients are pure rounding noise long before NGD or the
Polyak step stop making progress.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...data import create_dataset
from ...models import create_model
from ...optim import (
    NGD,
    SPS,
    Polyak,
    alignment,
    attention_sparsity,
    max_margin_attention,
    max_margin_direction,
)
from ..config import one_of, ranged, seeded, set_option, validate
from ..looprun import LoopRun, check_dir, generator_states, set_generator_states
from ..trainers import register_trainer


@dataclass
class AttentionData:
    """The ``maxmargin_attention`` training split (docs/definitions.md#max-margin-attention-data):
    N sequences of T tokens of size d, optimal-token score γ_opt, the other tokens' scores within
    ±``other_score_frac``·γ_opt, an optional label signal on the query, and the data seed."""

    num_samples: int = ranged(32, ge=1)
    seq_len: int = ranged(8, ge=2)
    dim: int = ranged(32, ge=2)
    opt_score: float = ranged(1.0, gt=0)
    other_score_frac: float = ranged(0.5, ge=0, lt=1)
    query_signal: float = ranged(0.0, ge=0)
    seed: int = seeded()

    @classmethod
    def of(cls, options: dict[str, Any]) -> AttentionData:
        """The data described by ``options`` (field → value), each checked like an override."""
        data = cls()
        for key, value in options.items():
            set_option(data, key, value, parse=False)
        return data


@dataclass
class AttentionConfig:
    """One run of the ``"attention"`` trainer (module docstring).

    ``head``: ``fixed`` (v = the data's v*) or ``joint`` (W and v trained); ``init_scale``: std of
    W₀'s entries; ``seed``: the model's initialisation and, with minibatches, their order (seed
    + 31). ``optimizer``: ``sgd`` (lr), ``ngd`` (lr, cap ``eta_max``; SNGD on minibatches),
    ``polyak`` (c = 1, f* = 0, no cap), ``sps`` (c = ``sps_c``, f* = 0, cap ``eta_max``), ``adam``
    (lr). ``batch_size``: None for full-batch steps. Evaluations at ``log_schedule(steps,
    per_decade)``."""

    name: str = "attention"
    label: str = ""  # curve/bar this run belongs to in reports (default: the optimiser)
    data: AttentionData = field(default_factory=AttentionData)
    head: str = one_of("joint", "fixed")
    init_scale: float = ranged(0.01, ge=0)
    seed: int = seeded()
    optimizer: str = one_of("sgd", "ngd", "polyak", "sps", "adam")
    lr: float = ranged(0.1, gt=0)
    eta_max: float | None = ranged(None, gt=0)
    sps_c: float = ranged(0.5, gt=0)
    steps: int = ranged(1000, ge=1)
    batch_size: int | None = ranged(None, ge=1)
    per_decade: int = ranged(20, ge=1)


# -- the task ----------------------------------------------------------------------------------
@dataclass
class AttentionTask:
    """One ``maxmargin_attention`` training set in float64 with its max-margin targets.

    ``X`` (N, T, d) tokens, ``y`` (N,) ±1 labels, ``v_star`` the data's unit decoder, ``opt`` the
    optimal positions, ``gamma`` the token scores γ_it = y_i v*ᵀ x_it, ``W_mm`` the max-margin
    attention matrix and ``v_mm`` the max-margin decoder on the optimal tokens.
    """

    X: Tensor
    y: Tensor
    v_star: Tensor
    opt: Tensor
    gamma: Tensor
    W_mm: Tensor
    v_mm: Tensor

    @property
    def opt_scores(self) -> Tensor:
        """γ_{i,opt_i}, shape (N,)."""
        return self.gamma[torch.arange(len(self.X)), self.opt]

    def subset(self, idx: Tensor) -> AttentionTask:
        """The sequences ``idx`` (a minibatch; the max-margin targets stay the whole set's)."""
        return dataclasses.replace(self, X=self.X[idx], y=self.y[idx], opt=self.opt[idx],
                                   gamma=self.gamma[idx])


def load_task(**options: Any) -> AttentionTask:
    """The ``maxmargin_attention`` train split (``options`` go to the loader), in float64."""
    ds = create_dataset("maxmargin_attention", "train", **options)
    X = ds.inputs.double()
    y = ds.meta["y_pm"].double()
    opt = ds.meta["opt"].long()
    v_star = ds.meta["v"].double()
    gamma = y[:, None] * (X @ v_star)
    z = y[:, None] * X[torch.arange(len(X)), opt]  # y_i x_{i,opt}: the SVM features of v
    return AttentionTask(X, y, v_star, opt, gamma, max_margin_attention(X, opt),
                         max_margin_direction(z))


def log_schedule(steps: int, per_decade: int = 20) -> list[int]:
    """Evaluation steps 0, 1, 2, … spaced evenly on a log axis (``per_decade`` per factor 10),
    always including ``steps``: log-scale plots get evenly spread points at little cost."""
    points = {0, steps}
    k = 0
    while (s := round(10 ** (k / per_decade))) < steps:
        points.add(s)
        k += 1
    return sorted(points)


# -- losses and metrics ------------------------------------------------------------------------
def excess_loss(model: torch.nn.Module, task: AttentionTask) -> Tensor:
    """L(W) − L* = mean_i log1p(σ(−γ_{i,opt}) · expm1(δ_i)) with
    δ_i = Σ_{t≠opt} a_it (γ_{i,opt} − γ_it): the logistic loss above its floor with v fixed,
    computed without cancellation (δ_i is a sum of the tiny off-optimal weights, not a
    difference of two numbers ≈ γ_opt)."""
    a = model.attention_weights(task.X)
    g_opt = task.opt_scores
    delta = (a * (g_opt[:, None] - task.gamma)).sum(dim=1)
    return torch.log1p(torch.sigmoid(-g_opt) * torch.expm1(delta)).mean()


def logistic_loss(model: torch.nn.Module, task: AttentionTask) -> Tensor:
    """Mean logistic loss log(1 + e^{−y Φ(X)})."""
    return F.softplus(-task.y * model(task.X)).mean()


def logistic_metrics(model: torch.nn.Module, task: AttentionTask) -> dict[str, float]:
    """Mean logistic loss log(1 + e^{−y Φ(X)}) and accuracy over the whole training set."""
    with torch.no_grad():
        margin = task.y * model(task.X)
        return {"train/loss": float(F.softplus(-margin).mean()),
                "train/acc": float((margin > 0).double().mean())}


def attention_metrics(model: torch.nn.Module, task: AttentionTask) -> dict[str, float]:
    """‖W‖_F, alignment cos(W, W_mm), mean softmax weight on the optimal token, and (when v is
    learned) ‖v‖ and cos(v, v_mm)."""
    with torch.no_grad():
        weights = model.attention_weights(task.X)
        out = {
            "attn/W_norm": float(model.W.norm()),
            "attn/alignment": alignment(model.W, task.W_mm),
            "attn/sparsity": attention_sparsity(weights, task.opt),
        }
        if isinstance(model.v, torch.nn.Parameter):
            out["attn/v_norm"] = float(model.v.norm())
            out["attn/v_alignment"] = alignment(model.v, task.v_mm)
    return out


# -- the run -----------------------------------------------------------------------------------
#: optimisers whose step size needs the loss (``step(closure)``)
CLOSURE = ("polyak", "sps")


def make_optimizer(cfg: AttentionConfig, params: list[torch.nn.Parameter]
                   ) -> torch.optim.Optimizer:
    """``cfg.optimizer`` on ``params`` with its step-size settings."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    if cfg.optimizer == "ngd":
        return NGD(params, lr=cfg.lr, eta_max=cfg.eta_max)
    if cfg.optimizer == "polyak":
        return Polyak(params, f_star=0.0)
    if cfg.optimizer == "sps":
        return SPS(params, c=cfg.sps_c, f_star=0.0, eta_max=cfg.eta_max)
    return torch.optim.Adam(params, lr=cfg.lr)


def build_model(cfg: AttentionConfig, task: AttentionTask) -> torch.nn.Module:
    """The float64 attention model of ``cfg``'s head: a fixed head holds the data's v*."""
    fixed = cfg.head == "fixed"
    model = create_model("attention_model", dim=task.X.shape[-1], train_v=not fixed,
                         init_scale=cfg.init_scale, seed=cfg.seed).double()
    if fixed:
        with torch.no_grad():
            model.v.copy_(task.v_star)  # the data's decoder: its optimal tokens define W_mm
    return model


def evaluate(cfg: AttentionConfig, model: torch.nn.Module, task: AttentionTask,
             step: int) -> dict[str, Any]:
    """The record of ``step``: losses, accuracy and attention geometry on the whole set."""
    # passes over the data, as fit counts them: an epoch is n // batch_size steps (the ragged
    # end is dropped), not n / batch_size
    per_epoch = len(task.X) // cfg.batch_size if cfg.batch_size is not None else 1
    rec: dict[str, Any] = {"step": step, "epoch": step / per_epoch}
    if cfg.head == "fixed":
        with torch.no_grad():
            rec["train/excess"] = float(excess_loss(model, task))
    rec.update(logistic_metrics(model, task))
    rec.update(attention_metrics(model, task))
    return rec


def check_config(cfg: AttentionConfig) -> None:
    """The combinations of fields :func:`~senslab.train.config.validate` cannot see: minibatches
    larger than the training set (each step would take the whole set, full batch, while the
    configuration and the records' ``epoch`` say minibatches)."""
    n = cfg.data.num_samples
    if cfg.batch_size is not None and cfg.batch_size > n:
        raise ValueError(
            f"batch_size={cfg.batch_size} is larger than the training set "
            f"(data.num_samples={n}): every step would take all {n} sequences; use "
            f"batch_size=None for full-batch steps, a batch_size of at most {n}, or more "
            "data.num_samples")


def example() -> AttentionConfig:
    """A few seconds on one thread: joint head, SPS on minibatches of 4 (closure, generator and
    leftover permutation all cross the checkpoints)."""
    return AttentionConfig(name="example", data=AttentionData(num_samples=8, seq_len=4, dim=8),
                           optimizer="sps", eta_max=1.0, batch_size=3, steps=2000,
                           per_decade=10)


@register_trainer("attention", AttentionConfig, check=check_config, example=example,
                  check_dir=check_dir,
                  # the summary's ``cfg.label or cfg.optimizer`` (below), from config.json
                  label=lambda config: config.get("optimizer"))
def train_attention(cfg: AttentionConfig, path: Path, *, progress: bool | None = None,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train ``cfg`` into run directory ``path`` (module docstring); returns the summary:
    label, name, ``final`` (the last record) and ``steps``."""
    del progress, log  # a run of seconds to minutes: no progress bar
    validate(cfg)
    check_config(cfg)
    with LoopRun(path, cfg) as run:
        if run.summary is not None:
            return run.summary
        state = run.restore()
        task = load_task(**dataclasses.asdict(cfg.data))
        model = build_model(cfg, task)
        opt = make_optimizer(cfg, list(model.parameters()))
        loss_fn = excess_loss if cfg.head == "fixed" else logistic_loss
        gen = torch.Generator().manual_seed(cfg.seed + 31)
        n = len(task.X)
        order = torch.empty(0, dtype=torch.long)
        start, last = 0, None
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            set_generator_states(state["generators"], order=gen)
            order, start, last = state["order"], int(state["step"]), state["last"]
        schedule = set(log_schedule(cfg.steps, cfg.per_decade))
        for step in range(start, cfg.steps + 1):
            if step in schedule and (state is None or step > start):
                last = run.log(evaluate(cfg, model, task, step))
                run.checkpoint(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                                      "generators": generator_states(order=gen),
                                      "order": order, "last": last})
            if step == cfg.steps:
                break
            batch = task
            if cfg.batch_size is not None:
                if len(order) < cfg.batch_size:  # a fresh permutation each epoch
                    order = torch.randperm(n, generator=gen)
                idx, order = order[: cfg.batch_size], order[cfg.batch_size:]
                batch = task.subset(idx)

            def closure(batch: AttentionTask = batch) -> Tensor:
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model, batch)
                loss.backward()
                return loss

            if cfg.optimizer in CLOSURE:
                opt.step(closure)
            else:
                closure()
                opt.step()
            run.at(step + 1)
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise FloatingPointError(f"{cfg.name}: {cfg.optimizer}'s parameters became "
                                         f"non-finite at step {step + 1}; lower its step size")
        return run.finish({"label": cfg.label or cfg.optimizer, "name": cfg.name, "final": last,
                           "steps": cfg.steps})
