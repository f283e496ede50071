"""The epoch loop shared by the low-sensitivity trainers (``sparse_frequent``, ``grokking``,
``sparse_parity``): each builds its data, model and optimiser, says how one epoch trains and what
one evaluation measures (an :class:`EpochLoop`), and :func:`run_epochs` does the rest — the run
directory (:class:`~senslab.train.looprun.LoopRun`), an evaluation at epoch 0, every
``eval_every`` epochs and at the last epoch, a checkpoint after each, the resume, the summary.

A run's evaluation records (one ``metrics.jsonl`` line each, ``step`` = optimiser steps so far,
``epoch``) are what the summary is computed from; a resumed run reads the records up to its
checkpoint back from ``metrics.jsonl`` (JSON keeps every float bit for bit), so a checkpoint
stays small however long the run: model, optimiser, generators and counters. A NaN or infinite
training loss (:func:`sgd_step`) stops the run at once with a :class:`FloatingPointError` naming
the epoch and the learning rate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..looprun import LoopRun, generator_states, set_generator_states
from ..rundir import nan_for_null

C = TypeVar("C")
Record = dict[str, Any]


def config_from(config_type: type[C], source: Any, **given: Any) -> C:
    """A ``config_type`` whose fields that ``source`` (a dataclass: an experiment's settings)
    also has take ``source``'s values; ``given`` sets the others (and wins)."""
    names = {f.name for f in dataclasses.fields(config_type)}  # type: ignore[arg-type]
    shared = {f.name: getattr(source, f.name) for f in dataclasses.fields(source)
              if f.name in names}
    return config_type(**{**shared, **given})


def sgd_step(opt: torch.optim.Optimizer, loss: Tensor) -> None:
    """One optimiser step on ``loss``; a NaN or infinite loss is refused before the step
    (:class:`FloatingPointError`, naming the learning rate), as :func:`senslab.train.loop.fit`
    refuses it: a step on it would turn the weights NaN, and the run would train on until its
    next evaluation and fail there inside a measurement, with a message about the model's
    outputs instead of the diverged training."""
    value = loss.item()
    if not math.isfinite(value):
        lr = opt.param_groups[0]["lr"]
        raise FloatingPointError(f"training loss became {value}; lower lr (now {lr}) or check "
                                 "the data")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def minibatch_epoch(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor,
                    loss_fn: Callable[[Tensor, Tensor], Tensor], batch_size: int,
                    gen: torch.Generator) -> int:
    """One epoch over ``(x, y)`` in minibatches of a fresh permutation drawn from ``gen``;
    returns the number of steps taken."""
    steps = 0
    for idx in torch.randperm(len(x), generator=gen).split(batch_size):
        sgd_step(opt, loss_fn(model(x[idx]), y[idx]))
        steps += 1
    return steps


def classification_record(model: nn.Module, train: Any, test: Any,
                          measure: Callable[[], Record]) -> Record:
    """Train/test cross-entropy and accuracy of the classifier ``model`` on the datasets
    ``train`` and ``test`` (``inputs``, ``targets``), and ``measure()``'s values, all in eval
    mode (the model goes back to train mode after)."""
    model.eval()
    with torch.no_grad():
        out_tr, out_te = model(train.inputs), model(test.inputs)
    extra = measure()
    model.train()
    y, y_te = train.targets, test.targets
    return {"train/loss": F.cross_entropy(out_tr, y).item(),
            "train/acc": (out_tr.argmax(1) == y).float().mean().item(),
            "test/loss": F.cross_entropy(out_te, y_te).item(),
            "test/acc": (out_te.argmax(1) == y_te).float().mean().item(), **extra}


@dataclass
class EpochLoop:
    """What one trainer's loop does.

    ``train_epoch()`` trains one epoch and returns its optimiser steps; ``evaluate()`` returns
    one evaluation's metrics; ``summary(history)`` the summary's entries besides ``label``,
    ``name`` and ``final`` (the last record's metrics, with ``final_extra`` added);
    ``after_eval(record, end)`` may move the last epoch ``end`` earlier (early stopping), and
    ``generators`` are the loop's own random streams (saved in every checkpoint)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_epoch: Callable[[], int]
    evaluate: Callable[[], Record]
    summary: Callable[[list[Record]], Record]
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    after_eval: Callable[[Record, int], int] | None = None
    final_extra: Record = field(default_factory=dict)


def run_epochs(cfg: Any, path: str | Path, label: str, build: Callable[[], EpochLoop]
               ) -> dict[str, Any]:
    """Train the run configured by ``cfg`` (a dataclass with ``name``, ``epochs`` and
    ``eval_every``) into ``path`` with the loop ``build()`` returns (built only when there is
    training to do); returns the summary: ``label``, ``name``, ``final`` and the loop's own."""
    with LoopRun(path, cfg) as run:
        if run.summary is not None:
            return run.summary
        loop = build()
        history = _train(run, loop, cfg.epochs, cfg.eval_every)
        final = {k: v for k, v in history[-1].items() if k not in ("step", "epoch")}
        return run.finish({"label": label, "name": cfg.name, "final": {**final, **loop.final_extra},
                           **loop.summary(history)})


def _train(run: LoopRun, loop: EpochLoop, epochs: int, eval_every: int) -> list[Record]:
    """The evaluation records of the whole run, training from its newest checkpoint (or from
    the start, evaluating the untrained model first)."""
    state = run.restore()
    if state is None:
        epoch, steps, end = 0, 0, epochs
        history = [{"step": 0, "epoch": 0, **loop.evaluate()}]
        run.log(history[-1])
    else:
        loop.model.load_state_dict(state["model"])
        loop.optimizer.load_state_dict(state["optimizer"])
        set_generator_states(state["generators"], **loop.generators)
        epoch, steps, end = state["epoch"], state["steps"], state["end"]
        # a NaN logged is null in metrics.jsonl: back as the NaN the uninterrupted run holds
        history = [{k: v for k, v in r.items() if k != "time"}
                   for r in nan_for_null(run.dir.metrics())]
    loop.model.train()
    while epoch < end:
        epoch += 1
        run.at(steps, epoch=epoch)  # a Ctrl-C in the epoch: "in epoch E, after step N"
        try:
            steps += loop.train_epoch()
        except FloatingPointError as err:  # a diverged step (sgd_step): say where
            raise FloatingPointError(
                f"{err} (in epoch {epoch}, which began after step {steps})") from None
        if epoch % eval_every == 0 or epoch == end:
            history.append({"step": steps, "epoch": epoch, **loop.evaluate()})
            run.log(history[-1])
            if loop.after_eval is not None:
                end = loop.after_eval(history[-1], end)
            run.checkpoint(steps, {
                "model": loop.model.state_dict(), "optimizer": loop.optimizer.state_dict(),
                "generators": generator_states(**loop.generators), "epoch": epoch,
                "steps": steps, "end": end})
    return history
