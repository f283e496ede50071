"""Track sensitivity while Lightning trains (``pip install 'senslab[lightning]'``).

:class:`SensitivityCallback` measures a fixed subset every ``every_n_epochs`` training epochs
and logs the estimate and its standard error through ``pl_module.log``, so every logger the
Trainer has (CSV, TensorBoard, W&B, …) records them and ``trainer.callback_metrics`` holds them
(usable by ``ModelCheckpoint(monitor=...)``). Each measurement starts the noise from the same
seed (common random numbers: changes between epochs are the model's), so the logged value
equals ``token_sensitivity(model, subset, tokens, generator=seed, ...)`` on the model of that
epoch (to float32, as Lightning logs; ``results`` holds the full value). Under the Trainer's
precision the subset is converted as Lightning converts a batch (``"bf16-true"``: bf16 images).

Example:
    >>> import torch
    >>> from senslab.integrations.lightning import SensitivityCallback
    >>> from senslab.tokens import Patches
    >>> callback = SensitivityCallback(torch.randn(64, 1, 8, 8), Patches(4), sigma=0.5,
    ...                                every_n_epochs=2)
    >>> # lightning.Trainer(callbacks=[callback]).fit(module) logs sensitivity(_stderr)

Under DDP every process measures the whole subset (the same numbers: same seed, same weights;
keep the subset small) and the values are logged with ``sync_dist=True``.

The callback's ``results`` (and the warnings it has said) go into the Trainer's checkpoints
(under a key holding ``name``), so a fit resumed from one continues them — with the
configuration (subset, options, seed) saved beside them: a callback built otherwise starts its
results anew, with a warning, rather than continue another quantity's series. Two callbacks of one
Trainer must have different names: Lightning averages the values logged under one key in one
hook, and neither measurement would be logged.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "senslab.integrations.lightning needs Lightning: pip install 'senslab[lightning]'"
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


class SensitivityCallback(Callback):
    """Measure token sensitivity of a fixed subset every N training epochs and log it.

    Args:
        inputs: the subset — a tensor, tuple or dict of tensors with the example axis first
            (moved to the module's device when measured).
        tokens: a :class:`~senslab.tokens.Tokenization` (module names relative to the
            LightningModule); default (None): ``pl_module.default_tokens()`` if it declares
            one, else :func:`~senslab.tokens.auto_tokens` of the Hugging Face or timm model it
            holds (e.g. ``self.model``; :func:`~senslab.tokens.default_tokens`).
        mask: (B, T) bool, true on real tokens (padding excluded), as for ``token_sensitivity``.
        every_n_epochs: measure after epochs N, 2N, … (epoch numbers counted from 1).
        name: the logged keys are ``name`` (estimate) and ``f"{name}_stderr"``.
        batch_size: examples per measuring batch (default: the whole subset in one batch).
        generator: the int seed (default 0) or ``torch.Generator`` every measurement starts from.
        **options: :class:`~senslab.measure.TokenSensitivity`'s options (``sigma``,
            ``repeats``, ``estimand``, …).

    Before training (:meth:`on_fit_start`) one forward of the subset's first examples checks
    what the first measurement would refuse — which output is the prediction (``output=``),
    its shape and kind, the tokens — so that a refusal costs no epoch of training
    (:func:`~senslab.integrations._common.check_before_training`).

    ``results`` holds ``(epoch, SensitivityResult)`` for every measurement of the current fit;
    the checkpoints hold it, and a fit resumed from one replaces it (what it held is kept in
    ``set_aside``, with a warning: a list of series, one ``[(epoch, result), ...]`` per
    series set aside, in order). A new fit that does not resume (the callback given to
    another Trainer) sets the earlier fit's results aside too, with a warning.
    ``trainer.validate()``/``test()`` measure nothing (a warning says so) and leave ``results``
    as it is, also with ``ckpt_path=``.

    The callback measures the LightningModule's ``forward``, as the class scores: a module
    whose ``forward`` returns features and whose ``validation_step`` applies a head
    (``self.head(self(x))``) is measured on the features. Before training, an ``nn.Linear`` of
    the module that the forward did not run and that takes the forward's output width, a 2-D
    parameter of shape (classes, that width) that the forward did not take (a head applied as
    ``F.linear(self(x), self.w, self.b)``), or an ``hparams`` ``num_classes``/``num_labels``
    other than that width, is warned of; point the
    callback at the classifier with ``output=module.head`` (a function of the forward's output),
    or give the module a ``forward`` that returns the logits.
    """

    def __init__(
        self, inputs: Inputs, tokens: Tokenization | None = None, *, mask: Tensor | None = None,
        every_n_epochs: int = 1, name: str = "sensitivity", batch_size: int | None = None,
        generator: torch.Generator | int | None = 0, **options: Any,
    ) -> None:
        super().__init__()
        check_options(tokens, options, type(self).__name__)
        check_subset(inputs, options, type(self).__name__)
        self.inputs, self.tokens, self.mask, self.options = inputs, tokens, mask, options
        self.every_n_epochs = check_every("every_n_epochs", every_n_epochs)
        self.batch_size = None if batch_size is None else check_every("batch_size", batch_size)
        self.name, self.seed = name, Seed(generator)
        #: the causes this callback's measurements warned of: said once over its evaluations
        self._said: set[str] = set()
        self.results: list[tuple[int, SensitivityResult]] = []
        #: (epoch, estimate, stderr) last logged, until :meth:`_check_logged` has read them back
        self._logged: tuple[int, float, float] | None = None
        #: results replaced by a checkpoint's (:meth:`load_state_dict`), or of an earlier fit
        #: (:meth:`on_train_start`)
        self.set_aside: list[list[tuple[int, SensitivityResult]]] = []
        #: whether the checkpoint being loaded is loaded by validate/test/predict (not a fit's)
        self._loading_outside_fit = False
        self._warned_stage = False

    @property
    def state_key(self) -> str:
        """The callback's key in a checkpoint: by its ``name``, so two callbacks (which must
        have different names, :meth:`setup`) keep their own results."""
        return self._generate_state_key(name=self.name)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Refuse a second callback of the Trainer that logs under one of this one's keys:
        Lightning merges two values logged under one key in one hook into their mean
        weighted by batch size (the subsets' sizes), and the mean was logged — and monitored —
        as either's value, without a word. Under ``trainer.validate()`` or ``test()`` say (once)
        that the callback measures nothing there: it measures at training epochs' ends, and
        its silence read as a run without the callback, or one whose value had gone missing.
        It does not measure there: a value logged by ``validate(ckpt_path="best")`` would go to
        the loggers at the fit's last step, as a point of the fit's series, measured on other
        weights."""
        stage = str(getattr(stage, "value", stage))  # a TrainerFn, or its string
        if stage in ("validate", "test") and not self._warned_stage:
            self._warned_stage = True
            warnings.warn(
                f"SensitivityCallback({self.name!r}) measures at the end of training epochs, in "
                f"fit() only: trainer.{stage}() logs no sensitivity, and callback.results gains "
                "nothing. To measure the module as it is (e.g. after loading a checkpoint), call "
                "callback.measure(module) — the same subset, seed and options — or "
                "senslab.token_sensitivity(module, subset, tokens, ...)",
                UserWarning, stacklevel=2)
        mine = {self.name, f"{self.name}_stderr"}
        for other in trainer.callbacks:
            if other is self or not isinstance(other, SensitivityCallback):
                continue
            both = mine & {other.name, f"{other.name}_stderr"}
            if both:
                raise ValueError(
                    f"two SensitivityCallbacks of this Trainer log under {sorted(both)[0]!r}: "
                    "Lightning would log the mean of their values under it, neither "
                    "measurement; give each its own name=, e.g. name='sensitivity_subset2'"
                )

    def state_dict(self) -> dict[str, Any]:
        """``results`` and the causes said, as plain values (a checkpoint loaded with
        ``torch.load(weights_only=True)`` holds them)."""
        return {
            "results": [(epoch, {f.name: getattr(r, f.name) for f in dataclasses.fields(r)})
                        for epoch, r in self.results],
            "said": sorted(self._said),
            "config": self.config(),
        }

    def config(self) -> dict[str, str]:
        """What decides the logged number on given weights (the subset, mask, tokens, options,
        seed, measuring batch), as the checkpoints hold it: a resumed fit whose callback differs
        does not continue the checkpoint's results (:meth:`load_state_dict`)."""
        return configuration(self.inputs, self.tokens, self.mask, self.seed, self.options,
                             self.batch_size)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take a checkpoint's ``results`` (a resumed fit continues them; before, the epochs
        up to the checkpoint were missing from ``results``). Results this callback held are
        not dropped: they go to ``set_aside``, with a warning. Results of another configuration
        than this callback's (:meth:`config`; a checkpoint of an older senslab holds none, and
        is continued) are not continued: they go to ``set_aside`` too, and ``results`` starts
        anew (:func:`~senslab.integrations._common.refuse_mixed_series`)."""
        if self._loading_outside_fit:  # validate/test/predict(ckpt_path=...): not resumed
            self._loading_outside_fit = False
            return
        loaded = [(int(epoch), SensitivityResult(**fields))
                  for epoch, fields in state_dict.get("results", [])]
        self._said.update(state_dict.get("said", []))
        if refuse_mixed_series(self, state_dict, loaded, "the checkpoint's", "epochs"):
            return
        if self.results:
            keep_aside(self, self.results)
            warnings.warn(
                f"SensitivityCallback({self.name!r}): the checkpoint's results (epochs "
                f"{[e for e, _ in loaded]}) replace the {len(self.results)} this callback held "
                f"(epochs {[e for e, _ in self.results]}), which are kept in "
                "callback.set_aside",
                UserWarning, stacklevel=2,
            )
        self.results = loaded

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """Note whether the checkpoint is loaded by a fit (resumed: :meth:`load_state_dict`
        takes its results) or by ``validate``/``test``/``predict(ckpt_path=...)``, which only
        load weights to evaluate: there the checkpoint's results had replaced the fit's
        (``test(ckpt_path="best")`` after a 3-epoch fit left ``results`` with the best
        epoch's series and moved the fit's to ``set_aside``)."""
        fn = getattr(getattr(trainer, "state", None), "fn", None)
        self._loading_outside_fit = str(getattr(fn, "value", fn)) != "fit"

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._loading_outside_fit = False  # a load_state_dict called by hand loads

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Set the results of an earlier fit aside (into ``set_aside``, with a warning): the
        callback given to a second Trainer, whose epochs start over, went on in one list (epochs
        1, 2, 1, 2) and the new fit's checkpoints held the earlier fit's values. Here, after a
        checkpoint's loops are restored: a resumed fit starts at the checkpoint's epoch, beyond
        every result the checkpoint holds (:func:`~senslab.integrations._common.
        set_aside_earlier_run`)."""
        set_aside_earlier_run(
            self, int(trainer.current_epoch), "epochs",
            "To continue a fit, pass fit(..., ckpt_path=...); to keep each fit's results apart, "
            "give each fit its own callback")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Check, in one forward of the subset's first examples (the module on its device,
        under the Trainer's precision), what the first measurement would refuse (an output it
        cannot read, say): it refused it only at the end of the first measured epoch, whose
        training the crash lost. Every process checks, and all stop if one fails. With
        ``eval_mode=False`` the forward runs in the modes the fit trains in, those of the
        measurement at an epoch's end (dropout or BatchNorm on batch statistics refused here,
        not after the epochs before the first measurement).

        A ``ModelCheckpoint`` or ``EarlyStopping`` that monitors this callback's keys must judge
        at the end of a training epoch this callback measures, after it: one that judges after
        validation (``check_val_every_n_epoch`` > 1, ``val_check_interval`` < 1), within an
        epoch (``every_n_train_steps``), at epochs this one does not measure, or (EarlyStopping)
        before it in ``callbacks`` read the previous measurement as this epoch's, or found none
        (Lightning's error then asked whether ``log`` was called). Refused here, with the
        fix."""
        _refuse_stale_monitors(self, trainer)
        last = getattr(trainer, "max_epochs", None)
        if last is not None and 0 <= last < self.every_n_epochs:
            warnings.warn(
                f"SensitivityCallback({self.name!r}) measures after epochs "
                f"{self.every_n_epochs}, {2 * self.every_n_epochs}, …, and this fit ends after "
                f"{last} epoch(s) (max_epochs={last}): nothing will be measured; lower "
                f"every_n_epochs to at most {last}, or call callback.measure(module)",
                UserWarning, stacklevel=2)
        used: set[str] = set()  # the names of the parameters the forward took
        with _parameters_used(pl_module, used) as seen:
            check_before_training(
                pl_module, self._converted(pl_module), self.tokens, mask=self.mask,
                batch=self.batch_size, options=self.options, where=type(self).__name__,
                any_failed=lambda failed: bool(
                    trainer.strategy.reduce_boolean_decision(failed, all=False)),
                modes_known=True, seed=self.seed,
                look=lambda clean, ran: _say_unused_head(
                    self, pl_module, clean, ran, used if seen() else None))

    def _converted(self, pl_module: LightningModule) -> Inputs:
        """The subset converted as Lightning converts a batch under the Trainer's precision."""
        trainer = getattr(pl_module, "_trainer", None)  # .trainer raises when none is attached
        plugin = getattr(trainer, "precision_plugin", None)
        return self.inputs if plugin is None else plugin.convert_input(self.inputs)

    def measure(self, pl_module: LightningModule) -> SensitivityResult:
        """The subset's sensitivity on the module as it is now (nothing logged); under the
        Trainer's precision, the subset converted as Lightning converts a batch (a
        ``"bf16-true"`` module gets bf16 images; integer ids stay as they are)."""
        return measure_subset(pl_module, self._converted(pl_module), self.tokens,
                              mask=self.mask, batch=self.batch_size, seed=self.seed,
                              options=self.options, said=self._said)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        epoch = trainer.current_epoch + 1
        if epoch % self.every_n_epochs:
            return
        r = self.measure(pl_module)
        self.results.append((epoch, r))
        _refuse_keys_logged_elsewhere(self, trainer)
        n = r.num_examples
        pl_module.log(self.name, r.estimate, on_step=False, on_epoch=True, sync_dist=True,
                      batch_size=n)
        pl_module.log(f"{self.name}_stderr", r.stderr, on_step=False, on_epoch=True,
                      sync_dist=True, batch_size=n)
        self._logged = (epoch, r.estimate, r.stderr)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check_logged(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check_logged(trainer)

    def _check_logged(self, trainer: Trainer) -> None:
        """Raise where the values Lightning logged for this callback's last measurement are
        not its own: the module logged under one of its keys in its own ``on_train_epoch_end``
        (called after this callback's), and Lightning logged — and a ``ModelCheckpoint`` or
        ``EarlyStopping`` judged by — the mean of both values, weighted by batch size, without a
        word (``callback.results`` holds the measurement itself)."""
        if self._logged is None:
            return
        epoch, estimate, stderr = self._logged
        self._logged = None
        metrics = trainer.callback_metrics
        for key, value in ((self.name, estimate), (f"{self.name}_stderr", stderr)):
            got = metrics.get(key)
            if got is None or not isinstance(got, (Tensor, float, int)):
                continue
            got = float(got)
            if not math.isclose(got, value, rel_tol=1e-5, abs_tol=1e-7) \
                    and not (math.isnan(got) and math.isnan(value)):
                raise ValueError(
                    f"SensitivityCallback({self.name!r}) logged {key}={value:.6g} at epoch "
                    f"{epoch}, but Lightning holds {key}={got:.6g}: something else (the "
                    "module's on_train_epoch_end, say) logged under the same key in the same "
                    "hook, and Lightning logged the mean of both values, weighted by batch "
                    "size; callback.results holds the measurement. Give the callback its own "
                    "name=, e.g. name='sensitivity_subset', or log the module's value under "
                    "another key")


#: the hyperparameters (``save_hyperparameters``) a module declares its class count under
_CLASS_COUNTS = ("num_classes", "n_classes", "num_labels")


class _Record(TorchFunctionMode):
    """Notes the parameters passed to a torch function (``F.linear(h, self.w)``, ``self.w.T``)
    while ``active()``."""

    def __init__(self, active: Callable[[], dict[int, list[str]] | None],
                 used: set[str]) -> None:
        super().__init__()
        self.active, self.used = active, used

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        names = self.active()
        if names:
            for leaf in tree_flatten((args, kwargs))[0]:
                if isinstance(leaf, nn.Parameter) and id(leaf) in names:
                    self.used.update(names[id(leaf)])  # each name of a shared one
        return func(*args, **kwargs)


@contextmanager
def _parameters_used(pl_module: LightningModule,
                     used: set[str]) -> Iterator[Callable[[], bool]]:
    """Collect into ``used`` the names of the parameters that ``pl_module``'s forwards (within
    the block) pass to torch functions; yields whether a forward was seen taking any (a
    compiled forward, or one of a C++ extension, may not be: then nothing is known)."""
    state: dict[str, Any] = {"depth": 0, "names": None, "done": False}

    def enter(module: nn.Module, _args: Any) -> None:
        if not state["depth"]:  # the parameters as the forward finds them (FSDP: unsharded)
            names: dict[int, list[str]] = {}
            for n, p in module.named_parameters(remove_duplicate=False):
                names.setdefault(id(p), []).append(n)
            state["names"] = names
        state["depth"] += 1

    def leave(module: nn.Module, _args: Any, _out: Any) -> None:
        state["depth"] -= 1
        if not state["depth"]:
            state["names"], state["done"] = None, True

    try:
        handles = [pl_module.register_forward_pre_hook(enter),
                   pl_module.register_forward_hook(leave, always_call=True)]
    except (RuntimeError, TypeError, AttributeError):  # hooks refused: nothing seen
        yield lambda: False
        return
    try:
        with _Record(lambda: state["names"], used):
            yield lambda: bool(state["done"] and used)
    finally:
        for handle in handles:
            handle.remove()


def _say_unused_head(callback: SensitivityCallback, pl_module: LightningModule, clean: Tensor,
                     ran: set[Any], used: set[str] | None = None) -> None:
    """Warn where the forward's output, about to be read as class scores, looks like features:
    a linear layer of the module that the forward did not run takes exactly the output's width
    (a head that ``validation_step`` applies: ``self.head(self(x))``), or a 2-D parameter of
    shape (classes, width) that the forward did not take (``used``: the names of those it took;
    None: not known) — a head applied as ``F.linear(self(x), self.w, self.b)`` — or the module's
    hyperparameters declare another class count. Measured as it is, the argmax over the
    features was taken for the predicted class, without a word. A heuristic — a head applied
    through a function of no parameter of its own, or an unused layer of another width, is not
    seen; the docs say the callback measures ``forward`` — hence a warning, not a refusal."""
    if not isinstance(clean, Tensor) or clean.dim() != 2:
        return
    width = int(clean.shape[-1])
    unused = None
    for name, module in pl_module.named_modules():
        fan_in = getattr(module, "in_features", None)
        fan_out = getattr(module, "out_features", None)
        if name and module not in ran and isinstance(fan_in, int) \
                and isinstance(fan_out, int) and fan_in == width != fan_out:
            parts = name.split(".")
            head = next(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                        if pl_module.get_submodule(p) not in ran)
            unused = (name, fan_in, fan_out, head)
            break
    weight = None
    if unused is None and used is not None:
        for name, param in pl_module.named_parameters():
            owner = pl_module.get_submodule(name.rpartition(".")[0])
            if param.dim() == 2 and int(param.shape[1]) == width != int(param.shape[0]) \
                    and name not in used and not isinstance(owner, nn.Embedding) \
                    and not isinstance(getattr(owner, "in_features", None), int):
                weight = (name, int(param.shape[0]))
                break
    declared = None
    hparams = getattr(pl_module, "hparams", None)
    for key in _CLASS_COUNTS if isinstance(hparams, Mapping) else ():
        n = hparams.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n >= 2 and width != n \
                and not (n == 2 and width == 1):
            declared = (key, n)
            break
    if unused is None and weight is None and declared is None:
        return
    reasons = []
    if unused is not None:
        name, fan_in, fan_out, head = unused
        reasons.append(f"module.{name} (Linear {fan_in} -> {fan_out}) takes {width} features "
                       "and did not run in forward")
    if weight is not None:
        reasons.append(f"module.{weight[0]} (a parameter of shape ({weight[1]}, {width})) "
                       f"takes {width} features and forward did not use it")
    if declared is not None:
        reasons.append(f"the module's hparams declare {declared[0]}={declared[1]}")
    if unused is not None:
        point = f"output=module.{unused[3]} (applied to forward's output)"
    elif weight is not None:
        point = (f"output= a function that applies the classifier to forward's output (e.g. "
                 f"lambda h: F.linear(h, module.{weight[0]}, ...))")
    else:
        point = "output= a function that applies the classifier to forward's output"
    warnings.warn(
        f"SensitivityCallback({callback.name!r}) measures the LightningModule's forward and "
        f"reads its output, {tuple(clean.shape)}, as {width} class scores; but "
        f"{' and '.join(reasons)}. If forward returns features and the classifier is applied "
        f"elsewhere (validation_step: self.head(self(x))), the measured 'classes' are feature "
        f"columns: pass {point}, or give the module a forward that returns the logits. If "
        "forward's output is the class scores, pass output=lambda scores: scores to say so",
        UserWarning, stacklevel=2)


def _refuse_keys_logged_elsewhere(callback: SensitivityCallback, trainer: Trainer) -> None:
    """Raise where another hook of this fit (the module's ``training_step`` or
    ``validation_step``, say) logged under one of ``callback``'s keys: Lightning keeps one value
    per key, and the callback's replaced the other in ``callback_metrics`` and the loggers
    without a word (or both went to the loggers under one key at one step)."""
    mine = {callback.name, f"{callback.name}_stderr"}
    epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    for loop in (epoch_loop, getattr(epoch_loop, "val_loop", None)):
        results = getattr(loop, "_results", None)
        if not isinstance(results, dict):
            continue
        for result in results.values():
            meta = getattr(result, "meta", None)
            fx = str(getattr(meta, "fx", ""))
            if getattr(meta, "name", None) in mine and fx != "on_train_epoch_end":
                raise ValueError(
                    f"SensitivityCallback({callback.name!r}) logs {meta.name!r}, and this fit "
                    f"also logged {meta.name!r} in {fx}: Lightning would keep one value under "
                    "the key, and one of them would be lost, or read as the other (by a "
                    "ModelCheckpoint or EarlyStopping monitoring it); give the callback its own "
                    "name=, e.g. name='sensitivity_subset', or log the other value under "
                    "another key")


def _refuse_stale_monitors(callback: SensitivityCallback, trainer: Trainer) -> None:
    """Raise where a ``ModelCheckpoint`` or ``EarlyStopping`` of ``trainer`` monitors one of
    ``callback``'s keys but would not judge right after a measurement of it (see
    :meth:`SensitivityCallback.on_fit_start`)."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    keys = (callback.name, f"{callback.name}_stderr")
    n = callback.every_n_epochs
    after = False  # whether ``callback`` came before, in the order the Trainer calls them
    for other in trainer.callbacks:
        if other is callback:
            after = True
            continue
        monitor = getattr(other, "monitor", None)
        if monitor not in keys:
            continue
        what = f"{type(other).__name__}(monitor={monitor!r})"
        stale = (f"SensitivityCallback({callback.name!r}) measures at the end of "
                 f"{_epochs(n)} (every_n_epochs={n}), so {what} would judge the weights by an "
                 "earlier measurement, or find none")
        if isinstance(other, ModelCheckpoint):
            steps = getattr(other, "_every_n_train_steps", 0) or 0
            timed = getattr(other, "_train_time_interval", None)
            if steps >= 1 or timed is not None:
                within = (f"every_n_train_steps={steps}" if steps >= 1
                          else "train_time_interval")
                raise ValueError(
                    f"{what} saves within an epoch ({within}): "
                    f"{stale}; save by epochs: ModelCheckpoint(monitor={monitor!r}, "
                    f"every_n_epochs={n})")
            if not _saves_on_train_epoch_end(other, trainer):
                raise ValueError(
                    f"{what} saves after validation ({_validation(trainer)}), which runs "
                    f"before the epoch's measurement: {stale}; pass "
                    f"ModelCheckpoint(..., save_on_train_epoch_end=True)")
            every = getattr(other, "_every_n_epochs", 1) or 0
            if every >= 1 and every % n:
                raise ValueError(
                    f"{what} saves every {every} epoch(s), at epochs this callback does not "
                    f"measure: {stale}; pass ModelCheckpoint(..., every_n_epochs={n}) (or a "
                    f"multiple of {n})")
        elif isinstance(other, EarlyStopping):
            if not getattr(other, "_check_on_train_epoch_end", True):
                raise ValueError(
                    f"{what} checks after validation ({_validation(trainer)}), which runs "
                    f"before the epoch's measurement: {stale}; pass "
                    f"EarlyStopping(..., check_on_train_epoch_end=True)")
            if n != 1:
                raise ValueError(
                    f"{what} checks at every epoch's end: {stale}; measure every epoch "
                    f"(every_n_epochs=1)")
            if not after:
                raise ValueError(
                    f"{what} comes before SensitivityCallback({callback.name!r}) in the "
                    "Trainer's callbacks, so it checks before the epoch's measurement: "
                    f"{stale}; list the SensitivityCallback first")


def _epochs(n: int) -> str:
    return "every training epoch" if n == 1 else f"training epochs {n}, {2 * n}, …"


def _saves_on_train_epoch_end(checkpoint: Any, trainer: Trainer) -> bool:
    """Whether ``checkpoint`` (a ``ModelCheckpoint``) saves at a training epoch's end, as
    Lightning decides it, before the validation data is known (validation counted as run)."""
    chosen = getattr(checkpoint, "_save_on_train_epoch_end", None)
    if chosen is not None:
        return bool(chosen)
    if getattr(trainer, "_val_check_time_interval", None) is not None:
        return False
    return trainer.check_val_every_n_epoch == 1 and trainer.val_check_interval == 1.0


def _validation(trainer: Trainer) -> str:
    return (f"check_val_every_n_epoch={trainer.check_val_every_n_epoch}, "
            f"val_check_interval={trainer.val_check_interval}")
