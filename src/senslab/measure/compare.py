r"""Paired comparisons: several models measured on the same perturbed copies.

"Is model A less sensitive than model B?" is a question about a difference, and its uncertainty
is much smaller than the two separate uncertainties suggest when both models see the *same*
examples and the *same* noise (common random numbers). :func:`compare_sensitivity` runs one
token-wise pass (:mod:`.tokenwise`) per model with identical options, an identical random
stream and an identical plan, so copy :math:`n` — example :math:`b_n`, token :math:`t_n`, noise
vector :math:`\varepsilon_n` — is the same input for every model. Each model's estimate is
exactly what :func:`~senslab.measure.token_sensitivity` returns with the same seed and options:
pairing costs nothing in the point estimates.

**Differences.** For models :math:`a, b` let :math:`v_{a,n}, v_{b,n}` be the values (flip
indicators, or output distances) of copy :math:`n`. The difference is estimated by

.. math::

    \hat\Delta_{ab} = \hat S_a - \hat S_b = \frac1n \sum_{e=1}^{n} d_e, \qquad
    d_e = \hat m_{a,e} - \hat m_{b,e},

:math:`\hat m_{a,e}` the per-example rate of model :math:`a` on example :math:`e`. Its paired
standard error treats the differences :math:`v_{a,n} - v_{b,n}` as the measurement:

* ``"data"`` (examples are the sampling unit):
  :math:`\operatorname{se} = s_d / \sqrt{n}`, :math:`s_d^2` the sample variance of the
  :math:`d_e`;
* ``"subset"`` (fixed examples, only the noise is random): with all tokens and at least two
  units per token, the stratified variance of the differences of paired units,

  .. math::

      \operatorname{se}^2 = \frac1{n^2} \sum_e \frac1{K_e^2} \sum_t
      \frac{s^2_{et}(u_a - u_b)}{r},

  :math:`s^2_{et}(u_a - u_b)` the sample variance over the :math:`r` draws of cell
  :math:`(e, t)` of the paired unit differences (antithetic pair means with
  ``antithetic=True``), :math:`K_e` the example's real tokens; otherwise the units
  :math:`u_a - u_b` of an example are treated as i.i.d. draws (conservative; with ``num_tokens``
  a unit is the mean of all draws of one sampled token in a round), as in :mod:`._stats`.

Because :math:`\operatorname{Var}(v_a - v_b) = \operatorname{Var} v_a + \operatorname{Var} v_b
- 2\operatorname{Cov}(v_a, v_b)`, the paired standard error is smaller than the unpaired
:math:`\sqrt{\operatorname{se}_a^2 + \operatorname{se}_b^2}` (also reported, ``stderr_unpaired``)
whenever the two models' flips are positively correlated — similar models, the usual case. The
95% interval is :math:`\hat\Delta \pm q\,\operatorname{se}` (not clipped: a difference lies
in [−1, 1]), :math:`q` the 0.975 quantile of Student's t with :math:`n - 1` degrees of freedom
for ``"data"`` (the :math:`d_e` are :math:`n` i.i.d. values whose spread estimates the
variance), 1.96 for ``"subset"`` (for distances Student's t on the Satterthwaite degrees of
freedom), as for one model (:func:`._stats.interval_quantile`, :func:`._stats.subset_dof`).

Both paired standard errors are estimated from the copies on which the two models differ. Where
they differ on none, every difference is 0 and so is the standard error: ``compute`` then warns
(once per pair and comparison) that the ``± 0`` says no disagreement was seen, not that the
difference is known exactly, and gives the rule of three's bound on their disagreement (with the
control variate too, where the adjusted values are the same on every copy). With the control
variate the copies counted are those on which the two models' flips differ otherwise than their
tangents' (an adjusted value :math:`v - c + q`, :math:`q \in [0, \tfrac12]`, has the floor
:math:`v - c`): where there is none, the subset standard error is 0 while the estimate is the
difference of the tangents' flip probabilities, and ``compute`` says so, with the rule of three's
bound (also for ``"data"`` where its standard error is 0). Where they differ on
some copies but every per-example difference is the same (``"data"``), or the paired draws of
every example differ alike (``"subset"``), the standard error is 0 as well, and the interval a
point: ``compute`` says so too, once per pair (not with the control variate, whose adjusted
values of a linear model are exact).

On one example the ``"data"`` standard errors are NaN, the differences' as much as each model's
(one :math:`d_e` has no spread): ``compute`` says so, once per comparison, and gives the paired
``"subset"`` ones of that example (``stderr_subset``). With ``estimand="subset"`` an example
of a single unit of draws (``mode="whole", repeats=1``, one antithetic pair, ``num_tokens=1``,
an example of one real token at one draw per token) leaves the paired standard errors NaN as
each model's: ``compute`` says that too, once per comparison. Where the two models of a pair
count flips of a different number of examples whose clean class is a tie (flipped about half
the time at any sigma), it says, once per pair, that the difference carries those tie-breaks.

Models must share the token layout (same tokens per example, same token size, same device),
otherwise the copies could not be the same; a model with another layout is refused. Adaptive
stopping (``target_stderr``) and ``shard`` are refused: each model would stop after its own
number of rounds, and sharded states are not paired.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations
from types import FunctionType
from typing import Any

import torch
from torch import Tensor, nn

from .._stack import user_level
from ..tokens.base import DtypeClash, Inputs, Tokenization, check_device, model_dtype
from ._noise import NoiseStream
from ._stats import (
    SensitivityResult,
    State,
    accumulate,
    all_reduced,
    interval,
    merged,
    no_data_stderr,
    one_example_warning,
    one_unit_warning,
    result,
    subset_dof,
)
from .outputs import OUTPUT_KINDS, declared_kind
from .tokenwise import (
    TokenSensitivity,
    _lock,
    _one_measurement_at_a_time,
    _one_thread_at_a_time,
)

__all__ = ["CompareSensitivity", "ComparisonResult", "Difference", "compare_sensitivity"]


@dataclass(frozen=True)
class Difference:
    """The difference ``a − b`` of two models' sensitivities.

    ``stderr``/``ci95`` are paired (common random numbers) for ``estimand``; ``stderr_subset``
    is always the paired fixed-subset one; ``stderr_unpaired`` is
    :math:`\\sqrt{\\operatorname{se}_a^2 + \\operatorname{se}_b^2}`, what two independent
    measurements would give. ``per_sample``: the per-example differences :math:`d_e`.
    """

    a: str
    b: str
    estimate: float
    stderr: float
    ci95: tuple[float, float]
    estimand: str
    stderr_subset: float
    stderr_unpaired: float
    per_sample: Tensor

    def __str__(self) -> str:
        lo, hi = self.ci95
        return (
            f"{self.a} − {self.b}: {self.estimate:+.4f} ± {self.stderr:.4f} paired "
            f"(95% CI {lo:+.4f}–{hi:+.4f}; unpaired ± {self.stderr_unpaired:.4f}, {self.estimand})"
        )

    def __float__(self) -> float:
        return self.estimate

    def negated(self) -> Difference:
        """The same comparison as ``b − a``."""
        lo, hi = self.ci95
        return Difference(
            a=self.b, b=self.a, estimate=-self.estimate, stderr=self.stderr, ci95=(-hi, -lo),
            estimand=self.estimand, stderr_subset=self.stderr_subset,
            stderr_unpaired=self.stderr_unpaired, per_sample=-self.per_sample,
        )


@dataclass(frozen=True)
class ComparisonResult:
    """What a paired comparison returns: each model's :class:`SensitivityResult` (``results``,
    in the order given) and every pairwise :class:`Difference` (``differences``, keyed
    ``(a, b)`` for ``a`` before ``b``; :meth:`difference` gives either order)."""

    results: dict[str, SensitivityResult]
    differences: dict[tuple[str, str], Difference]
    estimand: str

    def difference(self, a: str, b: str) -> Difference:
        """The difference ``a − b`` (either order)."""
        if (a, b) in self.differences:
            return self.differences[a, b]
        if (b, a) in self.differences:
            return self.differences[b, a].negated()
        raise KeyError(f"no comparison of {a!r} and {b!r}; models: {list(self.results)}")

    def __str__(self) -> str:
        lines = [f"{name}: {r}" for name, r in self.results.items()]
        return "\n".join(lines + [str(d) for d in self.differences.values()])


class _Paired(TokenSensitivity):
    """One model's pass: keeps its batch instead of adding it, until every model has run."""

    pending: tuple[Any, ...] | None = None
    layout: tuple[int, torch.device] | None = None

    def _add(self, *batch: Any) -> None:
        self._judge_rounding()  # while its bound is held: the deferred add comes after
        self.pending = batch

    def _rng(self, device: torch.device, row: int) -> NoiseStream:
        self.layout = (row, device)  # the noise rows' length and device
        return super()._rng(device, row)

    def commit(self) -> None:
        assert self.pending is not None
        TokenSensitivity._add(self, *self.pending)
        self.pending = None


def _snapshot(m: _Paired) -> tuple[Any, ...]:
    """The random stream's position: generator state and buffered rows (copied: the runner
    scales the rows it takes in place)."""
    gen = None if m.generator is None else m.generator.get_state()
    s = m._stream
    return gen, None if s is None else (s.row, s.buf.clone(), s.device)


def _restore(m: _Paired, snap: tuple[Any, ...]) -> None:
    """Put ``m``'s random stream at the position ``snap`` (taken from any model's metric)."""
    gen, stream = snap
    m._stream = None
    if gen is None:
        if m._seed is not None:
            m.generator = None  # made again, from the seed, on the first update
        return
    assert m.generator is not None
    m.generator.set_state(gen)
    if stream is not None:
        row, buf, device = stream
        m._stream = NoiseStream(m.generator, row, device)
        m._stream.buf = buf.clone()


def _reported_nan(diffs: list[Difference]) -> str:
    """``diffs`` named with their estimates, as reported ``± nan`` (a warning's subject)."""
    what = ", ".join(f"{d.a} − {d.b} = {d.estimate:+.4f}" for d in diffs)
    return (f"the paired difference {what} is" if len(diffs) == 1
            else f"the paired differences {what} are") + " reported ± nan"


class CompareSensitivity:
    """Accumulating paired comparison (``update``/``compute``/``reset``/``merge``/
    ``all_reduce``); see the module docstring for the formulas.

    Under ``torchrun`` each rank measures its own batches (with its own seed) and
    :meth:`all_reduce` sums every model's state and every paired difference's: the estimates,
    differences and paired standard errors of all ranks' examples, as one process that
    measured them all. Reducing each model's metric alone (``metrics[name].all_reduce()``)
    left the paired states one rank's (the standard error of its examples for a difference of
    all of them); :meth:`compute` refuses that mix.

    Args:
        models: a dict ``{name: model}`` of at least two models that read the same tokens,
            each a different object (one object under two names would be compared with itself:
            a difference of exactly 0 ± 0; refused).
        tokens: the tokenization (as for :class:`~senslab.measure.TokenSensitivity`; default:
            each model's ``default_tokens()``).
        **options: every option of :class:`~senslab.measure.TokenSensitivity` except
            ``target_stderr``/``max_forward`` and ``shard``; the same for all models. A
            ``torch.Generator`` is cloned per model (the first model advances the one given).
            Models read in different ways declare it each (an attribute ``output_kind``); an
            ``output_kind=`` option other than a model's own is refused. A model's refusal
            names the model, and so do its warnings (of ``update`` as of ``compute``).

    Example:
        >>> import torch
        >>> from senslab.measure import CompareSensitivity
        >>> from senslab.tokens import Sequence
        >>> _ = torch.manual_seed(0)
        >>> one, two = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
        >>> models = {"one": lambda x: one(x).sum((1, 2)),
        ...           "two": lambda x: two(x).sum((1, 2))}
        >>> metric = CompareSensitivity(models, Sequence(), sigma=1.0, repeats=2)
        >>> for batch in torch.randn(3, 16, 5, 4):
        ...     metric.update(batch)
        >>> r = metric.compute()
        >>> d = r.difference("one", "two")
        >>> d.estimate == r.results["one"].estimate - r.results["two"].estimate
        True
    """

    def __init__(
        self, models: Mapping[str, nn.Module | Any], tokens: Tokenization | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(models, Mapping):
            raise TypeError(
                f"models must be a dict {{name: model}}, got {type(models).__name__}; "
                "e.g. compare_sensitivity({'base': model_a, 'regularized': model_b}, inputs, ...)"
            )
        if len(models) < 2:
            raise ValueError(
                f"a comparison needs at least two models, got {len(models)}; for one model use "
                "token_sensitivity / TokenSensitivity"
            )
        for name in models:
            if not isinstance(name, str):
                raise TypeError(f"model names must be str, got {name!r} ({type(name).__name__})")
        for bad in ("target_stderr", "max_forward"):
            if options.get(bad) is not None:
                raise ValueError(
                    f"{bad} (adaptive stopping) is not available in a paired comparison: each "
                    "model would stop after its own number of rounds, so the noise draws would "
                    "no longer be paired; give a fixed repeats= instead"
                )
        if options.get("allocation") is not None:
            raise ValueError(
                "allocation is not available in a paired comparison: each model would spread "
                "its draws by its own flip probabilities, so the draws would no longer be "
                "paired; give a fixed repeats= instead"
            )
        if options.get("shard") is not None:
            raise ValueError("shard is not available in a paired comparison; measure all examples")
        _refuse_one_model_twice(models)  # after the options' refusals, which say more
        _refuse_overridden_kinds(models, options.get("output_kind"))
        generator = options.pop("generator", None)
        self.metrics: dict[str, _Paired] = {}
        for i, (name, model) in enumerate(models.items()):
            gen = generator
            if isinstance(generator, torch.Generator) and i > 0:
                gen = torch.Generator(device=generator.device)
                gen.set_state(generator.get_state())
            try:
                self.metrics[name] = _Paired(model, tokens, generator=gen, **options)
            except (ValueError, TypeError) as err:
                raise _named(err, name) from err
        first = next(iter(self.metrics.values()))
        self.estimand, self.align = first.estimand, first.align
        self.pairs = list(combinations(self.metrics, 2))
        #: the pairs this comparison has warned of (:meth:`_warn_no_disagreement`), kept by reset
        self._said: set[tuple[str, str]] = set()
        #: whether this comparison has said that its differences' data standard errors are NaN
        #: for one example (:meth:`_warn_one_example`), kept by reset
        self._said_one_example = False
        #: whether this comparison has said that its differences' fixed-subset standard
        #: errors are NaN for a single unit of draws (:meth:`_warn_one_unit`), kept by reset
        self._said_one_unit = False
        #: the pairs this comparison has said tie-breaks of (:meth:`_warn_ties`), kept by reset
        self._said_ties: set[tuple[str, str]] = set()
        #: the pairs this comparison has said a standard error of no spread of
        #: (:meth:`_warn_no_spread`), kept by reset
        self._said_no_spread: set[tuple[str, str]] = set()
        self.reset()

    @_one_thread_at_a_time
    def reset(self) -> None:
        """Forget all accumulated examples (the random stream continues)."""
        for m in self.metrics.values():
            m.reset()
        self.paired = {pair: State() for pair in self.pairs}
        #: this process's own paired states beside the totals of :meth:`all_reduce` (None
        #: before it): what a later ``update`` adds to and another ``all_reduce`` sums again
        self._paired_local: dict[tuple[str, str], State] | None = None

    def merge(self, other: CompareSensitivity) -> CompareSensitivity:
        """Add ``other``'s accumulated state (same model names, in the same order, and
        options) to this one; a model object that has another name there is refused.

        Refused, before anything is added, where a model's metric would be
        (:meth:`TokenSensitivity.merge <senslab.measure.TokenSensitivity.merge>`): other
        options, a comparison merged into itself or merged twice, a copy made after it
        measured merged back. The models' warnings (two comparisons that drew the same noise)
        name the model and are said once everything is merged, so a warning the filters make
        an error leaves the comparison whole."""
        if not isinstance(other, CompareSensitivity):
            raise TypeError(f"can only merge a CompareSensitivity, got {type(other).__name__}")
        if list(other.metrics) != list(self.metrics):
            if set(other.metrics) == set(self.metrics):
                raise ValueError(
                    f"cannot merge: the comparisons name the same models in another order, "
                    f"{list(self.metrics)} vs {list(other.metrics)}, and their differences "
                    "are kept as first − second of that order; build both with the models in "
                    "one order"
                )
            raise ValueError(
                f"cannot merge comparisons of different models: {list(self.metrics)} vs "
                f"{list(other.metrics)}"
            )
        # the states hold the same sums whatever the estimand, so the merge went through and
        # reported this comparison's standard errors for a comparison built to report the other
        if other.estimand != self.estimand:
            raise ValueError(
                f"cannot merge: this comparison reports estimand={self.estimand!r} but the "
                f"other estimand={other.estimand!r}, and the merged one would report the "
                f"standard errors of estimand={self.estimand!r} for both; build both with the same "
                "estimand= (\"data\": the examples are a sample; \"subset\": these examples "
                "fixed, only the noise random)"
            )
        # one model object under two names (names swapped between the comparisons): the
        # merged results and differences would mix both models, a − b added to b − a
        mine = {id(m.model): name for name, m in self.metrics.items()}
        for name, m in other.metrics.items():
            here = mine.get(id(m.model), name)
            if here != name:
                raise ValueError(
                    f"cannot merge: the model named {name!r} in the other comparison is the "
                    f"one named {here!r} in this one, so the merged {name!r} would mix two "
                    "models and their difference would add a − b to b − a; give every model "
                    "the same name in both comparisons"
                )
        # the models' warnings (the shared noise of two default seeds) are said once every
        # state is merged: one that the filters make an error, said after the first model's
        # merge, had left the others unmerged, and compute() refused the comparison for good
        with _both(self, other), _NamedWarnings(None):
            for what, held in (("this comparison", self), ("the other comparison", other)):
                if held._paired_local is not None:
                    raise ValueError(
                        f"cannot merge: {what} holds the total of an all_reduce, which would "
                        "be counted again; merge the processes' own comparisons, or "
                        "all_reduce alone"
                    )
            for name, m in self.metrics.items():  # every refusal before anything is added
                theirs = other.metrics[name]
                m._refuse_other(theirs)
                m._refuse_repeat(theirs._local is not None, theirs._held_ids())
            for name, m in self.metrics.items():
                with _NamedWarnings(name):
                    m.merge(other.metrics[name])
            for pair in self.pairs:
                self.paired[pair] = merged(self.paired[pair], other.paired[pair], self.align)
        return self

    @_one_thread_at_a_time
    def all_reduce(self, group: Any = None) -> CompareSensitivity:
        """Sum every model's state and every paired difference's state over all processes of
        ``torch.distributed`` (every rank then holds the total, as one process that measured
        every rank's batches would: the estimates, the differences and their paired standard
        errors). Each rank keeps its own states beside the totals: a later ``update`` adds to
        its own, and another ``all_reduce`` (an interim value, then the final one) sums the
        ranks' own states again, never a total twice; :meth:`merge` refuses a comparison that
        holds a total.

        Refused with a ValueError (on every rank alike, before anything is summed) where the
        ranks compare other models (names, in order) or measure with other options, as
        :meth:`TokenSensitivity.all_reduce <senslab.measure.TokenSensitivity.all_reduce>`
        refuses. Reducing each model's metric alone (``metrics[name].all_reduce()``) leaves
        the paired states this rank's, and :meth:`compute` refuses that mix."""
        import torch.distributed as dist

        names = list(self.metrics)
        infos: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(infos, names, group=group)
        for r, theirs in enumerate(infos):
            if theirs != names:
                raise ValueError(
                    f"cannot all_reduce: rank {dist.get_rank(group)} compares the models "
                    f"{names} but rank {r} {theirs}; their sum would mix other models' "
                    "differences. Build every rank's comparison with the same names, in the "
                    "same order"
                )
        before = {name: (m.state, m._local) for name, m in self.metrics.items()}
        held = self.paired
        local = held if self._paired_local is None else self._paired_local
        try:
            for name, m in self.metrics.items():
                try:
                    with _NamedWarnings(name):
                        m.all_reduce(group)
                except ValueError as err:
                    raise _named(err, name) from err
            self.paired = {pair: all_reduced(local[pair], self.align, group)
                           for pair in self.pairs}
        except BaseException:
            for name, m in self.metrics.items():
                m.state, m._local = before[name]
            self.paired = held
            raise
        self._paired_local = local
        return self

    @_one_measurement_at_a_time
    def update(self, inputs: Inputs, mask: Tensor | None = None) -> None:
        """Measure one batch with every model on the same perturbed copies. Nothing is added
        (and the random stream does not move) unless every model measured the batch.

        Calls from several threads run one at a time (a lock per comparison; two at once
        restored each other's noise stream mid-batch and failed with a false "do not share
        the token layout"); which batch draws which noise then follows the scheduling."""
        metrics = list(self.metrics.items())
        devices = {name: check_device(m.model, inputs) for name, m in metrics}
        if len(set(devices.values())) > 1:
            raise ValueError(
                f"the models live on different devices {devices}: a paired comparison draws "
                "the same noise for each, which needs one device; move them to one"
            )
        start = _snapshot(metrics[0][1])
        # checked before, and the model they were checked on: a model swapped in since
        # (``metric.metrics[name].model = other``) has them cleared by its update, and a failed
        # one must not hand it the old model's back (its retry skipped the check that had just
        # refused it: an MC-dropout model read 0.375 for 0.109); with the old model put back as
        # the one they belong to, the next update checks the new one as a fresh metric would
        verified = {name: (set(m._verified), set(m._batch_checked), m._caches_for)
                    for name, m in metrics}
        # a model that measured the batch before another failed counted it (a run at full
        # width) in its own update, which succeeded: put back, as its own failed update would
        untrimmed = {name: m.untrimmed_batches for name, m in metrics}
        # after all_reduce, a model's update swaps its total for its own state: a model that
        # measured the batch before another failed gets its total back
        states = {name: (m.state, m._local) for name, m in metrics}
        try:
            for name, m in metrics:
                _restore(m, start)
                m.pending = m.layout = None
                try:
                    with _NamedWarnings(name):
                        m.update(inputs, mask)
                except DtypeClash as err:
                    raise DtypeClash(
                        f"model {name!r}: {err}. The models of a comparison share one input "
                        "tensor, so converting it would break the others: give this model a "
                        f"wrapper that converts its inputs, e.g. lambda z: model(z.to("
                        f"{model_dtype(m.model)})) (the noise is then added in the inputs' "
                        "dtype)") from err
                except (ValueError, TypeError, FloatingPointError, RuntimeError) as err:
                    named = _named(err, name)
                    if named is err:  # a class of its own (out of memory, say): kept as it is
                        raise
                    raise named from err
                self._check_layout(metrics[0], (name, m))
        except BaseException:
            for name, m in metrics:
                _restore(m, start)
                m.pending = None
                # the next update checks as a fresh one would
                m._verified, m._batch_checked, m._caches_for = verified[name]
                m.untrimmed_batches = untrimmed[name]
                m.state, m._local = states[name]
            raise
        batches = {name: m.pending for name, m in metrics}
        for _, m in metrics:
            m.commit()
        first = metrics[0][1]
        if self._paired_local is not None:  # after all_reduce: the batch adds to its own states
            self.paired, self._paired_local = self._paired_local, None
        for a, b in self.pairs:
            va, src, tok, valid, per_cell, *_ = batches[a]  # type: ignore[misc]
            vb = batches[b][0]  # type: ignore[index]
            accumulate(self.paired[a, b], va - vb, src, tok, valid, group=first.group,
                       per_cell=per_cell, positions=None,
                       events=None if first.control_variate is None else _misses_differ(va, vb),
                       ties=_tied_in_one(batches[a], batches[b]))

    @staticmethod
    def _check_layout(one: tuple[str, _Paired], other: tuple[str, _Paired]) -> None:
        (na, a), (nb, b) = one, other
        if b is a:
            return
        assert a.pending is not None and b.pending is not None
        va, vb = a.pending[3], b.pending[3]  # valid (B, T)
        same = a.layout == b.layout and va.shape == vb.shape and torch.equal(va, vb)
        plans = zip(a.pending[1:3], b.pending[1:3], strict=True)  # (src, tok) of every copy
        same = same and all(torch.equal(x, y) for x, y in plans)
        if not same:
            def describe(name: str, m: _Paired, valid: Tensor) -> str:
                t = valid.shape[1]
                row = m.layout[0] if m.layout else 0
                dim = row if m.mode == "token" else row // max(t, 1)
                return f"{name!r}: {t} tokens of {dim} entries ({int(valid.sum())} real)"

            raise ValueError(
                "the models do not share the token layout — "
                f"{describe(na, a, va)} vs {describe(nb, b, vb)}; a paired comparison feeds the "
                "same perturbed copies to every model, so they must read the same tokens "
                "(same tokenization, token size and padding)"
            )

    def _dof(self, st: State) -> float:
        """The degrees of freedom of a paired difference's subset interval: Student's t on the
        Satterthwaite ones for distances (:func:`._stats.subset_dof`), whose 1.96 covered short
        of 95% on few draws; the normal's (inf) for class flips, as for one model."""
        first = next(iter(self.metrics.values()))
        return math.inf if first.compare == "class" else subset_dof(st)

    @_one_thread_at_a_time
    def compute(self) -> ComparisonResult:
        """Each model's estimate and every pairwise paired difference since :meth:`reset`.

        Refused where a model's metric holds other examples than the paired states (one
        model's metric all-reduced or merged alone: the differences' standard errors would be
        another set of examples' than their estimates)."""
        self._refuse_unpaired()
        results = {name: self._named_compute(name, m) for name, m in self.metrics.items()}
        diffs = {}
        for a, b in self.pairs:
            r = result(self.paired[a, b], self.estimand, self.align, False, None)
            ra, rb = results[a], results[b]
            est = ra.estimate - rb.estimate
            se = r.stderr
            lo, hi = interval(est, se, self.estimand, r.num_examples, False,
                              self._dof(self.paired[a, b]))
            diffs[a, b] = Difference(
                a=a, b=b, estimate=est, stderr=se, ci95=(lo, hi),
                estimand=self.estimand, stderr_subset=r.stderr_subset,
                stderr_unpaired=math.sqrt(ra.stderr**2 + rb.stderr**2), per_sample=r.per_sample,
            )
        self._warn_one_example(list(diffs.values()))
        self._warn_one_unit(list(diffs.values()))
        for d in diffs.values():
            self._warn_ties(d)
            self._warn_no_disagreement(d)
        return ComparisonResult(results=results, differences=diffs, estimand=self.estimand)

    def _refuse_unpaired(self) -> None:
        """Raise where a model's metric counts other examples than the paired states: its
        ``all_reduce`` (or ``merge``) called alone. Two ranks of 6 examples each, every
        metric all-reduced by hand, read ``a − b`` as the 12 examples' difference with the
        paired standard error of one rank's 6 (0.115 for the 12's 0.067)."""
        paired = self.paired[self.pairs[0]].n
        counts = {name: m.state.n for name, m in self.metrics.items()}
        if any(n != paired for n in counts.values()):
            held = ", ".join(f"{name!r}: {n:,}" for name, n in counts.items())
            raise ValueError(
                f"the models' metrics hold other examples ({held}) than the paired "
                f"differences ({paired:,}): a model's metric was all-reduced or merged alone, "
                "and the differences' standard errors would be another set of examples' than "
                "their estimates. Call all_reduce() (or merge()) on the comparison, which "
                "sums every model's state and every paired one"
            )

    @staticmethod
    def _named_compute(name: str, m: _Paired) -> SensitivityResult:
        """``m.compute()``, its warnings said with the model's name: a comparison computes
        several models, often of one class, and "the standard error rests on no flip: none of
        the 128 perturbed copies…" said nothing of which model it meant."""
        with _NamedWarnings(name):
            return m.compute()

    def _warn_one_example(self, diffs: list[Difference]) -> None:
        """Say, once per comparison, why the paired data standard errors of one example are
        NaN, and give the paired fixed-subset ones of that example
        (:func:`._stats.one_example_warning`); each model's own is said by its metric. Without
        it ``a − b: -0.0625 ± nan paired (95% CI +nan–+nan; unpaired ± nan, data)`` came with
        no word of the reason."""
        if not diffs or not no_data_stderr(self.estimand, self.paired[diffs[0].a,
                                                                        diffs[0].b].n):
            return
        if getattr(self, "_said_one_example", False):  # a comparison pickled without it
            return
        self._said_one_example = True
        what = _reported_nan(diffs)
        subset = None
        if all(math.isfinite(d.stderr_subset) for d in diffs):
            subset = ", ".join(
                f"{d.a} − {d.b} ± {d.stderr_subset:.2g} (95% CI {lo:+.4g}–{hi:+.4g})"
                for d in diffs
                for lo, hi in [interval(d.estimate, d.stderr_subset, "subset", 1, False,
                                        self._dof(self.paired[d.a, d.b]))])
        warnings.warn(
            one_example_warning(what, subset, rates="per-example differences",
                                subject="the paired standard error")
            + " (said once per comparison)", RuntimeWarning, stacklevel=user_level())

    def _warn_one_unit(self, diffs: list[Difference]) -> None:
        """Say, once per comparison, why the paired fixed-subset standard errors asked for
        (``estimand="subset"``) are NaN: an example had a single unit of noise draws
        (:func:`._stats.one_unit_warning`, the wording each model's metric says its own NaN
        with). Each model's warning names the unit and the draws that give two (the models are
        measured on the same copies, so the same draws make every standard error finite);
        this one says it of the differences. Without it ``a − b: +0.0312 ± nan paired (95% CI
        +nan–+nan; unpaired ± nan, subset)`` (``mode="whole", repeats=1``; one antithetic
        pair; ``num_tokens=1``; an example of one real token) came with no word of its own."""
        nan = [d for d in diffs if d.estimand == "subset" and math.isnan(d.stderr)]
        if not nan or getattr(self, "_said_one_unit", False):  # a comparison pickled without it
            return
        self._said_one_unit = True
        what = _reported_nan(nan)
        st = self.paired[nan[0].a, nan[0].b]  # one plan: every pair's units are the same
        names = ", ".join(repr(name) for name in self.metrics)
        warnings.warn(
            one_unit_warning(
                what, st.single, st.n,
                unit="a unit of the copies every model was measured on, named in each model's "
                f"warning ({names})",
                fix="the draws each model's warning of a single unit names, which make every "
                "model's standard error and every paired one finite (the models see the same "
                "copies)",
                rates="per-example differences", subject="the paired standard error")
            + " (said once per comparison)", RuntimeWarning, stacklevel=user_level())

    def _warn_ties(self, d: Difference) -> None:
        """Say, once per pair, that the difference ``a − b`` carries tie-breaks where the two
        models count flips of a different number of tied examples (clean class a tie: two
        equal top outputs, one column exactly on its boundary), whose flips come at any sigma,
        however small, about half the time. Each model's metric says its own ties
        (:meth:`TokenSensitivity._warn_ties <senslab.measure.TokenSensitivity._warn_ties>`,
        named by the comparison), but not what they make of a difference: a bias-free head
        on 5 blank examples of 32 against a model with a bias read ``a − b: +0.1224 ± 0.0513
        paired (95% CI +0.0178–+0.2270)``, every flip of it the tied examples' — a
        "significant" difference that is the tie-break's, not the models'. The share each
        model's tied examples make of its sensitivity is their summed rates over all examples
        (the state's ``tie_rates``, merged and all-reduced with it).

        Said where the examples differ, not only their numbers: the pair's paired state counts
        the examples tied in one model and not the other (``ties``) and sums their per-example
        differences (``tie_rates``). Comparing the numbers alone, a bias-free 10-class head tied
        on one blank example of 8 against a 2-class head tied on another (one tie each) read
        ``a − b: +0.0625 ± 0.0110 paired (95% CI +0.0408–+0.0842; subset)`` at sigma 1e-3,
        every flip of it a tie-break, and said nothing of the difference."""
        sa, sb = self.metrics[d.a].state, self.metrics[d.b].state
        st = self.paired[d.a, d.b]
        if not sa.n or not (st.ties or sa.ties != sb.ties):
            return
        if not self._first_for_pair("_said_ties", d):
            return
        n = sa.n

        def share(name: str, st: State) -> str:
            if not st.ties:
                return f"of {name!r} (none tie)"
            return (f"of {name!r} ({st.ties:,} of the {n:,} examples tie; their flips make "
                    f"{st.tie_rates / n:.4f} of its sensitivity)")

        apart = ""
        if st.ties:  # a comparison pickled before these were counted has none
            apart = (f" ({st.ties:,} of the {n:,} examples tie in one model and not the other; "
                     f"their per-example differences make {st.tie_rates / n:+.4f} of the "
                     "difference)")
        warnings.warn(
            f"the paired difference counts flips of examples whose clean class is a tie in one "
            f"model and not in the other: {d.a} − {d.b} = {d.estimate:+.4f} "
            f"({d.estimand}) carries the tie-breaks {share(d.a, sa)} and "
            f"{share(d.b, sb)}{apart}; each model's warning says its own. A tied example flips "
            "about half the time at any sigma, however small, so the part of the difference "
            "they make is the tie-break's, not a difference in the models' sensitivity to the "
            "noise. Drop the examples that tie in either model (their clean outputs show them: "
            "the top two columns equal, or one column exactly on its boundary) and compare "
            "again (said once per pair)", UserWarning, stacklevel=user_level())

    def _first_for_pair(self, kind: str, d: Difference) -> bool:
        """Whether the warning ``kind`` (the attribute holding the pairs it was said of) is
        said of ``d``'s pair for the first time, recording it (a comparison pickled without
        the attribute starts it)."""
        said = self.__dict__.setdefault(kind, set())
        if (d.a, d.b) in said:
            return False
        said.add((d.a, d.b))
        return True

    def _warn_no_disagreement(self, d: Difference) -> None:
        """Warn, once per pair, where the two models measured the same value on every copy:
        their differences are all 0, so the paired standard error is 0 and the 95% interval
        [0, 0], which reads "no difference, known exactly" where only no disagreement was seen.
        Two linear classifiers whose biases differ by 0.02 (about 0.2% of the copies disagree)
        gave ``+0.0000 ± 0.0000`` in 76% of 400 runs of 8 examples, each model with 12 flips
        and no warning, and those intervals covered the true difference in none of them. With
        the control variate too, where the adjusted values are the same on every copy: a model
        against its deepcopy read ``+0.0000 ± 0.0000 paired (95% CI +0.0000–+0.0000)`` without
        a word. And with the control variate where the two models' flips differ otherwise than
        their tangents' on no copy (:func:`_misses_differ`; their adjusted values differ by the
        tangents' probabilities alone, the same on every draw of a token), whose subset
        standard error is then 0: two 3-class linear heads whose biases differ by 0.02 (8
        examples of 4 tokens, repeats=4) read ``+0.0020 ± 0.0000`` so in 319 of 400 runs, none
        covering the exact difference (coverage 0.20 in all; the runs with 1–9 such copies
        covered in 97.5%), with only each model's own warning. The data standard error, the
        spread of the examples' differences, is left unsaid there unless it is 0 too."""
        st = self.paired[d.a, d.b]
        first = next(iter(self.metrics.values()))
        if not st.copies:
            return
        cv = first.control_variate is not None
        se, (lo, hi), estimand = d.stderr, d.ci95, d.estimand
        if no_data_stderr(d.estimand, st.n):  # NaN: said the subset one, as it is
            se, estimand = d.stderr_subset, "subset; the data one needs two examples"
            lo, hi = interval(d.estimate, se, "subset", st.n, False)
        # with the control variate the events are the copies whose flips differ otherwise
        # than the tangents' (:func:`_misses_differ`): the subset standard error is their
        # spread alone, the data one the examples' (their tangents' probabilities differ)
        if cv and estimand == "data" and not (math.isfinite(se) and se == 0):
            return
        if st.events:
            if not cv:
                self._warn_no_spread(d)
            return
        if not self._first_for_pair("_said", d):
            return
        n = st.copies
        if math.isnan(se):  # a single unit of draws (said apart): no ± 0 to explain
            shown = (f"{d.a} − {d.b} = {d.estimate:+.4f} (± nan, {estimand}: a single unit of "
                     "draws, said apart)")
        else:
            shown = (f"{d.a} − {d.b} = {d.estimate:+.4f} ± {se:.4f} (95% CI "
                     f"{lo:+.4f}–{hi:+.4f}, {estimand})")
        if cv and d.per_sample.any():  # the tangents' probabilities differ, the misses not
            warnings.warn(
                f"the paired standard error of {d.a!r} − {d.b!r} rests on no copy on which the "
                "two models' flips differ otherwise than their tangents' (control_variate): on "
                f"all {n:,} perturbed copies each model missed its tangent alike, so {shown} "
                "is the difference of the tangents' flip probabilities and says only that no "
                "such disagreement was seen, not that the difference is known that closely; "
                f"by the rule of three, the share of copies on which they differ so is below "
                f"3/{n:,} = {3 / n:.2g} with 95% confidence, and the estimate is off by at most "
                f"twice that share. Measure with more draws (repeats=, more examples) (said "
                "once per pair)", RuntimeWarning, stacklevel=user_level())
            return
        warnings.warn(
            f"the paired standard error of {d.a!r} − {d.b!r} rests on no copy on which the two "
            f"models differ: they measured the same value on all {n:,} perturbed copies, so "
            f"{shown} says only that no disagreement was seen, not that the difference "
            f"is known exactly; by the rule of three, the share of copies on which they differ "
            f"is below 3/{n:,} = {3 / n:.2g} with 95% confidence. If both names hold one model "
            "(a wrapper around the same module), pass the two models meant; otherwise measure "
            "with more draws (repeats=, more examples) (said once per pair)",
            RuntimeWarning, stacklevel=user_level())

    def _warn_no_spread(self, d: Difference) -> None:
        """Warn, once per pair, where the two models differ on some copies but the paired
        standard error is 0 all the same: every per-example difference is the same
        (``"data"``), or the paired draws differ alike within every example and token
        (``"subset"``), so the interval is a point, "the difference known exactly", from a
        spread that was not seen. Two linear classifiers (biases 0 and 0.15, 2 examples,
        repeats=4) differed on 4 of 32 copies, 2 in each example, and read ``a − b: -0.1250 ±
        0.0000 paired (95% CI -0.1250–-0.1250)`` without a word (13 of 600 such runs read a
        point), the unpaired error ± 0.22; neither model had few flips to warn of. Not with the
        control variate (its adjusted values of a linear model are exact, spread or none)."""
        st = self.paired[d.a, d.b]
        se, (lo, hi), estimand = d.stderr, d.ci95, d.estimand
        if no_data_stderr(d.estimand, st.n):  # NaN: said the subset one, as it is
            se, estimand = d.stderr_subset, "subset; the data one needs two examples"
            lo, hi = interval(d.estimate, se, "subset", st.n, False, self._dof(st))
        # 0, or rounding's remainder of a sum of squares of equal values (1/12: 7.6e-10)
        if not (math.isfinite(se) and se <= 1e-6 * abs(d.estimate)):
            return
        if not self._first_for_pair("_said_no_spread", d):
            return
        if estimand == "data":
            why = (f"every one of the {st.n:,} per-example differences is the same "
                   f"({d.per_sample[0].item():+.4g}), and the data standard error is their "
                   "spread")
            fix = "more examples (another update() adds them)"
        else:
            why = ("the paired draws of every example (and token) differ alike (the subset "
                   "standard error is the spread of the paired differences of an example's "
                   "draws)")
            fix = "more draws (repeats=)"
        warnings.warn(
            f"the paired standard error of {d.a!r} − {d.b!r} rests on no spread: the two models "
            f"differ on {st.events:,} of the {st.copies:,} perturbed copies, but {why}, so "
            f"{d.a} − {d.b} = {d.estimate:+.4f} ± {se:.4f} (95% CI {lo:+.4f}–{hi:+.4f}, "
            f"{estimand}) says only that no spread was seen, not that the difference is known "
            f"exactly. Measure with {fix} (said once per pair)",
            RuntimeWarning, stacklevel=user_level())


def _tied_in_one(one: tuple[Any, ...] | None, other: tuple[Any, ...] | None) -> Tensor | None:
    """(B,) bool on the host: the examples of a batch whose flips are tie-breaks in one of two
    models' pending batches (:class:`_Paired`; the 12th item the batch's tie counts) and not
    in the other, counted in the pair's paired state (``ties``, and their differences summed in
    ``tie_rates``) for :meth:`CompareSensitivity._warn_ties`; None where neither ties."""
    counts = [b[11] if b is not None and len(b) > 11 else None for b in (one, other)]
    said = [None if c is None else c.said for c in counts]
    if said[0] is None and said[1] is None:
        return None
    if said[0] is None or said[1] is None:
        return said[0] if said[1] is None else said[1]
    return said[0] ^ said[1]


def _misses_differ(va: Tensor, vb: Tensor) -> int:
    """With the control variate, the copies on which two models' flips differ otherwise than
    their tangents' (the events a paired standard error learns from): an adjusted value is
    v − c + q with q in [0, ½] (the clean margin is at least 0), so its floor is v − c, and
    the difference's random part is nonzero where the floors differ. Counting the nonzero
    differences v'_a − v'_b instead counted nearly every copy (their q differ)."""
    return int((va.floor() != vb.floor()).sum())


def _named(err: Exception, name: str) -> Exception:
    """``err`` with the name of the model it came from (and, for a decision-rule refusal, how
    to give this model its own rule); ``err`` itself for an exception class of its own, with
    the name as a note where Python takes notes (3.11+). A runtime error is named too: the
    models of a comparison often share a class, and a refusal such as "the model's output
    changed between two evaluations" would not say which of them it means."""
    if type(err) not in (ValueError, TypeError, FloatingPointError, RuntimeError):
        if hasattr(err, "add_note"):
            err.add_note(f"(raised while measuring model {name!r} of the comparison)")
        return err
    msg = f"model {name!r}: {err}"
    # not where output_kind is only one name of the list of options that an unknown option's
    # refusal ends with (a misspelt seed= was told to declare output_kind on the model)
    if "output_kind" in str(err).split(". The options are:")[0]:
        msg += (". The options of a comparison apply to every model; to read this model "
                "alone another way, declare it on the model (model.output_kind = "
                "'probabilities' or 'logits'; a function or lambda takes the attribute too) "
                "and drop output_kind=")
    return type(err)(msg)


class _NamedWarnings:
    """The warnings raised inside said with the name of the model they came from (a model's
    ``compute`` in :meth:`CompareSensitivity._named_compute`, its ``update``): an update's own
    ("padding-aware batching is off for this batch: … The model seems to read positions that
    the mask marks as padding") had said nothing of which of the models it meant. Warnings
    raised before an exception are said too, before it goes on (one that the filters make an
    error then gives way to the exception, as in :func:`senslab._stack.said_once`). A class,
    not a generator's context: its exit is senslab's frame, so the warnings point at the
    user's call (:func:`~senslab._stack.user_level`), not at contextlib."""

    def __init__(self, name: str | None) -> None:
        self.name = name  # None: said as they are, after the block (:meth:`merge`)

    def __enter__(self) -> None:
        self._catch = warnings.catch_warnings(record=True)
        self._caught = self._catch.__enter__()
        warnings.simplefilter("always")  # the metric says each cause once itself

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        self._catch.__exit__(kind, err, tb)
        for w in self._caught or []:
            try:
                said = w.message if self.name is None else f"model {self.name!r}: {w.message}"
                warnings.warn(str(said), w.category, stacklevel=user_level())
            except Warning:
                if kind is None:  # else an exception is on its way: it goes on
                    raise


def _refuse_one_model_twice(models: Mapping[str, Any]) -> None:
    """Refuse one model object under two names: it sees the same copies twice, so every
    difference of it with itself is exactly 0 with a standard error of 0 — "no difference,
    known exactly" — whatever the two names were meant to hold (a second checkpoint loaded into
    the same object, a name bound twice)."""
    seen: dict[int, str] = {}
    for name, model in models.items():
        first = seen.setdefault(id(model), name)
        if first != name:
            # copy.deepcopy returns a function (a lambda, a def) itself: refused again
            second = ("a second function that calls it (lambda x: model(x); copy.deepcopy "
                      "returns a function itself)" if isinstance(model, FunctionType)
                      else "copy.deepcopy(model)")
            raise ValueError(
                f"models {first!r} and {name!r} are the same object: a paired comparison of a "
                "model with itself reports a difference of exactly 0 with a standard error of 0 "
                "(every copy gives both the same value), which reads as 'no difference, known "
                "exactly'. Pass the two models meant (load the second checkpoint into a new "
                "model object); for a deliberate check of a model against itself, pass "
                f"{second} as the second"
            )


def _refuse_overridden_kinds(models: Mapping[str, Any], kind: str | None) -> None:
    """Refuse an ``output_kind`` option that overrides a model's own declared one: the option
    applies to every model of a comparison, so a model declaring another reading would be
    read the option's way (a sigmoid head read as logits never flips: a false 0)."""
    if kind not in OUTPUT_KINDS:  # None, or refused with its own message per model
        return
    for name, model in models.items():
        try:
            own = declared_kind(model, None)
        except ValueError as err:
            raise _named(err, name) from err
        if own is not None and own != kind:
            raise ValueError(
                f"output_kind={kind!r} applies to every model of a comparison, but model "
                f"{name!r} declares output_kind={own!r} and would be read as {kind!r}. Drop "
                "output_kind= and let each model declare its own reading (an attribute "
                "model.output_kind = 'logits' or 'probabilities'; a function or lambda takes "
                "it too)"
            )


@contextmanager
def _both(one: Any, other: Any) -> Iterator[None]:
    """The locks of two objects, always taken in one order (two threads merging ``a`` into
    ``b`` and ``b`` into ``a`` wait for each other instead of deadlocking)."""
    first, second = sorted((one, other), key=id)
    with _lock(first), _lock(second):
        yield


def compare_sensitivity(
    models: Mapping[str, nn.Module | Any],
    inputs: Inputs,
    tokens: Tokenization | None = None,
    *,
    mask: Tensor | None = None,
    **options: Any,
) -> ComparisonResult:
    """Paired token-wise sensitivities of several models on one batch (see the module
    docstring); equivalent to one :meth:`CompareSensitivity.update` and ``compute``.

    Example:
        >>> import torch
        >>> from senslab.measure import compare_sensitivity
        >>> from senslab.tokens import Patches
        >>> a = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
        >>> b = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
        >>> r = compare_sensitivity({"a": a, "b": b}, torch.randn(32, 3, 8, 8), Patches(4),
        ...                         sigma=0.1, repeats=2)
        >>> d = r.difference("a", "b")
        >>> d.ci95[0] <= d.estimate <= d.ci95[1]
        True
    """
    metric = CompareSensitivity(models, tokens, **options)
    metric.update(inputs, mask)
    return metric.compute()
