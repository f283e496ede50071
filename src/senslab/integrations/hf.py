"""Track sensitivity inside a Hugging Face ``Trainer`` (``pip install 'senslab[hf]'``).

:class:`SensitivityCallback` measures a fixed subset at every evaluation and logs the estimate
and its standard error through the Trainer's own ``log``: ``trainer.state.log_history`` and every
reporter of ``report_to`` (TensorBoard, W&B, …) receive ``eval_sensitivity`` and
``eval_sensitivity_stderr`` (``eval/sensitivity`` in TensorBoard), and the dict ``evaluate()``
returns holds them too (so ``metric_for_best_model="eval_sensitivity"`` works, with
``greater_is_better=False`` to keep the least sensitive checkpoint: a warning says so). Each
measurement starts the noise from the same seed, so the logged value equals
``token_sensitivity(model, subset, tokens, generator=seed, ...)`` on the model of that step.

A ``TrainerCallback`` is not handed the Trainer, and the Trainer logs its evaluation metrics
*before* it calls ``on_evaluate``; :meth:`SensitivityCallback.attach` therefore adds the callback
and keeps the Trainer to log through::

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val)
    SensitivityCallback(subset, Embedding("bert.embeddings.LayerNorm"), sigma=0.1).attach(trainer)

Passed as ``Trainer(callbacks=[callback])`` instead, the values still reach ``log_history`` and
``evaluate()``'s dict, but not the reporters (a warning says so), and only the callbacks listed
after it see them (``attach`` puts it first: an ``EarlyStoppingCallback`` on
``eval_sensitivity`` reads the metrics in its own ``on_evaluate``).

The callback's ``results`` (and the warnings it has said) go into the Trainer's checkpoints
(``trainer_state.json``, under ``state.stateful_callbacks`` with a key holding ``name``), so
``trainer.train(resume_from_checkpoint=...)`` continues them — with the configuration
(subset, options, seed) saved beside them: a callback built otherwise starts its results anew,
with a warning, rather than continue another quantity's series. A new run that does not resume
(``train()`` again, a trial of ``hyperparameter_search``) sets the earlier run's results aside
(``callback.set_aside``, with a warning): ``results`` is one run's series. Two callbacks of one
Trainer must have different names, and ``compute_metrics`` must not return ``name``: two values
under one key leave ``evaluate()``'s dict (and so ``metric_for_best_model``) with only the last.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "senslab.integrations.hf needs transformers: pip install 'senslab[hf]'"
    ) from err

from ..measure import SensitivityResult
from ..tokens import Tokenization
from ..tokens.base import Inputs
from ._common import (
    Seed,
    check_before_training,
    check_every,
    check_options,
    check_subset,
    configuration,
    keep_aside,
    measure_subset,
    refuse_mixed_series,
    set_aside_earlier_run,
)

__all__ = ["SensitivityCallback"]

#: keys of a collated batch that are targets, not model inputs (sensitivity compares outputs);
#: the Trainer's ``label_names`` are dropped too (:meth:`SensitivityCallback._drop_labels`)
_TARGETS = ("labels", "label", "label_ids")


class SensitivityCallback(TrainerCallback):
    """Measure token sensitivity of a fixed subset at every evaluation and log it.

    Args:
        inputs: the subset — a dict of tensors as the model takes them (a tokenizer's
            ``BatchEncoding`` works; ``labels``, ``label``, ``label_ids`` and the Trainer's
            ``label_names`` are dropped: with them the model computes a loss on every perturbed
            copy), or a tensor/tuple; moved to the model's device when measured.
        tokens: a :class:`~senslab.tokens.Tokenization`, e.g.
            ``Embedding("bert.embeddings.LayerNorm")``; default (None): the model's
            :func:`~senslab.tokens.auto_tokens` (``default_tokens()`` for senslab's zoo).
        mask: (B, T) bool, true on real tokens; default: the inputs' ``attention_mask``.
        name: logged as ``f"{prefix}_{name}"`` and ``f"{prefix}_{name}_stderr"``, ``prefix``
            the evaluation's metric prefix (``eval``).
        batch_size: examples per measuring batch (default: the whole subset in one batch).
        generator: the int seed (default 0) or ``torch.Generator`` every measurement starts from.
        **options: :class:`~senslab.measure.TokenSensitivity`'s options (``sigma``, …).

    Before training (:meth:`on_train_begin`) one forward of the subset's first examples checks
    what the first measurement would refuse — which output is the prediction (``output=``),
    its shape and kind, the tokens — so that a refusal costs no training
    (:func:`~senslab.integrations._common.check_before_training`).

    ``results`` holds ``(global_step, SensitivityResult)`` for every measurement of the current
    run; the checkpoints hold it, and resuming from one replaces it (what it held is kept in
    ``set_aside``, with a warning: a list of series, one ``[(global_step, result), ...]`` per
    series set aside, in order). A new run (``train()`` again without resuming, each trial of
    ``hyperparameter_search``) sets the earlier run's results aside too, with a warning. A Trainer
    with several evaluation sets (``eval_dataset`` a dict) evaluates each under its own prefix
    (``eval_a``, ``eval_b``); the callback measures its subset once for them all and logs that
    one value under each prefix, with a warning that it is not a sensitivity of each set.
    """

    def __init__(
        self, inputs: Inputs | Mapping[str, Any], tokens: Tokenization | None = None, *,
        mask: Tensor | None = None, name: str = "sensitivity", batch_size: int | None = None,
        generator: torch.Generator | int | None = 0, **options: Any,
    ) -> None:
        check_options(tokens, options, type(self).__name__)
        #: the label columns dropped from the subset (named where the model needs one)
        self._dropped: set[str] = set()
        if isinstance(inputs, Mapping):
            self._dropped = {str(k) for k in inputs if k in _TARGETS}
            inputs = {k: v for k, v in inputs.items() if k not in _TARGETS}
        check_subset(inputs, options, type(self).__name__)
        self.inputs, self.tokens, self.mask, self.options = inputs, tokens, mask, options
        self.batch_size = None if batch_size is None else check_every("batch_size", batch_size)
        self.name, self.seed = name, Seed(generator)
        #: the causes this callback's measurements warned of: said once over its evaluations
        self._said: set[str] = set()
        self.trainer: Any = None
        self.results: list[tuple[int, SensitivityResult]] = []
        #: results replaced by a checkpoint's when training resumed from it (:meth:`on_train_begin`)
        self.set_aside: list[list[tuple[int, SensitivityResult]]] = []
        #: what this callback last put into the Trainer's state (told apart from a checkpoint's)
        self._exported: dict[str, Any] | None = None
        self._warned = self._warned_best = self._warned_sets = False
        #: (global step and weights, result, prefixes logged): the last measurement, logged
        #: again, not measured again, for each evaluation set of the same evaluation
        self._last: tuple[Any, SensitivityResult, list[str]] | None = None

    def attach(self, trainer: Any) -> SensitivityCallback:
        """Add this callback to ``trainer``, first in its list, and log through
        ``trainer.log``; returns itself. First, so that the callbacks after it read the
        sensitivity in the evaluation's metrics: an ``EarlyStoppingCallback`` on
        ``eval_sensitivity`` listed before it found none and disabled itself."""
        callbacks = trainer.callback_handler.callbacks
        for other in callbacks:
            both = self._keys() & other._keys() if isinstance(other, SensitivityCallback) else ()
            if other is not self and both:
                raise ValueError(
                    f"two SensitivityCallbacks of this Trainer log under "
                    f"'eval_{sorted(both)[0]}': evaluate()'s metrics (what metric_for_best_model "
                    "and EarlyStoppingCallback read) would hold only the last one's value, and "
                    "log_history two values under one key, neither marked as which subset's; "
                    "give each its own name=, e.g. name='sensitivity_subset2'"
                )
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        self.trainer = trainer
        self._check_best(trainer.args)
        self._drop_labels(trainer.args, getattr(trainer, "model", None))
        return self

    def _drop_labels(self, args: Any, model: Any) -> None:
        """Drop the Trainer's label columns from a dict subset: ``args.label_names`` (e.g.
        ``["targets"]``), else the Trainer's own (``trainer.label_names``: those of the model's
        forward, ``start_positions``/``end_positions`` for question answering). Kept, they went
        into every perturbed copy, and the model computed a loss on each — and returned it
        beside its scores (a ``ModelOutput(loss=..., scores=...)``)."""
        if not isinstance(self.inputs, dict):
            return
        names = getattr(args, "label_names", None)
        if names is None:
            names = getattr(self.trainer, "label_names", None)
        if names is None and model is not None:
            try:
                from transformers.utils import find_labels

                names = find_labels(type(model))
            except (ImportError, TypeError, ValueError):  # a model whose forward has no signature
                names = None
        drop = set(names or ())
        if drop & set(self.inputs):
            self._dropped |= {str(k) for k in drop if k in self.inputs}
            self.inputs = {k: v for k, v in self.inputs.items() if k not in drop}

    def _keys(self) -> set[str]:
        return {self.name, f"{self.name}_stderr"}

    @property
    def state_key(self) -> str:
        """The callback's key in ``TrainerState.stateful_callbacks`` (so in a checkpoint's
        ``trainer_state.json``): by its ``name``, so two callbacks (which must have different
        names) keep their own results. Not a class name, so the Trainer does not try to
        rebuild the callback from it."""
        return f"senslab.SensitivityCallback[{self.name}]"

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Take a resumed checkpoint's ``results`` (the Trainer starts a fresh state for every
        ``train()``, so an entry under :attr:`state_key` came from the checkpoint); before,
        the measurements up to the checkpoint were missing from ``results``. A new run —
        another ``train()`` of this Trainer without resuming, a trial of
        ``hyperparameter_search`` — sets the results of the run before aside (into ``set_aside``,
        with a warning): they went on in one list, steps starting over (2, 4, 2, 4), and this
        run's checkpoints held them (:func:`~senslab.integrations._common.set_aside_earlier_run`;
        an evaluation at step 0 before the first ``train()`` stays). Then check, in one
        forward of the subset's first examples, what the first measurement would refuse (an
        output it cannot read, say): it refused it only at the first evaluation, after
        ``eval_steps`` of training that a crash then lost. Every process checks, and all stop
        if one fails. A Trainer that never evaluates (``eval_strategy="no"``, the default) is
        warned of: the callback measures at evaluations only."""
        self._check_best(args)
        strategy = getattr(args, "eval_strategy", getattr(args, "evaluation_strategy", None))
        if str(getattr(strategy, "value", strategy)) == "no":
            warnings.warn(
                "SensitivityCallback measures at every evaluation, and this Trainer never "
                "evaluates during training (eval_strategy='no', the default): nothing will be "
                "measured unless you call trainer.evaluate(); set "
                "TrainingArguments(eval_strategy='steps', eval_steps=...) or 'epoch'",
                UserWarning, stacklevel=2)
        model = kwargs.get("model")
        self._drop_labels(args, model)  # first: the configuration compared is of the subset
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(self.state_key)
        if saved is not None and saved is not self._exported:
            self._load(saved)
        self._last = None  # a measurement of another run is not this run's to log again
        set_aside_earlier_run(
            self, int(getattr(state, "global_step", 0) or 0), "steps",
            "To continue a run, pass trainer.train(resume_from_checkpoint=...); to keep each "
            "run's results apart, give each run its own callback")
        if model is not None:
            try:
                check_before_training(model, self.inputs, self.tokens, mask=self.mask,
                                      batch=self.batch_size, options=self.options,
                                      where=type(self).__name__, seed=self.seed)
            except TypeError as err:
                self._name_dropped(err)
                raise

    def _name_dropped(self, err: TypeError) -> None:
        """Say, on a model's error that names a label column this callback dropped (a forward
        that requires ``labels``), why it is missing and the fix: the error alone read as a
        subset built wrong."""
        named = sorted(k for k in self._dropped if f"'{k}'" in str(err))
        if named and hasattr(err, "add_note"):
            err.add_note(
                f"(SensitivityCallback drops the label column(s) {named} from its subset: with "
                "labels the model computes a loss on every perturbed copy, and sensitivity "
                "compares predictions. Give the model a forward that runs without them, e.g. "
                f"{named[0]}=None, returning the logits then)")

    def _export(self) -> dict[str, Any]:
        """``results`` and the causes said as JSON values (``trainer_state.json``): tensors as
        nested lists with their dtype, floats exactly (Python writes the shortest repr that
        reads back the same float; NaN as NaN)."""
        def plain(value: Any) -> Any:
            if isinstance(value, Tensor):
                t = value.detach().cpu()
                return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                        "data": t.tolist()}
            return list(value) if isinstance(value, tuple) else value

        return {
            "results": [[step, {f.name: plain(getattr(r, f.name))
                                for f in dataclasses.fields(r)}]
                        for step, r in self.results],
            "said": sorted(self._said),
            "config": self.config(),
        }

    def config(self) -> dict[str, str]:
        """What decides the logged number on given weights (the subset, mask, tokens, options,
        seed, measuring batch), as the checkpoints hold it: a resumed run whose callback differs
        does not continue the checkpoint's results (:meth:`_load`)."""
        return configuration(self.inputs, self.tokens, self.mask, self.seed, self.options,
                             self.batch_size)

    def _load(self, saved: Mapping[str, Any]) -> None:
        def value(v: Any) -> Any:
            if isinstance(v, Mapping) and "dtype" in v:
                return torch.tensor(v["data"], dtype=getattr(torch, v["dtype"])).reshape(
                    v["shape"])
            return v

        loaded = []
        for step, fields in saved.get("results", []):
            kw = {k: value(v) for k, v in fields.items()}
            kw["ci95"] = tuple(kw["ci95"])
            loaded.append((int(step), SensitivityResult(**kw)))
        self._said.update(saved.get("said", []))
        self._last = None
        if refuse_mixed_series(self, saved, loaded, "the resumed checkpoint's", "steps"):
            return
        if self.results:
            keep_aside(self, self.results)
            warnings.warn(
                f"SensitivityCallback({self.name!r}): the resumed checkpoint's results (steps "
                f"{[s for s, _ in loaded]}) replace the {len(self.results)} this callback held "
                f"(steps {[s for s, _ in self.results]}), which are kept in callback.set_aside",
                UserWarning, stacklevel=3,
            )
        self.results = loaded

    def _check_best(self, args: Any) -> None:
        """Warn (once) where the Trainer would keep the *most* sensitive checkpoint: transformers
        takes a larger value as better for every metric whose name does not end in "loss"."""
        best = getattr(args, "metric_for_best_model", None)
        if self._warned_best or best is None or not getattr(args, "greater_is_better", False):
            return
        if best == self.name or best.endswith(f"_{self.name}"):
            self._warned_best = True
            warnings.warn(
                f"metric_for_best_model={best!r} with greater_is_better=True (transformers' "
                "default for a metric whose name does not end in 'loss') keeps the most "
                "sensitive checkpoint; pass greater_is_better=False to keep the least sensitive",
                stacklevel=3,
            )

    def measure(self, model: Any) -> SensitivityResult:
        """The subset's sensitivity on ``model`` as it is now (nothing logged)."""
        try:
            return measure_subset(model, self.inputs, self.tokens, mask=self.mask,
                                  batch=self.batch_size, seed=self.seed, options=self.options,
                                  said=self._said)
        except TypeError as err:
            self._name_dropped(err)
            raise

    def on_evaluate(  # type: ignore[override]
        self, args: Any, state: Any, control: Any, model: Any = None,
        metrics: dict[str, float] | None = None, **kwargs: Any,
    ) -> None:
        if model is None:
            raise RuntimeError("SensitivityCallback.on_evaluate was called without the model")
        self._drop_labels(args, model)  # evaluate() without train() nor attach()
        prefix = _prefix(metrics)
        taken = sorted(k for k in (f"{prefix}_{key}" for key in self._keys())
                       if k in (metrics or {}))
        if taken:
            raise ValueError(
                f"the evaluation's metrics already hold {taken[0]!r} (from compute_metrics or "
                "another callback): SensitivityCallback would overwrite it in evaluate()'s "
                "metrics (what metric_for_best_model and EarlyStoppingCallback read) and log a "
                "second value under the same key; give the callback its own name=, e.g. "
                "name='sensitivity_subset2'"
            )
        now = (state.global_step, _weights(model))
        if self._last is not None and self._last[0] == now:
            r = self._last[1]  # the same model: another evaluation set of the same evaluation
            if prefix not in self._last[2]:
                self._last[2].append(prefix)
                self._say_sets(self._last[2])
        else:
            r = self.measure(model)
            self.results.append((state.global_step, r))
            self._last = (now, r, [prefix])
            # into the Trainer's state, which its checkpoints save after this evaluation
            if isinstance(getattr(state, "stateful_callbacks", None), dict):
                self._exported = self._export()
                state.stateful_callbacks[self.state_key] = self._exported
        logs = {f"{prefix}_{self.name}": r.estimate, f"{prefix}_{self.name}_stderr": r.stderr}
        if metrics is not None:
            metrics.update(logs)  # what evaluate() returns (best-model selection reads it)
        self._check_attached(state)
        if self.trainer is not None:
            self.trainer.log(dict(logs))
            return
        state.log_history.append({**logs, "epoch": state.epoch, "step": state.global_step})
        if not self._warned:
            self._warned = True
            warnings.warn(
                "SensitivityCallback was given to the Trainer without attach(): its values reach "
                "trainer.state.log_history but not the report_to reporters (TensorBoard, W&B); "
                "use SensitivityCallback(...).attach(trainer)",
                stacklevel=2,
            )

    def _check_attached(self, state: Any) -> None:
        """Stop logging through the attached Trainer where another Trainer calls this callback
        (its ``state`` is not the attached one's: the callback attached to one Trainer and then
        given to another, ``callbacks=[callback]`` or ``attach`` of another Trainer before):
        ``trainer.log`` had written the other Trainer's values into the attached one's
        ``log_history`` and reporters, each at the attached Trainer's last step (an evaluation
        at step 2 of the second run read as one at step 4 of the first), and nothing into the
        evaluating Trainer's. The values go to the evaluating Trainer's ``log_history`` instead,
        with a warning naming the fix."""
        attached = getattr(self.trainer, "state", None)
        if self.trainer is None or attached is None or attached is state:
            return
        self.trainer, self._warned = None, True
        warnings.warn(
            f"SensitivityCallback({self.name!r}) was attached to another Trainer than the one "
            "evaluating now: logged through that Trainer, its values would go into that Trainer's "
            "log_history and report_to reporters at that Trainer's step, and none into this "
            "one's. They go to this Trainer's state.log_history instead (not to its report_to "
            "reporters); to log through this Trainer, call callback.attach(trainer) with it",
            UserWarning, stacklevel=3)

    def _say_sets(self, prefixes: list[str]) -> None:
        if self._warned_sets:
            return
        self._warned_sets = True
        names = ", ".join(f"{p}_{self.name}" for p in prefixes)
        warnings.warn(
            f"the Trainer evaluates several datasets, but SensitivityCallback measures its own "
            f"fixed subset, once per evaluation: {names} are the same measurement, logged under "
            "each evaluation set's prefix, not a sensitivity of each set",
            stacklevel=3,
        )


def _weights(model: Any) -> tuple[tuple[int, int, Any], ...]:
    """Where each parameter and buffer of ``model`` lives, its in-place version counter and a
    digest of its values: equal only while the weights are the ones measured (an optimizer step
    or a ``load_state_dict`` moves a counter; a write through ``.data`` — an EMA's ``copy_to``,
    pruning by hand — moves none, but changes the digest)."""
    tensors = [*model.parameters(), *model.buffers()]
    with torch.no_grad():
        return tuple((t.data_ptr(), t._version, _digest(t)) for t in tensors)


def _digest(t: Tensor) -> Any:
    """A digest of ``t``'s values: ``torch.hash_tensor`` (the bits' XOR) where this torch has it,
    with the float64 sum beside it (an XOR cancels in pairs); the sum alone on an older torch."""
    t = t.detach()
    if t.is_complex():  # both parts (a LLaMA-style rotary buffer, freqs_cis): a cast drops one
        t = torch.view_as_real(t.resolve_conj())
    total = float(t.double().sum()) if t.numel() else 0.0
    hashed = getattr(torch, "hash_tensor", None)
    if hashed is None or not t.numel():
        return total
    return (hashed(t).view(torch.int64).item(), total)


#: the keys of timings every evaluation of the Trainer reports, after its metric key prefix
_TIMINGS = ("runtime", "samples_per_second", "steps_per_second")


def _prefix(metrics: Mapping[str, Any] | None) -> str:
    """The evaluation's metric key prefix (``eval`` unless ``evaluate(metric_key_prefix=...)``),
    read off the timing keys every evaluation reports together (``{prefix}_runtime``,
    ``{prefix}_samples_per_second``, ``{prefix}_steps_per_second``): a key of
    ``compute_metrics`` that ends in ``_runtime`` alone (``forward_runtime``) is not taken for
    it."""
    keys = list(metrics or {})
    found = [key[: -len("_runtime")] for key in keys if key.endswith("_runtime")]
    for prefix in found:
        if all(f"{prefix}_{t}" in keys for t in _TIMINGS):
            return prefix
    return found[0] if found else "eval"
