"""What is measured at every evaluation: accuracy and loss, token-wise sensitivity on a fixed
seeded training subset (and optionally test examples), per-position profile, weight norm and
sharpness."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn

from .._seeds import noise_seed
from .._stack import said_once
from ..data import ArrayDataset
from ..measure import TokenSensitivity
from .config import RunConfig
from .steps import evaluate, first_output, loss_function, output_rule, weight_norm


class Tracker:
    def __init__(self, cfg: RunConfig, model: nn.Module, train: ArrayDataset,
                 test: ArrayDataset, device: torch.device,
                 shard: tuple[int, int] | None = None) -> None:
        self.cfg, self.model, self.device, self.shard = cfg, model, device, shard
        self._rule: tuple[str, float | None] | None = None
        #: the causes the run's measurements warned of (few flips, …): said once per run, not
        #: at every evaluation, as the integrations' callbacks do
        self._said: set[str] = set()
        t = cfg.track
        # a count larger than its split is cut to the split, as `senslab measure --checkpoint`
        # cuts it (so it draws these same examples), and said: the run's config.json keeps the
        # count asked for, and a reader of sens/val beside sens/train (or of test/acc) would take
        # them for measurements on that many examples. Said by one process, not by every rank.
        say = shard is None or shard[0] == 0
        if say:
            unread(cfg)
        name = getattr(train, "name", None) or cfg.data.name
        splits = (f"{cfg.data.train_split} split of {name}", f"{cfg.data.test_split} split of "
                  f"{getattr(test, 'name', None) or cfg.data.name}")
        if cfg.data.train_subset == len(train):  # the training set is that subset
            splits = (f"{splits[0]} (data.train_subset={cfg.data.train_subset})", splits[1])
        g = torch.Generator().manual_seed(cfg.seed + 1)
        self.sens_train = train.first(capped(t.num_examples, train, "track.num_examples",
                                             splits[0], "sens/train", say), generator=g)
        # the validation subset has its own generator, so turning track.val on leaves every
        # other subset (and so train/* and test/*) as it was
        self.sens_val = (test.first(capped(t.num_examples, test, "track.num_examples", splits[1],
                                           "sens/val", say),
                                    generator=torch.Generator().manual_seed(cfg.seed + 2))
                         if t.val else None)
        if t.eval_examples is not None:
            self.eval_train = train.first(capped(t.eval_examples, train, "track.eval_examples",
                                                 splits[0], "train/loss and train/acc", say),
                                          generator=g)
            self.eval_test = test.first(capped(t.eval_examples, test, "track.eval_examples",
                                               splits[1], "test/loss and test/acc", say),
                                        generator=g)
        else:
            self.eval_train, self.eval_test = train, test

    def rule(self, data: ArrayDataset) -> tuple[str, float | None]:
        """The decision rule the loop trains with (:func:`decision_rule`, worked out once per
        run), so a small-init model whose outputs all lie in (0, 1) is read as trained, never
        refused."""
        if self._rule is None:
            self._rule = decision_rule(self.cfg, self.model, data, self.device)
        return self._rule

    def sensitivity(self, data: ArrayDataset) -> Any:
        t = self.cfg.track
        kind, threshold = self.rule(data)
        metric = TokenSensitivity(
            self.model, sigma=t.sigma, repeats=t.repeats, generator=noise_seed(self.cfg.seed),
            chunk_size=t.chunk_size, shard=self.shard, output_kind=kind, threshold=threshold,
        )
        metric._said = self._said
        for lo in range(0, len(data), 256):
            x, _ = data.batch(slice(lo, lo + 256))
            metric.update(_to(x, self.device))
        if self.shard is not None:
            metric.all_reduce()
        return metric.compute()

    def measure(self, loss_kind: str) -> dict[str, Any]:
        t, rec = self.cfg.track, {}
        bs = self.cfg.train.eval_batch_size
        rec["train/loss"], rec["train/acc"] = evaluate(
            self.model, self.eval_train, loss_kind, self.device, bs, self.shard
        )
        rec["test/loss"], rec["test/acc"] = evaluate(
            self.model, self.eval_test, loss_kind, self.device, bs, self.shard
        )
        diverged(self.cfg, rec)
        for split, data in (("train", self.sens_train), ("val", self.sens_val)):
            if data is None or t.sigma <= 0:
                continue
            r = self.sensitivity(data)
            # NaN (a standard error from one example, which the measurement warned of) as None:
            # written as a bare NaN, the record is not JSON to a strict reader (jq, JavaScript,
            # serde_json, DuckDB), which refused the whole metrics.jsonl line
            rec[f"sens/{split}"] = known(r.estimate)
            rec[f"sens/{split}_se"] = known(r.stderr)
            rec[f"sens/{split}_ci"] = [known(v) for v in r.ci95]
            rec[f"sens/{split}_positions"] = r.positions.tolist()
            rec[f"sens/{split}_per_position"] = [known(v) for v in r.per_position.tolist()]
        if t.weight_norm:
            rec["weight_norm"] = weight_norm(self.model)
        if t.sharpness or t.loss_sharpness:
            from ..measure import sharpness

            x, y = self.sens_train.batch(slice(0, None))
            x, y = _to(x, self.device), y.to(self.device)
        if t.sharpness:  # docs/definitions.md#shop-and-shpred: eval mode, weights restored exactly
            kind, threshold = self.rule(self.sens_train)
            # ShPred from no or few flipped predictions warns (with the bound of its draws):
            # once per run, not at every evaluation with other numbers
            with said_once(self._said):
                s = sharpness.output_sharpness(
                    self.model, x, sigma_w=t.sharpness_sigma, generator=noise_seed(self.cfg.seed),
                    output_kind=kind, threshold=threshold)
            rec["sharpness/shop"] = known(s.shop.estimate)
            if s.shpred is not None:
                rec["sharpness/shpred"] = known(s.shpred.estimate)
        if t.loss_sharpness:  # docs/definitions.md#loss-sharpness: E_Δ L(θ+Δ) − L(θ)
            def loss_fn(out: Any, target: Any) -> Any:
                return loss_function(loss_kind, out)(out, target)

            ls = sharpness.loss_sharpness(self.model, loss_fn, x, y,
                                          sigma=t.loss_sharpness_sigma,
                                          generator=noise_seed(self.cfg.seed))
            rec["sharpness/loss"] = known(ls.estimate)
        return rec


def known(value: float) -> float | None:
    """``value``, or None where it is not a finite number (metrics.jsonl's "not known", as a
    strict JSON reader reads it; ``json.dumps`` writes NaN and inf as bare ``NaN`` and
    ``Infinity``, which are not JSON)."""
    value = float(value)
    return value if math.isfinite(value) else None


def diverged(cfg: RunConfig, record: dict[str, Any]) -> None:
    """A FloatingPointError, as the loop's for a training loss, when an evaluation's loss
    (``train/loss``, ``test/loss`` of ``record``) is not finite, nor then are the model's
    outputs. The loop checks each batch's loss before its step, so a step that made the outputs
    overflow (the run's last, whose loss no later step reads) finished the run with
    ``train/loss`` NaN and an accuracy read from NaN outputs (every argmax the first class:
    0.0987 on digits, its share of class 0), in metrics.jsonl and summary.json without a
    word."""
    bad = [f"{k}={record[k]}" for k in ("train/loss", "test/loss") if not math.isfinite(record[k])]
    if not bad:
        return
    o = cfg.optim
    rate = (f"optim.eta_max (now {o.eta_max}; sps sets its own step size)" if o.name == "sps"
            else f"optim.lr (now {o.lr})")
    raise FloatingPointError(
        f"evaluation loss became {bad[0].partition('=')[2]} ({', '.join(bad)}): the model's "
        f"outputs are no longer finite, so no accuracy or sensitivity can be read from them; "
        f"lower {rate} or check the data")


#: the tracking settings read only with another one, and what to set for them to be read (the
#: run's track.num_examples and track.repeats are read with track.sigma=0 too: by `senslab measure
#: --checkpoint`, as its defaults)
_READ_WITH = (
    ("val", lambda t: t.sigma > 0, "track.sigma=0 measures no sensitivity (no sens/val)",
     "set track.sigma above 0"),
    ("sharpness_sigma", lambda t: t.sharpness, "track.sharpness=false measures no ShOp/ShPred",
     "set track.sharpness=true"),
    ("loss_sharpness_sigma", lambda t: t.loss_sharpness,
     "track.loss_sharpness=false measures no sharpness/loss", "set track.loss_sharpness=true"),
)


def unread(cfg: RunConfig) -> None:
    """A warning for each ``track.*`` setting that ``cfg`` sets off its default but whose
    measurement is off (``track.val=true`` with ``track.sigma=0``, a ``track.sharpness_sigma``
    without ``track.sharpness``...): the run recorded exactly what it records without it,
    while config.json (and the reports, which set runs apart by it) said it was measured."""
    from .config import TrackConfig

    t, default = cfg.track, TrackConfig()
    for key, read, why, fix in _READ_WITH:
        value = getattr(t, key)
        if value != getattr(default, key) and not read(t):
            value = str(value).lower() if isinstance(value, bool) else value
            warnings.warn(f"track.{key}={value} is not read: {why}, so the run records what it "
                          f"records without it (config.json keeps it); {fix} for it to be "
                          f"measured, or drop track.{key}", stacklevel=3)


def decision_rule(cfg: RunConfig, model: nn.Module, data: ArrayDataset,
                  device: torch.device) -> tuple[str, float | None]:
    """The decision rule (``output_kind``, ``threshold``) a run of ``cfg`` reads ``model``'s
    outputs with: :func:`~senslab.train.steps.output_rule` of ``train.loss`` and the model's
    output for ``data``'s first example (in eval mode, mode restored). The tracker measures
    ``sens/*`` and sharpness with it, and ``senslab measure --checkpoint`` measures a run's
    checkpoint with it, so that the two read the same weights alike (``train.loss=mse`` on one
    column: class = output > 0.5, where the model declares logits, class = sign)."""
    return output_rule(cfg.train.loss, model, first_output(model, data, device))


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, dict):
        return {k: v.to(device) for k, v in x.items()}
    return x.to(device)


def capped(asked: int, data: ArrayDataset, key: str, split: str, what: str,
           say: bool = True) -> int:
    """How many of ``data``'s examples a measurement draws for ``what``: ``asked`` (the setting
    ``key``), or all of them when the split holds fewer, with a warning (``say``) that names
    the count the numbers rest on and the setting that says so."""
    have = len(data)
    if asked > have and say:
        warnings.warn(f"{key}={asked}, but the {split} has {have:,} examples: {what} "
                      f"{'are' if ' and ' in what else 'is'} measured on all {have:,} at every "
                      f"evaluation, not on {asked:,} (set {key}={have} or less to say so)",
                      stacklevel=3)
    return min(asked, have)
