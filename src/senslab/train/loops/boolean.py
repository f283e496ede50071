r"""Trainer ``"boolean"``: a Boolean transformer on PARITY, MAJORITY, FIRST, MEAN or a random
table (Hahn & Rofin; docs/definitions.md#hahn-and-rofin-setup).

One run (:class:`BooleanRunConfig`) trains senslab's ``boolean_transformer`` (post-LN, bit ⊕
position embedding, scalar read-out at the last position) with AdamW on the MSE to {0, 1}
targets, on data made in one of two ways:

* fresh sampling (``train_size=None``): ``batch`` new uniform strings per step; evaluation on
  ``eval_size`` fixed held-out strings;
* subset training (``train_size=k``): full batch on data from the ``boolean`` dataset's "subset"
  split (k strings of the cube, table seed ``function_seed``). ``completion="learned"``: the k
  strings only, ``test/acc`` on the other 2ⁿ − k (the model completes the function itself);
  ``completion="random"``: all 2ⁿ strings labelled by :func:`random_completion` (the k labels,
  the rest uniformly random), no ``test/acc``. Sharpness and blow-up are measured on the k
  strings in both cases.

At each evaluation (every ``eval_every`` steps and at the last) it logs

* ``epoch`` beside ``step``: passes over the training set in subset training (a step of
  ``subset_batch`` strings drawn from k is subset_batch / k passes), ``step`` in fresh
  sampling,
* ``train/loss`` (mean training MSE since the last evaluation; subset training: the MSE on the
  training set and ``train/acc``), ``test/loss``, ``test/acc`` (fresh sampling),
* ``sharpness/loss`` (± ``sharpness/loss_se``): :math:`4\,(\mathbb E_\Delta L(\theta+\Delta) -
  L(\theta))`, :math:`\Delta \sim \mathcal N(0, 0.02^2)` on every weight but the positional
  embeddings, ×4 for the ±1 scale (:func:`senslab.measure.sharpness.loss_sharpness`),
* ``blowup`` (mean over the evaluation strings of the per-string LayerNorm blow-up) and
  ``blowup/log10`` (mean of its log10, robust to one exploding string),
* ``param_norm``: :math:`\lVert\theta\rVert_2` without positional embeddings,
* ``bool_sens``: the average sensitivity as(f̂) of the *learned* Boolean function
  f̂(x) = 1[model(x) > 1/2] (exact up to n = 12, else 2,000 sampled strings); for MEAN the
  "real" rule on the ±1 scale, (2Δ)²/4 summed over bits.

Accuracy: a prediction is right when it lands on the correct side of 1/2 (MEAN: when it rounds to
the correct fraction, |ŷ − y| < 1/(2n)). A run *converged* when its final ``test/acc`` (subset
training: ``train/acc``) is > 0.99; ``converged_loss`` adds a bound on the matching loss.
``stop_below`` ends training at the first evaluation whose training loss is below it. The
summary holds ``first_below_001``, the first step whose training batch loss was < 0.01 (None if
never). A checkpoint is written at every evaluation. A NaN or infinite training loss stops the
run at once with a :class:`FloatingPointError` naming the step and the learning rate.

**The decision rule travels with the run.** The model regresses onto {0, 1}, so its class is
output > 1/2, but ``boolean_transformer`` declares ``output_kind = "logits"`` (class = sign): a
model rebuilt from a checkpoint (``create_model("boolean_transformer", ...)`` and
``load_state_dict(state["model"])``) and measured without a rule counts class changes at 0 — on
a trained MAJORITY of 5 bits as(f̂) read 1.44 instead of the run's 1.875, ShPred 0.17 instead of
0.06. Every checkpoint and the summary therefore hold ``decision`` (:func:`decision`):
``{"output_kind": "scores", "threshold": 0.5}`` — pass ``threshold=0.5`` to
``boolean_sensitivity`` and ``output_kind="scores", threshold=0.5`` to ``output_sharpness`` and
``token_sensitivity`` — or, for MEAN, ``{"output": "real", "transform": "2 * out - 1"}`` (the
"real" rule on the ±1 scale, as ``bool_sens``). ``senslab measure --checkpoint`` does not
rebuild this trainer's runs (it refuses them, naming the trainer).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..._seeds import noise_seed
from ..._stack import said_once
from ...data import create_dataset
from ...data.synthetic import BOOLEAN_FUNCTIONS, boolean_cube
from ...measure import boolean_sensitivity
from ...measure.sharpness import layernorm_blowup, loss_sharpness, parameter_norm
from ...models import create_model
from ..config import matching, one_of, ranged, seeded
from ..loop import resolve_device
from ..looprun import LoopRun, check_dir, generator_states, set_generator_states
from ..trainers import register_trainer

SIGMA = 0.02  # weight-noise std of the sharpness (docs/definitions.md#loss-sharpness)
SHARPNESS_SCALE = 4.0  # MSE on {0, 1} targets → the ±1 scale
CONVERGED_ACC = 0.99
FUNCTIONS = (*BOOLEAN_FUNCTIONS, "random")


@dataclass
class BooleanSetup:
    """Training and measurement settings (defaults: the paper's); the experiments' settings
    derive from it.

    ``batch``: fresh strings per step; ``eval_size``: fixed held-out strings for loss, accuracy,
    sharpness and blow-up; ``sharp_draws``: weight draws per sharpness estimate;
    ``device``: "auto" picks CUDA when available.

    Three fields whose defaults are senslab's own, for the authors' code at paper scale:
    ``init``: the model's initialisation (:class:`~senslab.models.small.BooleanConfig`);
    ``converged_loss``: when set, a run also needs a final loss (held-out, or training loss in
    subset training) below it to count as converged (the authors' figures keep runs with
    evaluation loss < 0.001); ``subset_batch``: subset training on ``subset_batch`` strings
    drawn with replacement from the training set each step instead of the full batch.
    """

    dim: int = ranged(128, ge=1)
    layers: int = ranged(2, ge=1)
    heads: int = ranged(2, ge=1)
    steps: int = ranged(10_000, ge=1)
    batch: int = ranged(1024, ge=1)
    lr: float = ranged(3e-4, gt=0)
    weight_decay: float = ranged(0.1, ge=0)
    eval_every: int = ranged(500, ge=1)
    eval_size: int = ranged(1024, ge=1)
    sharp_draws: int = ranged(20, ge=1)
    init: str = one_of("independent", "torch_encoder")
    converged_loss: float | None = ranged(None, gt=0)
    subset_batch: int | None = ranged(None, ge=1)
    device: str = matching("auto", r"auto|cpu|mps|cuda(:\d+)?", "auto, cpu, cuda, cuda:N or mps")


@dataclass
class BooleanRunConfig(BooleanSetup):
    """One run of the ``boolean`` trainer (see the module docstring).

    ``name``: the run's name (its directory's, in an experiment); ``label``: the curve this run
    belongs to in reports; ``function``/``n``: the target on
    {±1}ⁿ ("random": a random table, subset training only); ``seed``: model initialisation, the
    training strings and the measurements; ``stop_below``: early stop on the training loss;
    ``train_size``: None for fresh strings every step, else k strings of the cube, full batch;
    ``function_seed``: the ``boolean`` dataset's seed of the subset (and of a random table);
    ``completion``: what subset training fits (``learned``: the k strings; ``random``: all 2ⁿ
    strings, the k labels completed at random)."""

    name: str = "run"
    label: str = ""
    function: str = one_of("parity", *FUNCTIONS[1:])
    n: int = ranged(8, ge=1)
    seed: int = seeded()
    stop_below: float | None = ranged(None, ge=0)
    train_size: int | None = ranged(None, ge=1)
    function_seed: int = seeded()
    completion: str = one_of("learned", "random")


def check_config(cfg: BooleanRunConfig) -> None:
    """The combinations of fields :func:`~senslab.train.config.validate` cannot see."""
    if cfg.train_size is None:
        if cfg.function == "random":
            raise ValueError("function=random is a table on the cube: give train_size (subset "
                             "training)")
        if cfg.completion != "learned":
            # fresh sampling has no unseen strings to complete: the run would train the learned
            # completion while its config says otherwise
            raise ValueError(f"completion={cfg.completion} completes a training subset of the "
                             "cube: give train_size (subset training), or leave completion="
                             "learned for fresh strings every step")
    elif not cfg.train_size < 2**cfg.n:
        raise ValueError(
            f"train_size={cfg.train_size} leaves no held-out strings: the cube of n={cfg.n} has "
            f"2^n = {2**cfg.n}; give a train_size below {2**cfg.n} (an experiment's "
            "train_sizes, e.g. --set train_sizes=8,12) or a larger n")
    resolve_device(cfg.device)


def fresh_strings(function: str, n: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``size`` uniform ±1 strings of length n from ``gen`` and their {0, 1} (MEAN: [0, 1])
    targets."""
    x = torch.randint(0, 2, (size, n), generator=gen).float() * 2 - 1
    return x, BOOLEAN_FUNCTIONS[function](x)


def accuracy(out: Tensor, y: Tensor, function: str, n: int) -> float:
    if function == "mean":
        return ((out - y).abs() < 0.5 / n).float().mean().item()
    return ((out > 0.5) == (y > 0.5)).float().mean().item()


def decision(function: str) -> dict[str, Any]:
    """How the run reads its model's output, saved with every checkpoint and in the summary
    (see the module docstring): class = output > 1/2 (``output_kind="scores"``,
    ``threshold=0.5``), or for MEAN the "real" rule on the ±1 scale, 2·output − 1."""
    if function == "mean":
        return {"output": "real", "transform": "2 * out - 1"}
    return {"output_kind": "scores", "threshold": 0.5}


def learned_sensitivity(model: nn.Module, n: int, function: str, gen: torch.Generator) -> float:
    """as(f̂) of the function the model computes (see the module docstring), in eval mode."""
    method = "exact" if n <= 12 else "sample"
    was = model.training
    model.eval()
    try:
        if function == "mean":
            device = next(model.parameters()).device

            def pm(x: Tensor) -> Tensor:  # the model's output on the ±1 scale
                return 2 * model(x.to(device)) - 1

            return boolean_sensitivity(pm, n, method=method, output="real",
                                       generator=gen).average
        return boolean_sensitivity(
            model, n, method=method, output="sign", threshold=0.5, generator=gen
        ).average
    finally:
        model.train(was)


def measure(model: nn.Module, x: Tensor, y: Tensor, function: str, n: int, draws: int,
            gen: torch.Generator) -> dict[str, float]:
    """Loss, accuracy, sharpness (×4), blow-up, parameter norm and as(f̂) on the batch (x, y)."""
    was = model.training
    model.eval()  # no dropout in this model, but the measures must not depend on that
    try:
        with torch.no_grad():
            out = model(x)
        if not bool(torch.isfinite(out).all()):
            # a finite training loss whose step made the outputs NaN: the sharpness failed with
            # "the loss of the clean model is NaN ... check the model, loss_fn, inputs and
            # targets", a loss_fn the user never gave, not saying that the training diverged
            raise FloatingPointError("the model's outputs on the evaluation strings became NaN "
                                     "or infinite: the training diverged")
        sharp = loss_sharpness(model, F.mse_loss, x, y, sigma=SIGMA, draws=draws,
                               exclude=("pos",), generator=gen, scale=SHARPNESS_SCALE)
        blow = layernorm_blowup(model, x)
        sens = learned_sensitivity(model, n, function, gen)
    finally:
        model.train(was)
    return {
        "loss": F.mse_loss(out, y).item(),
        "acc": accuracy(out, y, function, n),
        "sharpness/loss": sharp.estimate,
        "sharpness/loss_se": sharp.stderr,
        "blowup": blow.mean().item(),
        "blowup/log10": blow.log10().mean().item(),
        "param_norm": parameter_norm(model),
        "bool_sens": sens,
    }


def random_completion(table: Tensor, train_index: Tensor, seed: int) -> Tensor:
    """The {0, 1} table that agrees with ``table`` on ``train_index`` and is uniformly random
    elsewhere (its own generator, so it differs from the hidden function and the subset).

    A CPU generator keeps a seed's low 32 bits, and 7,919·seed + 1 equals the boolean data
    set's subset stream, 1,000,003·seed + 1, modulo 2**32 exactly where seed ≡ 0 (mod 2**30):
    at seeds 0, 2**30, 2**31 and 3·2**30 the "random" labels at even positions were the
    parities of the subset permutation's swaps (until 2026-12-07). Those four seeds move by
    2**31, onto a stream no other stream of theirs uses; every other seed draws as before."""
    g = torch.Generator().manual_seed(7_919 * seed + 1 + (2**31 if seed % 2**30 == 0 else 0))
    out = torch.randint(0, 2, table.shape, generator=g).to(table.dtype)
    out[train_index] = table[train_index]
    return out


Pair = tuple[Tensor, Tensor]


@dataclass
class SubsetData:
    """Subset training's data: the training set, the sharpness set (the k strings), the
    held-out set (None for a random completion) and the random completion of the table."""

    train: Pair
    sharp: Pair
    test: Pair | None
    completed: Tensor


def subset_data(cfg: BooleanRunConfig) -> SubsetData:
    """The data of a subset-training run (``train_size`` set), from the ``boolean`` dataset."""
    opts = {"function": cfg.function, "n_bits": cfg.n, "sampling": "subset",
            "train_size": cfg.train_size, "seed": cfg.function_seed}
    train = create_dataset("boolean", "train", **opts)
    test = create_dataset("boolean", "test", **opts)
    completed = random_completion(train.meta["table"], train.meta["index"], cfg.function_seed)
    k_strings = (train.inputs, train.targets)
    if cfg.completion == "learned":
        return SubsetData(k_strings, k_strings, (test.inputs, test.targets), completed)
    return SubsetData((boolean_cube(cfg.n), completed), k_strings, None, completed)


def example() -> BooleanRunConfig:
    """PARITY on 5 bits, a tiny model, 8 evaluations (a few seconds on one thread)."""
    return BooleanRunConfig(label="parity", function="parity", n=5, dim=8, steps=160,
                            batch=32, lr=3e-3, eval_every=20, eval_size=32, sharp_draws=2,
                            device="cpu")


@register_trainer("boolean", BooleanRunConfig, check=check_config, example=example,
                  check_dir=check_dir)
def train_boolean(cfg: BooleanRunConfig, path: Path, *, progress: bool | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train one run (see the module docstring) into ``path`` and return its summary."""
    del progress, log  # one line per evaluation in metrics.jsonl is the progress here
    check_config(cfg)
    config = dataclasses.asdict(cfg)
    device = resolve_device(cfg.device)
    function, n, seed = cfg.function, cfg.n, cfg.seed
    with LoopRun(path, cfg, device) as run:
        if run.summary is not None:
            return run.summary
        state = run.restore()
        model = create_model("boolean_transformer", n_bits=n, dim=cfg.dim, ff_dim=cfg.dim,
                             layers=cfg.layers, heads=cfg.heads, init=cfg.init,
                             seed=seed).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        data_gen = torch.Generator().manual_seed(1_000_003 * seed + 17)
        # a stream apart from the model's weights: from ``seed`` itself, the first sharpness
        # draw on bit_embed was its initial values (cosine 1.0)
        measure_gen = torch.Generator().manual_seed(noise_seed(seed))
        subset = subset_data(cfg) if cfg.train_size is not None else None
        if subset is None:
            eval_x, eval_y = fresh_strings(function, n, cfg.eval_size,
                                           torch.Generator().manual_seed(10_007 * seed + 5))
        else:
            eval_x, eval_y = subset.sharp
        eval_x, eval_y = eval_x.to(device), eval_y.to(device)

        first_below: int | None = None
        record: dict[str, Any] = {}
        start, done = 1, False
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            set_generator_states(state["generators"], data=data_gen, measure=measure_gen)
            first_below, record = state["first_below"], state["record"]
            start, done = state["step"] + 1, state["done"]
        losses: list[float] = []
        said: set[str] = set()
        # ``epoch``: passes over the training set (as ``fit`` counts them); fresh sampling has
        # no training set: its steps. A step of ``subset_batch`` strings drawn from k is
        # subset_batch / k passes (it was logged as one: 8 passes a step at the paper's k = 128)
        per_step = (1.0 if subset is None or cfg.subset_batch is None
                    else cfg.subset_batch / len(subset.train[0]))
        for step in range(start, cfg.steps + 1):
            if done:
                break
            if subset is None:
                x, y = fresh_strings(function, n, cfg.batch, data_gen)
            elif cfg.subset_batch is None:
                x, y = subset.train
            else:  # the authors' sampler: indices with replacement
                pick = torch.randint(len(subset.train[0]), (cfg.subset_batch,), generator=data_gen)
                x, y = subset.train[0][pick], subset.train[1][pick]
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                # a step on it would turn the weights NaN, and the next evaluation would fail
                # inside the sharpness, blaming a "loss_fn" the user never gave
                raise FloatingPointError(
                    f"training loss became {losses[-1]} at step {step}; lower lr (now {cfg.lr})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            run.at(step)
            if first_below is None and losses[-1] < 0.01:
                first_below = step
            if step % cfg.eval_every and step != cfg.steps:
                continue
            try:
                with said_once(said):  # a measurement's warning: once per run, not per evaluation
                    record = evaluate(model, cfg, eval_x, eval_y, subset, losses, measure_gen,
                                      device)
            except FloatingPointError as err:
                raise FloatingPointError(f"{err} (at the evaluation after step {step}); lower lr "
                                         f"(now {cfg.lr})") from None
            record = run.log({"step": step, "epoch": step * per_step, **record})
            losses = []
            done = cfg.stop_below is not None and record["train/loss"] < cfg.stop_below
            run.checkpoint(step, {
                "model": model.state_dict(), "optimizer": opt.state_dict(),
                "generators": generator_states(data=data_gen, measure=measure_gen),
                "first_below": first_below, "record": record, "done": done,
                "decision": decision(function)})  # not a stock boolean_transformer's rule
        return run.finish({
            "label": cfg.label, "name": cfg.name, "final": record, "function": function,
            "n": n, "seed": seed, "converged": converged(record, cfg),
            "first_below_001": first_below, "config": config, "decision": decision(function),
        })


def converged(record: dict[str, Any], cfg: BooleanRunConfig) -> bool:
    """Final accuracy > 0.99 (held-out; subset training: training) and, with
    ``converged_loss``, the matching loss below it."""
    kind = "test" if cfg.train_size is None else "train"
    ok = record[f"{kind}/acc"] > CONVERGED_ACC
    if cfg.converged_loss is not None:
        ok = ok and record[f"{kind}/loss"] < cfg.converged_loss
    return bool(ok)


def evaluate(model: nn.Module, cfg: BooleanRunConfig, eval_x: Tensor, eval_y: Tensor,
             subset: SubsetData | None, losses: list[float], gen: torch.Generator,
             device: torch.device) -> dict[str, Any]:
    """One evaluation's metrics (see the module docstring) after the steps whose training losses
    are ``losses``."""
    function, n = cfg.function, cfg.n
    m = measure(model, eval_x, eval_y, function, n, cfg.sharp_draws, gen)
    record: dict[str, Any] = {"train/loss": sum(losses) / len(losses)}
    if subset is None:
        record.update({"test/loss": m.pop("loss"), "test/acc": m.pop("acc")})
    else:
        del m["loss"], m["acc"]  # on the sharpness set; the fit is judged on the train set
        with torch.no_grad():
            out = model(subset.train[0].to(device))
        y_train = subset.train[1].to(device)
        record.update({"train/loss": F.mse_loss(out, y_train).item(),
                       "train/acc": accuracy(out, y_train, function, n)})
        if subset.test is not None:
            with torch.no_grad():
                out = model(subset.test[0].to(device))  # no dropout: train mode is deterministic
            record["test/acc"] = accuracy(out, subset.test[1].to(device), function, n)
    record.update(m)
    return record
