r"""Token-wise sensitivity as a ``torchmetrics.Metric`` (``pip install 'senslab[lightning]'``).

:class:`TokenSensitivityMetric` accumulates the same sums as
:class:`~senslab.measure.TokenSensitivity` — examples :math:`n`, :math:`\sum_b m_b`,
:math:`\sum_b m_b^2`, :math:`\sum_b \widehat{\operatorname{Var}}(\hat m_b)`, forward passes —
as torchmetrics states with ``dist_reduce_fx="sum"``, so torchmetrics (and Lightning, which
calls it) syncs them across processes; per-example rates and the per-position profile are
``"cat"`` states. ``compute()`` returns the estimate as a tensor; :meth:`result` the full
:class:`~senslab.measure.SensitivityResult` (standard errors, interval, counts, profiles).

**Distributed rule.** Under a ``DistributedSampler`` every process measures other examples.
Rank 0 draws exactly the noise one process would (the seed's own stream, so a one-process run is
unchanged); rank :math:`r > 0` draws from a 32-bit seed derived from ``(seed, r)``
(``numpy.random.SeedSequence``, :func:`rank_seed`). The synced result therefore

* is **exactly reproducible at a fixed world size** (same seed, sampler and batches: the same
  numbers, bit for bit), and
* **agrees with one process within the interval**: both estimate the same quantity with
  independent noise, so their difference has standard error
  :math:`\sqrt{s_1^2 + s_W^2}` (the ``stderr_subset`` of each; the examples are the same) and
  lies within 1.96 of it 95% of the time;

it does not equal one process bit for bit (noise keyed by the global example index would, at
the price of a new noise stream for every recorded experiment). For exact equality across world
sizes, give every process the *same* batches and use ``TokenSensitivity(shard=(rank, world))``
with ``all_reduce()`` (:mod:`senslab.measure.tokenwise`).

**Padding of the sampler.** ``DistributedSampler`` pads an uneven dataset by repeating its first
examples (7 examples on 2 processes: 8 indices, one twice). Pass each batch's global example
indices as ``index=`` and every example counts once: each ``update`` gathers the batch's indices
from all processes (one small ``all_gather``; every process must then call ``update`` equally
often, as a ``DistributedSampler`` arranges), and an index already measured — earlier, or in
this step by a lower rank — is skipped. ``per_sample`` is then ordered by index. Without
``index=`` repeats count twice (or use ``drop_last=True``, which drops examples instead).

Each process keeps the indices of every process (they are gathered at each ``update``). With
``persistent(True)`` the state dict holds them (``seen_index``, int64) beside the states, so an
index measured before a save is skipped after ``load_state_dict`` too; a state dict without them
(saved by an older senslab) takes them from the loaded ``sample_index``, this process's own.

**Per-step values.** ``forward`` (``metric(model, inputs)``) updates the states and returns the
batch's own estimate — this process's examples; with ``dist_sync_on_step=True`` that of the
step's examples on all processes together (:math:`\sum s_1 / \sum n` over the processes, one
small gather, so every process must call ``forward`` equally often), the same on every process.

**Random stream.** The noise stream continues over ``update`` calls and restarts from the seed
at :meth:`reset` (which torchmetrics and Lightning call between epochs): each period draws the
same noise, so changes between periods are the model's. A copy (``clone()``, ``copy.deepcopy``,
a pickle) leaves the model behind (``clone()`` and ``deepcopy`` keep the modules the tokens and
options hold as objects, ``output=model.head``, the model's own) but keeps where the stream
stands — the generator's state and the noise drawn but not used yet — so its next ``update``
draws what the original's next ``update`` with the same model would (a copy used by another
process starts from that process's seed instead: two processes must not draw the same noise).
The state dict does not hold the stream: loading states restarts it from the seed, so a metric
that had measured draws, after the load, what a fresh metric loaded with the same states would.
A copy calibrates checked precision (``precision="bf16-checked"``, …) anew, as the original does
for a new model.

**Threads.** ``update``, ``forward``, ``compute``, ``merge_state``, ``reset`` and the state dict
of one metric run one thread at a time (a lock per metric), so a metric updated from several
threads counts every batch once and gives a valid estimate; but which batch draws which noise
then follows the threads' scheduling, so the numbers are not reproducible. For reproducible
numbers give each thread its own metric (its own ``generator``) and ``merge_state`` them.

**Merging and loading.** :meth:`~TokenSensitivityMetric.merge_state` and ``load_state_dict``
refuse the states of a metric that measures another quantity — another noise level,
``compare`` rule, ``mode``, tokenization, ``replace_with`` vocabulary, decision rule or
alignment (what :meth:`TokenSensitivity.merge <senslab.measure.TokenSensitivity.merge>`
requires) — naming the first difference; the state dict holds this configuration
(``config``, JSON as a uint8 tensor) beside the states. A state dict without it (saved by an
older senslab, or built by hand) is loaded or merged unchecked, with a warning. An ``Embedding``
module given as the object matches one given by its dotted name once both metrics have measured
(each finds the name in its model); a state dict holds only the module's description, so there
the refusal says to build both metrics with the dotted name.

A merge that would count examples twice is refused: a metric merged into itself; states holding
an example index (``index=``) this metric has measured already; and, with or without
``index=``, the same metric (or its state dict) merged twice, a metric holding one merged
before, or a copy of this metric made after it measured. Every metric carries a random id and
the ids of the metrics whose examples its states hold, carried through merges, copies and the
state dict (``merged_ids``, a (k, 16) uint8 tensor); a copy (``clone()``, ``copy.deepcopy``, a
pickle) and a metric after ``reset`` get an id of their own, and a copy made before the metric
measured merges freely. A state dict without ``merged_ids`` (an older senslab) loads and merges
as before, unchecked for repeats. The sync across processes refuses, on every process, states
holding one metric's examples on two processes — one process's state dict loaded on every
process (a Lightning checkpoint holds rank 0's metric states only): summed, they counted once
per process, and the other processes' examples were missing.

With :class:`~senslab.tokens.Patches` the states hold the grid of patches the per-position
profile is over (``pos_grid``, a ``"cat"`` state: synced, merged and saved with the profile). A
batch of another image size than the states' (merged or loaded ones included, for any model),
``merge_state`` of states over another grid, and torchmetrics' sync of processes over two grids
(every process raises, before anything is synced) are refused, naming both grids, as
:class:`~senslab.measure.TokenSensitivity` refuses them; after ``reset`` any size is measured.
A state dict without ``pos_grid`` (an older senslab) loads and merges with its grid unknown.

Example:
    >>> import torch
    >>> from senslab.integrations.torchmetrics import TokenSensitivityMetric
    >>> from senslab.tokens import Patches
    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    >>> metric = TokenSensitivityMetric(Patches(2), sigma=0.5)
    >>> for batch in torch.randn(2, 8, 1, 4, 4):
    ...     metric.update(model, batch)
    >>> estimate = metric.compute()  # a tensor
    >>> metric.result().num_examples
    16
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import re
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

try:
    from torchmetrics import Metric, MetricCollection
    from torchmetrics.utilities import dim_zero_cat
    from torchmetrics.utilities.distributed import gather_all_tensors
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "senslab.integrations.torchmetrics needs torchmetrics: pip install 'senslab[lightning]'"
    ) from err

from .._exclusive import TurnLock, exclusive
from ..measure import SensitivityResult, TokenSensitivity
from ..measure._alloc import MIN_FLIPS
from ..measure._noise import NoiseStream
from ..measure._options import _identity
from ..measure._stats import State, result
from ..measure.tokenwise import Grid, _grid_mismatch, _ranks_grid_mismatch
from ..tokens import Sequence, Tokenization
from ..tokens.base import Inputs, batch_size, select
from ._common import Seed, _placeholder, check_options, float32_default

__all__ = ["TokenSensitivityMetric", "rank_seed"]

#: keyword arguments that go to ``torchmetrics.Metric`` itself
_METRIC_KWARGS = {
    "compute_on_cpu", "dist_sync_on_step", "process_group", "dist_sync_fn",
    "distributed_available_fn", "sync_on_compute", "compute_with_cache",
}
#: sum states and the fields of :class:`~senslab.measure._stats.State` they hold (``forward`` is
#: the Module's method, so the counts get longer names)
_SUMS = {"n": "n", "s1": "s1", "s2": "s2", "within": "within", "within_q": "within_q",
         "num_forward": "forward",
         "num_forward_fp32": "forward_fp32", "num_checked": "checked", "num_copies": "copies",
         "num_events": "events", "num_single": "single", "num_ties": "ties",
         "tie_rates": "tie_rates", "num_tie_flips": "tie_flips", "num_flips": "flips"}
#: the counts behind the warnings of few flips, of a single unit of draws and of tied clean
#: classes (``TokenSensitivity._warn_few_events``, ``_warn_one_unit``, ``_warn_ties``): NaN
#: where states without them (an older senslab's) hold examples — unknown, nothing said
_FLIPS = ("num_copies", "num_events", "num_single", "num_ties", "tie_rates", "num_tie_flips",
          "num_flips")
#: ``pos_grid``: the grid of patches the per-position profile is over, one (rows, columns,
#: patch size) a metric (a state, so it is synced, merged and saved with the profile; none for
#: other tokens and for ``mode="whole"``)
_CATS = ("sample_rate", "sample_index", "pos_id", "pos_sum", "pos_cnt", "pos_grid")
#: configuration fields the model decides where the options leave them open (None)
_MODEL_DECIDES = ("tokens", "align", "output_kind")
#: configuration fields an older senslab did not record: a state dict without them is checked
#: on the others
_RECORDED_LATER = ("autocast", "eval_mode")


class _Position(NamedTuple):
    """Where an engine's noise stream stands: the process (rank) it belongs to, its generator's
    state and device, and the rows of length ``row`` it has drawn but not handed out yet
    (``NoiseStream.buf``; None: no stream)."""

    rank: int
    state: Tensor
    device: torch.device
    row: int | None
    buffer: Tensor | None

    def restore(self) -> tuple[torch.Generator, NoiseStream | None]:
        generator = torch.Generator(device=self.device)
        generator.set_state(self.state)
        if self.row is None or self.buffer is None:
            return generator, None
        stream = NoiseStream(generator, self.row, self.buffer.device)
        stream.buf = self.buffer.clone()  # the noise is scaled in place where it is used
        return generator, stream


def rank_seed(seed: int, rank: int) -> int:
    """The seed of process ``rank``: ``seed`` itself on rank 0 (one process draws the usual
    stream), a 32-bit ``SeedSequence((seed, rank))`` draw on the others — 32 bits, as torch's
    CPU generator keeps no more of a seed (the token-wise estimator refuses a larger one there).
    It is the low half of the 64-bit draw this function gave before 2026-12-04, which a CPU
    generator read the same way: the same numbers on a CPU."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed % 2**64, rank]).generate_state(1, np.uint32)[0])


class TokenSensitivityMetric(Metric):
    """Token-wise Gaussian sensitivity as a ``torchmetrics.Metric`` (module docstring: the
    states, the distributed rule, the random stream).

    Args:
        tokens: a :class:`~senslab.tokens.Tokenization`; default ``model.default_tokens()``.
        generator: an int seed (default 0) or a ``torch.Generator`` (its state when the metric
            is built is the starting point every :meth:`reset` returns to).
        **options: :class:`~senslab.measure.TokenSensitivity`'s options (``sigma``,
            ``repeats``, ``estimand``, …; not ``shard``) and ``torchmetrics.Metric``'s
            (``process_group``, ``sync_on_compute``, …).

    ``update(model, inputs, mask=None, index=None)`` measures one batch; ``compute()`` returns
    the estimate (a float64 tensor), :meth:`result` everything; ``forward`` (calling the metric)
    updates and returns the batch's estimate, synced with ``dist_sync_on_step=True``.
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False

    def __init__(
        self, tokens: Tokenization | None = None, *, generator: torch.Generator | int | None = 0,
        **options: Any,
    ) -> None:
        base = {k: options.pop(k) for k in list(options) if k in _METRIC_KWARGS}
        super().__init__(**base)
        check_options(tokens, options, type(self).__name__)
        self.tokens, self.options, self.seed = tokens, options, Seed(generator)
        for name in _SUMS:
            self.add_state(name, torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        for name in _CATS:
            self.add_state(name, [], dist_reduce_fx="cat")
        self.set_dtype(torch.float64)  # a rank with no data syncs empty float64 lists
        #: what defines the quantity measured (``merge_state`` and ``load_state_dict`` check it)
        self._config = _config(tokens, options)
        #: a random id of this metric's own examples, and the ids of every metric whose
        #: examples the states hold (its own included): ``merge_state`` refuses a repeat
        self._id = uuid.uuid4().hex
        self._ids = {self._id}
        #: the process the id was drawn in: a metric inherited by forked processes (Lightning's
        #: ddp_fork, a fork-started pool) holds one id in each, and its first update there, on
        #: empty states, draws its own (the sync would take the examples for one metric's)
        self._id_pid = os.getpid()
        #: the examples the states held when this metric last wrote them (update, merge, load,
        #: reset): other examples there were put by someone else (:meth:`_foreign_states`)
        self._own_n: float | None = 0.0
        self._lock = TurnLock("this metric")
        self._serialize()
        self._engine: TokenSensitivity | None = None
        self._seen: set[int] = set()
        #: a copy's stream position, until its first ``update`` builds an engine from it
        self._resume: _Position | None = None
        self._batch: tuple[float, int] = (0.0, 0)  # the last update's sum of rates, examples
        #: the causes this metric's measurements warned of: said once, not again after a reset
        #: (each reset builds a new engine, which shares this set)
        self._said: set[str] = set()
        self._last: SensitivityResult | None = None
        #: the counts of the last :meth:`_result` (its warnings read them: :meth:`_warn_counted`)
        self._counts: State | None = None
        #: the estimate of the last batch ``forward`` measured (all processes' with
        #: ``dist_sync_on_step=True``)
        self.batch_estimate: float | None = None

    # -- torchmetrics interface ----------------------------------------------------------------
    def update(  # type: ignore[override]
        self, model: Any, inputs: Inputs, mask: Tensor | None = None, *,
        index: Tensor | list[int] | None = None,
    ) -> None:
        """Measure one batch of ``model`` and add it to the states.

        ``inputs`` and ``mask`` as for :meth:`TokenSensitivity.update`; ``index``: the global
        indices of the batch's examples (one per example) — repeats, within this process or
        across processes, are then measured once (module docstring, *Padding of the sampler*).
        An update that raises adds nothing and leaves its examples unmeasured: called again
        with them, it measures them. The noise is drawn in float32 also inside a step of a
        ``"bf16-true"`` or ``"16-true"`` Trainer (which sets the default dtype to the module's).
        """
        self.batch_estimate, self._batch = None, (0.0, 0)
        if getattr(self, "_id_pid", None) != os.getpid():  # forked: an id of this process's own
            if not float(self.n):
                self._id = uuid.uuid4().hex
                self._ids = {self._id}
            self._id_pid = os.getpid()
        b = batch_size(inputs)
        own: set[int] = getattr(self, "_own", set())  # the indices this process measured itself
        taken: set[int] = set()  # this batch's indices marked as measured (undone on failure)
        if index is not None:
            again = all(i in own for i in torch.as_tensor(index).flatten().tolist())
            keep = self._first_seen(index, b)
            idx = torch.as_tensor(index).flatten().long().cpu()[keep]
            taken = set(idx.tolist())
            self._own = own | taken
            if not keep.all():
                if not keep.any():
                    if again:  # not a sampler's padding (another process measured those)
                        self._warn_all_seen(b)
                    return
                rows = keep.nonzero().flatten()
                inputs = select(inputs, rows)
                mask = None if mask is None else mask[rows.to(mask.device)]
        try:
            engine = self._engine_for(model)
            engine.state = State()  # this batch alone; the engine keeps its stream and calibration
            # the grid of the states' profile (after a merge, a load, for a new model's engine):
            # the engine refuses a batch of another image size with its own message
            held = _one_grid(self.pos_grid, "this metric's")
            engine._grid = held
            with float32_default():
                engine.update(inputs, mask)
        except BaseException:
            # nothing was added: a retry of these examples must measure them, not skip them as
            # measured before (this process's own; other processes' marks stay as gathered)
            self._seen -= taken
            self._own = own
            raise
        st = engine.state
        dev = self.n.device
        for name, field in _SUMS.items():
            setattr(self, name, getattr(self, name) + float(getattr(st, field)))
        rates = torch.cat(st.samples).double()
        self.sample_rate.append(rates.to(dev))
        keys = idx.double() if index is not None else torch.full((st.n,), math.nan)
        self.sample_index.append(keys.to(dev, torch.float64))
        if held is None and engine._grid is not None:  # the first batch of patches
            self.pos_grid.append(torch.tensor(engine._grid, dtype=torch.float64, device=dev))
        p = len(st.pos_sum)
        if p:
            ids = torch.arange(-p, 0) if engine.align == "right" else torch.arange(p)
            self.pos_id.append(ids.to(dev, torch.float64))
            self.pos_sum.append(st.pos_sum.to(dev, torch.float64))
            self.pos_cnt.append(st.pos_cnt.to(dev, torch.float64))
        self.batch_estimate, self._batch = st.s1 / st.n, (st.s1, st.n)
        self._own_n = float(self.n)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:  # type: ignore[override]
        """``update`` and the batch's own estimate (the accumulated states keep growing; the
        random stream continues — torchmetrics' reset-and-restore would restart it). With
        ``dist_sync_on_step=True`` the estimate of the step's examples on all processes
        together, the same on each (every process must call ``forward`` equally often); NaN
        where no example was measured (all skipped by ``index=``)."""
        with exclusive(), self._lock:  # the measurements' lock first (senslab._exclusive)
            self.update(*args, **kwargs)
            s1, n = self._batch
            if self.dist_sync_on_step:
                s1, n = self._synced(s1, n)
            self.batch_estimate = s1 / n if n else None
            value = math.nan if self.batch_estimate is None else self.batch_estimate
            out = torch.tensor(value, dtype=torch.float64, device=self.n.device)
            # what Lightning logs for self.log(..., metric, on_step=True)
            self._forward_cache = out
            return out

    def compute(self) -> Tensor:
        """The estimate over everything accumulated (synced across processes by torchmetrics),
        a float64 tensor; :meth:`result` returns the full result of the same call. Warns, once
        per metric (not again after a reset), where the standard error rests on fewer than
        ``MIN_FLIPS`` flips, as :meth:`TokenSensitivity.compute
        <senslab.measure.TokenSensitivity.compute>` does; the counts are states, summed over
        processes and merges like the others."""
        self._last = self._result()
        self._warn_one_example(self._last)
        self._warn_counted(self._last)
        self._warn_few_events(self._last)
        self._warn_no_spread(self._last)
        return torch.tensor(self._last.estimate, dtype=torch.float64, device=self.n.device)

    @property
    def update_called(self) -> bool:
        """Whether ``update`` (or ``forward``) ran since the last reset, or the states hold
        examples merged or loaded into them: torchmetrics warns at ``compute`` where it is
        false, and after ``merge_state`` of other metrics into a fresh one (the thread recipe of
        the module docstring) or ``load_state_dict`` it warned that the states "have not yet
        been updated" while they held every merged example."""
        return self._update_count > 0 or bool(float(self.n))

    def result(self) -> SensitivityResult:
        """Estimate, standard errors, 95% interval, counts and profiles (synced)."""
        with self._lock:
            self.compute()
            assert self._last is not None
            return self._last

    def merge_state(self, incoming_state: Any) -> None:
        """Add another metric's states (or a state dict) to this one's; the next :meth:`compute`
        includes them (torchmetrics keeps an earlier ``compute``'s value otherwise), and the
        example indices it has seen (a state dict's ``seen_index``) count as seen here. Also
        with ``dist_sync_on_step=True``, which torchmetrics refuses for its own forward.

        Refused with a ValueError: this metric itself; states of another configuration (the
        first difference named; a state dict without ``config`` is merged unchecked, with a
        warning); states holding an example index (``index=``) this metric has measured
        already, or the examples of a metric merged here before (the same metric or state dict
        merged twice, a metric holding one merged before, a copy of this metric made after it
        measured: module docstring) — they would count twice; a per-position profile over
        another grid of patches (another image size), naming both grids."""
        if incoming_state is self:
            raise ValueError(
                "cannot merge a metric into itself: its examples would count twice (a smaller "
                "standard error from the same examples); merge the other threads' or "
                "processes' metrics"
            )
        seen: set[int] = set()
        ids: set[str] = set()
        named = None  # the incoming tokens with a module by its name (once it has measured)
        whose = "the other metric's"
        if isinstance(incoming_state, TokenSensitivityMetric):
            with incoming_state._lock:  # a snapshot: another thread may be updating it
                config: dict[str, Any] | None = incoming_state._config
                states: Any = incoming_state._copy_state_dict()
                seen = set(incoming_state._seen)
                other = incoming_state._engine
                ids, named = incoming_state._held_ids(), _named_tokens(incoming_state)
        elif isinstance(incoming_state, dict):
            if not any(k in incoming_state for k in self._defaults):
                # torchmetrics' default (persistent=False) leaves the states out of state_dict():
                # its own error ("Expected state variable n …"), after a warning of an older
                # senslab's dict, named neither cause nor fix
                keys = sorted(map(str, incoming_state))
                prefixed = sorted({k[: -len(".n")] for k in keys if k.endswith(".n")})
                if prefixed:  # a module's state dict, the metric's entries under its name
                    why = (f"its keys carry a module's prefix ({prefixed[0]!r}…); pass the "
                           f"metric's own entries, without the prefix '{prefixed[0]}.'")
                else:
                    why = ((f"it holds only {keys}" if keys else "it is empty")
                           + ": a metric's state_dict() holds its states only after "
                           "metric.persistent(True), as torchmetrics leaves them out by default. "
                           "Call other.persistent(True) before other.state_dict(), or merge the "
                           "metric itself: metric.merge_state(other)")
                raise ValueError(f"cannot merge: the state dict holds none of the metric's "
                                 f"states; {why}")
            config, other = _stored(incoming_state.get("config")), None
            states = _with_grid(_with_flip_counts(incoming_state))
            whose = "the state dict's"
            if incoming_state.get("seen_index") is not None:
                seen = _indices(incoming_state["seen_index"])
            if _count(incoming_state):  # an empty state holds nobody's examples
                ids = _ids_read(incoming_state.get("merged_ids"))
        else:  # torchmetrics' own refusal (not a dict, another Metric class)
            states, config, other = incoming_state, None, None
        with self._lock:
            if isinstance(states, dict):
                self._check_config(config, "cannot merge", "merge_state", named)
                if other is not None and self._engine is not None:  # resolved by the models
                    for name, a, b in _identity(self._engine, other):
                        if a != b:
                            raise ValueError(_differ_message("cannot merge", f"{name} {a!r} vs "
                                                             f"{b!r}"))
                if "sample_index" in states:
                    self._refuse_overlap(states["sample_index"])
                mine = _one_grid(self.pos_grid, "this metric's")
                # a dict without states at all: torchmetrics' merge names what is missing
                theirs = _one_grid(states.get("pos_grid", []), whose)
                if mine is not None and theirs is not None and mine != theirs:
                    raise ValueError("cannot merge: " + _grid_mismatch(mine, theirs, whose))
                if self._ids & ids:
                    raise ValueError(
                        "cannot merge: this metric already holds the examples of the incoming "
                        "states — the same metric (or its state dict) merged here before, a "
                        "metric holding one merged before, or a copy of this metric made after "
                        "it measured — and they would count twice (a smaller standard error "
                        "from the same examples); merge each metric once, and copy a metric "
                        "before it measures (or reset() the copy)"
                    )
            flag, self.dist_sync_on_step = self.dist_sync_on_step, False  # the states add up
            self._merging = True  # torchmetrics' _reduce_states, called from here (checked)
            try:
                super().merge_state(states)
            finally:
                self.dist_sync_on_step, self._merging = flag, False
            self._computed, self._last = None, None
            self._seen |= seen
            self._ids |= ids
            self._own_n = float(self.n)

    def _reduce_states(self, incoming_state: dict[str, Any]) -> None:
        """torchmetrics' addition of states, from :meth:`merge_state` only. torchmetrics'
        ``Running`` wrapper calls it itself, on states it kept of every batch: it resets the
        metric after each batch, which restarts the noise stream from the seed (every batch of
        the window drew the same noise, and the standard error took them for independent), and
        its addition skipped the checks of ``merge_state``; refused (it was refused at
        ``compute`` as states of a ``MetricCollection``'s compute groups, a fix that did not
        apply)."""
        if not getattr(self, "_merging", False):
            raise RuntimeError(
                "TokenSensitivityMetric's states cannot be added up outside merge_state, as "
                "torchmetrics' Running wrapper does: it resets the metric after every batch, "
                "which restarts the noise from the seed, so every batch of its window draws the "
                "same noise and the standard error would take them for independent. For a value "
                "over the last batches, log the per-batch estimates that forward returns "
                "(metric(model, inputs)), or call metric.reset() every few batches and compute() "
                "before it"
            )
        super()._reduce_states(incoming_state)

    def _warn_few_events(self, r: SensitivityResult) -> None:
        """:meth:`TokenSensitivity._warn_few_events` on the accumulated (synced, merged) counts,
        with this metric's causes said: the engine's, or where no update ran here (states
        loaded, merged or synced only) one built from the options, with no model."""
        copies, events = _known(self.num_copies), _known(self.num_events)
        if not copies or events >= MIN_FLIPS:
            return
        engine = self._warner()
        held = engine.state
        engine.state = State(n=int(self.n.item()), copies=copies, events=events)
        try:
            engine._warn_few_events(r)
        finally:
            engine.state = held

    def _warner(self) -> TokenSensitivity:
        """The engine that words this metric's warnings, with this metric's causes said: the
        engine, or where no update ran here (states loaded, merged or synced only) one built
        from the options, with no model."""
        engine = self._engine
        if engine is None:
            with warnings.catch_warnings():  # the options' own warnings were said at __init__
                warnings.simplefilter("ignore")
                engine = TokenSensitivity(_placeholder, self.tokens or Sequence(),
                                          **self.options)
            engine._said = self._said
        return engine

    def _warn_one_example(self, r: SensitivityResult) -> None:
        """:meth:`TokenSensitivity._warn_one_example` on the accumulated (synced, merged)
        result: with ``estimand="data"`` one example's standard error is NaN, said once per
        metric with the example's fixed-subset one (it was reported ``± nan`` without a word)."""
        self._warner()._warn_one_example(r)

    def _warn_counted(self, r: SensitivityResult) -> None:
        """:meth:`TokenSensitivity._warn_one_unit` and :meth:`TokenSensitivity._warn_ties` on
        the accumulated (synced, merged) counts of :meth:`_result` (unknown in an older
        senslab's states: 0, nothing said)."""
        engine = self._warner()
        held = engine.state
        engine.state = self._counts
        try:
            engine._warn_one_unit(r)
            engine._warn_ties(r)
        finally:
            engine.state = held

    def _warn_no_spread(self, r: SensitivityResult) -> None:
        """:meth:`TokenSensitivity._warn_no_spread` on the accumulated (synced, merged) counts:
        a data standard error of exactly 0 from several examples whose rates came out alike by
        chance (two examples at 12 of 32 flips each gave ``0.375 ± 0`` without a word, where
        :class:`~senslab.measure.TokenSensitivity` says why), once per metric."""
        engine = self._warner()
        held = engine.state
        engine.state = State(n=int(self.n.item()), events=_known(self.num_events))
        try:
            engine._warn_no_spread(r)
        finally:
            engine.state = held

    def _warn_all_seen(self, b: int) -> None:
        """A whole batch this process measured before is skipped (each example counts once; a
        batch of a sampler's padding, which another process measured, says nothing); in a
        plain loop over a second epoch without :meth:`reset` that drops the epoch and
        ``compute`` keeps returning the first one's value: say so, once until the next
        reset."""
        if getattr(self, "_warned_seen", False):
            return
        self._warned_seen = True
        warnings.warn(
            f"every example of this batch of {b} (index=) was measured before, so the batch is "
            "skipped: the metric counts each example once, and compute() still gives the value "
            "of the examples' first measurement. A new epoch? Call metric.reset() before it to "
            "measure the model again (Lightning resets a metric logged as a Metric object each "
            "epoch, not one logged by its value)",
            UserWarning, stacklevel=3,
        )

    def reset(self) -> None:
        """Forget the states; the next ``update`` restarts the noise from the seed. The metric
        gets a new id: its next examples are not those a metric it was merged into holds."""
        with self._lock:
            super().reset()
            self._engine, self._last, self.batch_estimate = None, None, None
            self._seen, self._resume = set(), None
            self._warned_seen, self._own = False, set()
            self._id = uuid.uuid4().hex
            self._ids = {self._id}
            self._own_n = 0.0

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Move the states with the module, never change their dtype: a ``.to(torch.bfloat16)``
        of the module that holds the metric (Lightning's ``precision="bf16-true"``) had turned
        the float64 counts and sums into bf16, which counts exactly only up to 256 (8,000
        examples were counted as 8,896, without a word)."""

        if getattr(self, "_dtype_convert", False):  # torchmetrics' own set_dtype (float64)
            return super()._apply(fn, *args, **kwargs)

        def same_dtype(t: Tensor) -> Tensor:
            moved = fn(t)
            return moved if moved.dtype == t.dtype else t.to(moved.device)

        out = super()._apply(same_dtype, *args, **kwargs)
        # torchmetrics sets ``dtype`` from a default-dtype tensor at every move (.to(device),
        # as Lightning moves every module): float32, and a process that had measured nothing
        # then synced float32 empties against the others' float64 states (gloo aborted with
        # a collective mismatch). The states are float64; so is ``dtype``.
        out._dtype = torch.float64
        return out

    def set_dtype(self, dst_type: str | torch.dtype) -> TokenSensitivityMetric:
        """Keep the states in float64 whatever ``dst_type`` says, with a warning where it says
        another dtype: ``set_dtype(torch.float16)`` (or a ``MetricCollection``'s) had cast the
        counts and sums, and in float16 the example count is exact only up to 2048 (2101
        examples were counted as 2108, and the estimate moved with it, without a word)."""
        target = torch.zeros(0).type(dst_type).dtype
        if target != torch.float64:
            warnings.warn(
                f"TokenSensitivityMetric keeps its counts and sums in float64: set_dtype("
                f"{dst_type}) leaves them as they are (in {target} the counts and sums of a "
                "measurement round off, and the estimate with them)",
                UserWarning, stacklevel=2,
            )
        return super().set_dtype(torch.float64)

    @contextmanager
    def sync_context(self, dist_sync_fn: Callable | None = None,
                     process_group: Any | None = None, should_sync: bool = True,
                     should_unsync: bool = True,
                     distributed_available: Callable | None = None) -> Iterator[None]:
        """torchmetrics' context, with this process's own states restored however the body
        ends: an error or a Ctrl-C inside ``compute`` left the metric synced (every process's
        states in this one's), so a later ``update`` added to the sum of all processes and the
        next ``compute`` failed with "already been synced". States this metric did not write
        are refused (:meth:`_foreign_states`; on every process alike where they sync)."""
        said = None if self._is_synced else self._foreign_states()
        self.sync(dist_sync_fn=dist_sync_fn, process_group=process_group,
                  should_sync=should_sync, distributed_available=distributed_available)
        if said is not None:  # not synced (one process; _sync_dist refuses on every one)
            raise RuntimeError(said)
        try:
            yield
        finally:
            self.unsync(should_unsync=self._is_synced and should_unsync)

    def _sync_dist(self, dist_sync_fn: Callable = gather_all_tensors,
                   process_group: Any | None = None) -> None:
        """torchmetrics' sync of the states across processes, refused (a ValueError, on every
        process alike, before any state is synced) where two processes' per-position profiles
        are over two grids of patches: gathered, position k of one and of the other, another
        patch each, had been added up. Processes that measured no patches agree with any. Also
        refused, on every process, where one's states are not its own (:meth:`_foreign_states`),
        and where two processes hold the examples of one metric (its id in both: one process's
        state dict loaded on every process).
        """
        group = process_group or self.process_group
        flag = float(self._foreign_states() is not None)  # this process's own states still
        flags = dist_sync_fn(torch.tensor([flag], dtype=torch.float64, device=self.n.device),
                             group=group)
        foreign = [r for r, f in enumerate(flags) if float(f.sum())]
        if foreign:
            raise RuntimeError(
                f"cannot sync the metric's states across processes: on process(es) {foreign} "
                "they hold other examples than the metric measured, merged or loaded there: "
                + _FOREIGN_FIX
            )
        # each process's entries as they are, read after the gather: a process whose own are
        # damaged raises with the others, never before a gather they wait in
        mine = _cat(self.pos_grid).to(self.n.device, torch.float64)
        gathered = dist_sync_fn(mine, group=group)
        grids = [_one_grid(t, f"process {r}'s") for r, t in enumerate(gathered)]
        said = _ranks_grid_mismatch(grids)
        if said is not None:
            raise ValueError("cannot sync the metric's states across processes: " + said)
        # the ids of the metrics whose examples each process's states hold: one on two
        # processes means the same examples on both (one process's checkpoint loaded on every
        # process: 4 examples were synced as 8, and the others' were missing), and they would
        # be summed twice, without a word
        ids = sorted(self._held_ids())
        mine = torch.tensor([b for i in ids for b in bytes.fromhex(i)], dtype=torch.float64,
                            device=self.n.device)
        held = [_ids_gathered(t) for t in dist_sync_fn(mine, group=group)]
        for r, theirs in enumerate(held):
            twice = next((q for q in range(r) if held[q] & theirs), None)
            if twice is not None:
                raise ValueError(
                    f"cannot sync the metric's states across processes: processes {twice} and "
                    f"{r} hold the same examples (the states of one metric: one process's "
                    "checkpoint loaded on every process — Lightning saves rank 0's states "
                    "only — or a copy of a metric that had measured), and the sync would count "
                    "them once per process while the others' examples are missing. Load each "
                    "process's own states (save metric.state_dict() on every process, to a "
                    "file of its own), or reset() the metric after loading such a checkpoint"
                )
        super()._sync_dist(dist_sync_fn, process_group=process_group)

    def state_dict(  # type: ignore[override]
        self, destination: dict[str, Any] | None = None, prefix: str = "",
        keep_vars: bool = False,
    ) -> dict[str, Any]:
        """torchmetrics' state dict (the states, with ``persistent(True)``) and then also the
        example indices already measured, ``seen_index``, the configuration the states were
        measured with, ``config``, and the ids of the metrics whose examples they hold,
        ``merged_ids`` (module docstring)."""
        with self._lock:
            out = super().state_dict(destination=destination, prefix=prefix,
                                     keep_vars=keep_vars)
            if any(self._persistent.values()):
                out[prefix + "seen_index"] = torch.tensor(sorted(self._seen), dtype=torch.int64)
                out[prefix + "config"] = _encoded(self._config)
                out[prefix + "merged_ids"] = _ids_encoded(self._held_ids())
            return out

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any,
    ) -> None:
        """Load the states (torchmetrics) and the seen indices: ``seen_index``, or where a
        state dict lacks it the indices of its ``sample_index``. The list states are copies:
        torchmetrics keeps the state dict's own lists, which later updates appended to.

        States of another configuration (``config``: another sigma, compare rule,
        tokenization, …) are refused with a ValueError naming the first difference, unless they
        hold no example (a checkpoint saved before the first update after a reset); a state
        dict with states but no ``config`` (saved by an older senslab) is loaded unchecked, with
        a warning. Loaded states replace this metric's, and with them the ids of the metrics
        whose examples they hold (``merged_ids``; none in an older state dict); the metric
        gets a new id of its own, and its noise stream restarts from the seed (the next
        ``update`` draws what a fresh metric's loaded with these states would)."""
        with self._lock:
            seen = state_dict.pop(prefix + "seen_index", None)
            config = state_dict.pop(prefix + "config", None)
            ids = state_dict.pop(prefix + "merged_ids", None)
            loaded = prefix + "sample_index" in state_dict
            counts = prefix + "n" in state_dict
            empty = counts and float(state_dict[prefix + "n"]) == 0  # no example to mix in
            if (config is not None or counts) and not empty:
                self._check_config(_stored(config), "cannot load the state dict",
                                   "load_state_dict")
            _one_grid(state_dict.get(prefix + "pos_grid", []), "the state dict's")
            # an older senslab's: the flip counts unknown, and the grid (no check against it;
            # this metric's own grid is not kept for the loaded states' profile)
            for k, v in _with_grid(_with_flip_counts(state_dict, prefix), prefix).items():
                state_dict.setdefault(k, v)
            super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
            for name in _CATS:
                if isinstance(getattr(self, name), list):
                    setattr(self, name, list(getattr(self, name)))
            if loaded:  # the loaded states' own examples: a batch of them again is a repeat
                keys = _cat(self.sample_index)
                self._own, self._warned_seen = _indices(keys[~torch.isnan(keys)]), False
            if seen is not None:
                self._seen = _indices(seen)
            elif loaded:
                self._seen = set(self._own)
            if seen is not None or loaded:
                self._computed, self._last = None, None  # no earlier compute's value
            if counts:  # the states were replaced: so are the examples' ids
                # … and the noise stream starts from the seed, as a fresh metric's loaded with
                # these states (one that had measured drew on from where it stood: other numbers)
                self._engine, self._resume, self.batch_estimate = None, None, None
                self._id = uuid.uuid4().hex
                self._ids = {self._id} | (_ids_read(ids) if float(self.n) else set())
            self._own_n = float(self.n)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = super().__getstate__()
            state["_engine"] = None  # it holds the model: a copy of the metric must not copy it
            state["_resume"] = self._position()  # … but continues its noise stream
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``clone()``, ``copy.deepcopy``, a pickle) gets an id of its own and keeps the
        ids of the examples its states hold (none if the original held none)."""
        super().__setstate__(state)
        if "_config" not in state:  # pickled by an older senslab
            self._config = _config(self.tokens, self.options)
        self.__dict__.setdefault("_said", set())  # pickled by an older senslab
        missing = [k for k in _FLIPS if k not in self._defaults]  # an older senslab's pickle:
        fill = math.nan if missing and float(self.n) else 0.0  # the counts unknown (_FLIPS)
        for k in missing:
            self.add_state(k, torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum",
                           persistent=self._persistent.get("n", False))
            setattr(self, k, torch.tensor(fill, dtype=torch.float64, device=self.n.device))
        if "within_q" not in self._defaults:  # an older senslab's pickle: 0, not known
            self.add_state("within_q", torch.tensor(0.0, dtype=torch.float64),
                           dist_reduce_fx="sum", persistent=self._persistent.get("n", False))
        if "pos_grid" not in self._defaults:  # an older senslab's pickle: its grid unknown
            self.add_state("pos_grid", [], dist_reduce_fx="cat",
                           persistent=self._persistent.get("n", False))
        held = self._held_ids() if "_ids" in state else set()
        self._id = uuid.uuid4().hex
        self._ids = held | {self._id}
        self._lock = TurnLock("this metric")
        self._serialize()

    def __deepcopy__(self, memo: dict[int, Any]) -> TokenSensitivityMetric:
        """A copy (``clone()``, ``copy.deepcopy``, a ``MetricCollection``'s ``clone()``, each
        period of a ``MetricTracker``) that leaves the model behind: the modules of the model
        that the tokens and options name as objects — ``Embedding(model.bert.embeddings.
        LayerNorm)``, ``output=model.head`` — stay the model's own, not copies. Copied, the
        copy's ``output`` head kept the weights of the moment it was made while the model's
        trained on (a validation clone gave 0.094 where the model's head gives 0.156, without a
        word), and its ``Embedding`` module was no submodule of the model it was built for
        (refused: "not a submodule"). Where the copy is part of a larger one (a
        ``LightningModule`` deep-copied with its metrics, for an average of weights), the
        modules are copied with it, as before."""
        root = next(iter(memo.values()), self)  # the copy of what is being copied
        pinned = []
        if isinstance(root, (Metric, MetricCollection)):
            for module in _model_parts(self.tokens, self.options):
                if id(module) not in memo:
                    memo[id(module)] = module
                    pinned.append(id(module))
        try:
            copied = type(self).__new__(type(self))
            memo[id(self)] = copied
            copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        finally:
            for key in pinned:  # copied anywhere else in the same copy, they are copied
                del memo[key]
        return copied

    # -- helpers -------------------------------------------------------------------------------
    def _foreign_states(self) -> str | None:
        """Why the states are refused where they hold other examples than this metric's updates,
        merges and loads put there (None: they are its own). torchmetrics' ``MetricCollection``
        (``compute_groups=True``, its default) makes metrics whose states are equal after the
        first ``update`` share the first one's states and then updates only that one; for this
        metric equal states do not mean equal measurements (two sigmas, seeds or options agree
        on a batch without flips, with ``index=``), and the other metrics had returned the
        first one's estimate as their own (sigma=2.0 reported sigma=0.1's 0.0 for 0.1875),
        without a word."""
        own = getattr(self, "_own_n", None)  # None: not known (an older senslab's pickle)
        if own is None or float(self.n) == own:
            return None
        return (f"this metric's states hold {float(self.n):g} examples, but it measured, "
                f"merged or loaded {own:g}: " + _FOREIGN_FIX)

    def _serialize(self) -> None:
        """``update`` and ``compute`` — torchmetrics' wrappers included, which count updates and
        cache the computed value — under the metric's lock: ``update`` measures a batch on the
        shared engine's state and then reads it, and a second thread in between counted a
        batch twice, lost it, or crashed on an empty one."""
        for name in ("update", "compute"):
            setattr(self, name, _locked(self._lock, getattr(self, name), name == "update"))

    def _held_ids(self) -> set[str]:
        """The ids of the metrics whose examples the states hold (none while they are empty)."""
        return set(self._ids) if float(self.n) else set()

    def _check_config(self, config: dict[str, Any] | None, what: str, call: str,
                      named: str | None = None) -> None:
        """Refuse states measured with another configuration; warn where there is none.
        ``named``: the incoming tokens with an ``Embedding`` module by its dotted name (from
        a metric that has measured; None: not known)."""
        if config is None:
            warnings.warn(
                f"{call}: the state dict holds no configuration ('config'; saved by an older "
                "senslab, or built by hand), so it is not checked against this metric's "
                f"({_described(self._config)}); use only states measured with the same options",
                stacklevel=4,
            )
            return
        for name in list(self._config) + [k for k in config if k not in self._config]:
            a, b = self._config.get(name), config.get(name)
            if name in _MODEL_DECIDES and (a is None or b is None):
                continue  # left to the model on one side: only the models can tell
            if name in _RECORDED_LATER and name not in config:
                continue  # saved before senslab recorded it: not known
            if name == "tokens" and a != b:
                a, b = _named_tokens(self) or a, named or b
                if a == b:
                    continue  # the module as an object on one side, by its name on the other
                if _unnamed(a) != _unnamed(b):
                    raise ValueError(_unnamed_message(what, a, b))
            if a != b:
                raise ValueError(_differ_message(what, f"{name} {a!r} vs {b!r}"))

    def _refuse_overlap(self, incoming: Any) -> None:
        """Refuse states holding an example index this metric has measured already."""
        mine, theirs = _cat(self.sample_index).cpu(), _cat(incoming).cpu()
        mine, theirs = mine[~torch.isnan(mine)], theirs[~torch.isnan(theirs)]
        both = sorted(_indices(mine.long()) & _indices(theirs.long()))
        if both:
            shown = ", ".join(map(str, both[:8])) + (", …" if len(both) > 8 else "")
            raise ValueError(
                f"cannot merge: {len(both)} example(s) are in both metrics (index {shown}) and "
                "would count twice; merge each shard once (a metric merged before, or a copy "
                "of this one, holds examples already here)"
            )

    def _distributed(self) -> tuple[int, int]:
        """(rank, world size) in the metric's process group; (0, 1) without one."""
        available = self.distributed_available_fn
        if available is None or not available():
            return 0, 1
        import torch.distributed as dist

        group = self.process_group
        return dist.get_rank(group), dist.get_world_size(group)

    def _engine_for(self, model: Any) -> TokenSensitivity:
        engine = self._engine
        if engine is not None and engine.model is model:
            return engine
        stream = None
        rank, _ = self._distributed()
        if engine is not None and engine.generator is not None:
            generator: torch.Generator | int = engine.generator  # a new model: stream continues
        elif self._resume is not None and self._resume.rank == rank:  # a copy: where the
            generator, stream = self._resume.restore()  # original's stream stood
        else:  # the seed; a copy sent to another process: that process's seed, not a repeat
            generator = self.seed.fresh() if rank == 0 else rank_seed(self.seed.initial, rank)
        self._engine = TokenSensitivity(model, self.tokens, generator=generator, **self.options)
        self._engine._said = self._said  # a cause said before a reset is not said again
        if stream is not None:
            self._engine._stream = stream
        self._resume = None
        return self._engine

    def _position(self) -> _Position | None:
        """Where the noise stream stands, for a copy: the engine's generator and unused noise,
        a copy's position not used yet, or None (the copy starts from the seed)."""
        engine = self._engine
        if engine is None or engine.generator is None:
            return self._resume
        rank, _ = self._distributed()
        generator, stream = engine.generator, engine._stream
        if stream is None or stream.gen is not generator:
            return _Position(rank, generator.get_state(), generator.device, None, None)
        return _Position(rank, generator.get_state(), generator.device, stream.row,
                         stream.buf.clone())

    def _synced(self, s1: float, n: int) -> tuple[float, int]:
        """One batch's sum of rates and examples, summed over the processes."""
        _, world = self._distributed()
        if world == 1:
            return s1, n
        gather = self.dist_sync_fn or gather_all_tensors
        mine = torch.tensor([float(s1), float(n)], dtype=torch.float64, device=self.n.device)
        total = torch.stack(gather(mine, group=self.process_group)).sum(0).tolist()
        return total[0], int(total[1])

    def _first_seen(self, index: Any, b: int) -> Tensor:
        """Which of this batch's examples no process has measured yet (first occurrence in
        (step, rank, position) order)."""
        ids = torch.as_tensor(index).flatten()
        if ids.is_floating_point() or ids.dtype == torch.bool or len(ids) != b:
            raise ValueError(
                f"index must hold one integer example index per example ({b}), got "
                f"{tuple(ids.shape)} {ids.dtype}; e.g. index=batch['idx']"
            )
        mine = ids.tolist()
        rank, world = self._distributed()
        everyone: list[Any] = [mine]
        if world > 1:
            import torch.distributed as dist

            everyone = [None] * world
            dist.all_gather_object(everyone, mine, group=self.process_group)
        keep: list[bool] = []
        for r, batch in enumerate(everyone):
            for i in batch:
                if r == rank:
                    keep.append(i not in self._seen)
                self._seen.add(i)
        return torch.tensor(keep, dtype=torch.bool)

    def _result(self) -> SensitivityResult:
        n = int(self.n.item())
        if n == 0:
            raise RuntimeError("no examples measured yet: call update(model, inputs) first")
        rates = _cat(self.sample_rate)
        keys = _cat(self.sample_index)
        if len(keys) and not torch.isnan(keys).any():
            rates = rates[torch.argsort(keys.cpu(), stable=True).to(rates.device)]
        _one_grid(self.pos_grid, "this metric's")  # one grid, or positions of two had been added
        ids = _cat(self.pos_id).cpu().long()
        align = "right" if len(ids) and int(ids.min()) < 0 else "left"
        p = (-int(ids.min()) if align == "right" else int(ids.max()) + 1) if len(ids) else 0
        slot = ids + p if align == "right" else ids
        pos_sum = torch.zeros(p, dtype=torch.float64).index_add_(0, slot, _cat(self.pos_sum).cpu())
        pos_cnt = torch.zeros(p, dtype=torch.float64).index_add_(0, slot, _cat(self.pos_cnt).cpu())
        state = State(
            n=n, s1=float(self.s1), s2=float(self.s2), within=float(self.within),
            within_q=float(self.within_q),
            forward=int(self.num_forward.item()), forward_fp32=int(self.num_forward_fp32.item()),
            checked=int(self.num_checked.item()), pos_sum=pos_sum, pos_cnt=pos_cnt,
            samples=[rates.float().cpu()], copies=_known(self.num_copies),
            events=_known(self.num_events), single=_known(self.num_single),
            ties=_known(self.num_ties), tie_rates=_known(self.tie_rates, float),
            tie_flips=_known(self.num_tie_flips), flips=_known(self.num_flips),
        )
        self._counts = state
        compare = self.options.get("compare", "class")
        sigma = self._engine.sigma if self._engine is not None else _sigma(self.options)
        return result(state, self.options.get("estimand", "data"), align, compare == "class",
                      sigma)


#: what states another metric put in a metric's place come from, and the fix
_FOREIGN_FIX = (
    "another metric's states were put in its place, as a torchmetrics MetricCollection with "
    "compute groups does to metrics whose first update gave equal states (then only one of "
    "them measures, and the others would return its estimate as theirs). Build the collection "
    "with MetricCollection(..., compute_groups=False)"
)


def _model_parts(tokens: Any, options: dict[str, Any]) -> list[nn.Module]:
    """The modules of a model that ``tokens`` (an ``Embedding`` given the module itself) and
    ``options`` (``output=model.head``, or a method of a module) hold as objects."""
    values = [*vars(tokens).values()] if hasattr(tokens, "__dict__") else []
    values += list(options.values())
    found: list[nn.Module] = []
    for value in values:
        owner = getattr(value, "__self__", None)  # a bound method: its module
        for module in (value, owner):
            if isinstance(module, nn.Module) and all(module is not m for m in found):
                found.append(module)
    return found


def _known(count: Tensor, kind: type = int) -> Any:
    """A count state as an int (``kind``); 0 where it is unknown (NaN: :data:`_FLIPS`)."""
    value = float(count)
    return kind(value) if math.isfinite(value) else kind(0)


def _with_flip_counts(states: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``states`` with the flip counts (:data:`_FLIPS`) where they lack them (saved by an older
    senslab): 0 for states of no example, NaN (unknown) otherwise — a 0 had made the examples'
    flips look missing, and torchmetrics' merge refused the dict for the missing keys. And with
    ``within_q`` (the Satterthwaite sum of distances' subset interval) 0 where they lack it:
    unknown, read as many degrees of freedom (the normal's 1.96, as they were computed)."""
    if prefix + "n" not in states or all(prefix + k in states for k in (*_FLIPS, "within_q")):
        return states
    n = torch.as_tensor(states[prefix + "n"])
    fill = math.nan if float(n.sum()) else 0.0
    out = dict(states)
    for k in _FLIPS:
        out.setdefault(prefix + k, torch.tensor(fill, dtype=torch.float64, device=n.device))
    out.setdefault(prefix + "within_q", torch.zeros((), dtype=torch.float64, device=n.device))
    return out


def _with_grid(states: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``states`` with an empty grid (``pos_grid``: not known) where they hold counts but no
    grid (saved by an older senslab): torchmetrics' merge refused the dict for the missing key,
    and a load had kept this metric's own grid beside the loaded profile."""
    if prefix + "n" not in states or prefix + "pos_grid" in states:
        return states
    return {**states, prefix + "pos_grid": []}


def _one_grid(value: Tensor | list[Tensor], whose: str) -> Grid | None:
    """The grid of patches a ``pos_grid`` state holds (None: none recorded). Raises where it
    holds two (states built or edited by hand: merges and syncs refuse them) or is no list of
    (rows, columns, patch size) triples (damaged)."""
    flat = _cat(value).cpu().double()
    if len(flat) % 3 or not torch.equal(flat, flat.round()) or (len(flat) and flat.min() < 1):
        raise ValueError(
            f"{whose} 'pos_grid' state ({flat.tolist()}) is not a list of (rows, columns, patch "
            "size) grids: it is damaged; use states saved by TokenSensitivityMetric"
        )
    grids = list(dict.fromkeys((int(r), int(c), int(p)) for r, c, p in flat.view(-1, 3).tolist()))
    if len(grids) > 1:
        raise ValueError(_grid_mismatch(grids[0], grids[1], "part of it", mine=whose))
    return grids[0] if grids else None


def _cat(x: Tensor | list[Tensor]) -> Tensor:
    """A ``"cat"`` state as one tensor (a list before syncing, a tensor after)."""
    if isinstance(x, Tensor):
        return x.flatten()
    if not x:
        return torch.zeros(0, dtype=torch.float64)
    return dim_zero_cat(x)


def _locked(lock: TurnLock, method: Callable[..., Any],
            measures: bool = False) -> Callable[..., Any]:
    """``method`` run while holding ``lock``; one that ``measures`` (runs the model) holds the
    measurements' lock before it (:func:`senslab._exclusive.exclusive`), as every measurement
    does, so no two threads wait for each other in a circle."""

    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with exclusive() if measures else nullcontext(), lock:
            return method(*args, **kwargs)

    return locked


def _config(tokens: Tokenization | None, options: dict[str, Any]) -> dict[str, Any]:
    """What defines the quantity a metric of ``tokens`` and ``options`` measures —
    :class:`TokenSensitivity.merge`'s identity (``_identity``) as JSON values; None where the
    model decides (the tokens and alignment without ``tokens``, ``output_kind`` without the
    option); a ``replace_with`` vocabulary with a digest of its values."""
    probe = TokenSensitivity(_placeholder, tokens if tokens is not None else Sequence(), **options)
    config = {name: value for name, value, _ in _identity(probe, probe)}
    if tokens is None:
        config["tokens"], config["align"] = None, options.get("align")
    if "output_kind" in config:
        config["output_kind"] = options.get("output_kind")
    vocab = options.get("replace_with")
    if vocab is not None:
        values = vocab.detach().cpu().double().contiguous().numpy().tobytes()
        config["replace_with"] += f" (sha256 {hashlib.sha256(values).hexdigest()[:16]})"
    # plain JSON values (a NumPy threshold, np.float32(0.3), made state_dict() raise at the
    # first checkpoint), as they read back from a state dict
    return json.loads(json.dumps(config, default=_plain))


def _plain(value: Any) -> Any:
    """A NumPy or torch scalar as a Python number; anything else by its repr."""
    item = getattr(value, "item", None)
    return item() if callable(item) else repr(value)


def _encoded(config: dict[str, Any]) -> Tensor:
    """A configuration as a state dict entry: its JSON as a uint8 tensor (safetensors and
    ``torch.load(weights_only=True)`` hold tensors)."""
    return torch.tensor(list(json.dumps(config, sort_keys=True).encode()), dtype=torch.uint8)


def _stored(entry: Any) -> dict[str, Any] | None:
    """A state dict's ``config`` entry read back (None: there is none)."""
    if entry is None:
        return None
    try:
        config = json.loads(bytes(torch.as_tensor(entry).cpu().tolist()).decode())
    except (ValueError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"the state dict's 'config' entry cannot be read ({err}): it is damaged; use a state "
            "dict saved by TokenSensitivityMetric.state_dict()"
        ) from err
    if not isinstance(config, dict):
        raise ValueError("the state dict's 'config' entry is not a configuration: it is damaged")
    return config


def _ids_encoded(ids: set[str]) -> Tensor:
    """Metric ids (uuid4 hex) as a state dict entry: a (k, 16) uint8 tensor."""
    rows = [list(bytes.fromhex(i)) for i in sorted(ids)]
    return torch.tensor(rows, dtype=torch.uint8).reshape(len(rows), 16)


def _ids_read(entry: Any) -> set[str]:
    """A state dict's ``merged_ids`` entry read back (none where there is none)."""
    if entry is None:
        return set()
    t = torch.as_tensor(entry)
    if t.dtype != torch.uint8 or t.dim() != 2 or t.shape[1] != 16:
        raise ValueError(
            f"the state dict's 'merged_ids' entry is not a (k, 16) uint8 tensor "
            f"({tuple(t.shape)} {t.dtype}): it is damaged; use a state dict saved by "
            "TokenSensitivityMetric.state_dict()"
        )
    return {bytes(row).hex() for row in t.cpu().tolist()}


def _ids_gathered(t: Tensor) -> set[str]:
    """Metric ids gathered from a process (their 16 bytes each, one flat float64 tensor)."""
    flat = [int(v) for v in t.flatten().cpu().tolist()]
    return {bytes(flat[i:i + 16]).hex() for i in range(0, len(flat) - len(flat) % 16, 16)}


def _count(states: dict[str, Any]) -> float:
    """The examples a state dict holds (0 without a count)."""
    n = states.get("n")
    return 0.0 if n is None else float(torch.as_tensor(n).sum())


def _named_tokens(metric: TokenSensitivityMetric) -> str | None:
    """The metric's tokens as ``_identity`` writes them with its model, an ``Embedding``
    module by its dotted name (None before the first ``update``: no model yet)."""
    engine = metric._engine
    if engine is None:
        return None
    return next(a for name, a, _ in _identity(engine, engine) if name == "tokens")


def _unnamed(tokens: Any) -> bool:
    """Whether a configuration's tokens hold a module as the object's description
    (``Embedding(module=LayerNorm((384,), ...))``), not by its name (``module='norm'``)."""
    return isinstance(tokens, str) and re.search(r"\bmodule=(?!['\"])", tokens) is not None


def _unnamed_message(what: str, a: str, b: str) -> str:
    found = re.findall(r"\bmodule='([^']*)'", f"{a} {b}")
    how = (f"Embedding({found[0]!r})" if found
           else "Embedding('<dotted name>'), the module's name in model.named_modules()")
    return (f"{what}: tokens {a!r} vs {b!r} — the Embedding module is given as the module "
            "object on one side and by its dotted name on the other, and which module the "
            "object is can be told only with the model (a metric finds the name at its first "
            "update; a state dict holds only a description of the module). Build both metrics "
            f"with the dotted name, {how}")


def _described(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in config.items() if v is not None)


def _differ_message(what: str, difference: str) -> str:
    return (f"{what}: {difference} — the states measure a different quantity from this "
            "metric's; build both metrics with the same options")


def _indices(x: Any) -> set[int]:
    """Example indices (a tensor of them) as a set of ints."""
    return {int(i) for i in torch.as_tensor(x).flatten().tolist()}


def _sigma(options: dict[str, Any]) -> float | None:
    if options.get("replace_with") is not None:
        return None
    if options.get("variance") is not None:
        return math.sqrt(options["variance"])
    return None if options.get("sigma") is None else float(options["sigma"])
