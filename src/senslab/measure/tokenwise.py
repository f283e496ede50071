r"""Token-wise Gaussian sensitivity (main paper, Definition 4.1).

An input is a sequence of :math:`T` tokens :math:`x_1,\dots,x_T`. Perturbing token :math:`i`
replaces it by :math:`x_i + \varepsilon` with :math:`\varepsilon \sim \mathcal N(0, \sigma^2 I)`.
The sensitivity of a classifier :math:`f` on data :math:`D` is the probability that its predicted
class changes,

.. math::

    S_\sigma(f) = \mathbb E_{x \in D}\; \mathbb E_{i \sim U[T_x]}\;
    \mathbb E_{\varepsilon}\, \mathbf 1\big[\hat y(x^{(i,\varepsilon)}) \ne \hat y(x)\big],

averaging uniformly over the real tokens of each example (padding is never perturbed) and then
uniformly over examples. With ``compare="l1"``/``"l2"`` the indicator is replaced by the distance
between the output vectors.

**Estimator.** For every example all its real tokens are enumerated (a stratified design: no
variance from choosing tokens) with ``repeats`` fresh noise draws each, or a random subset of
``num_tokens`` tokens. All perturbed copies of a chunk are built with tensor ops on the model's
device and evaluated in one forward pass under ``torch.inference_mode``.

**Uncertainty.** Two estimands are distinguished:

* ``"data"`` (default): the sensitivity of the *data distribution* the examples were drawn from.
  The examples are the sampling unit, so the standard error is the standard deviation of the
  per-example flip rates divided by :math:`\sqrt{n}` (tokens of one example are not independent
  of each other, so pooling all flips would understate it).
* ``"subset"``: the sensitivity of *this fixed set of examples*; only the token/noise randomness
  counts. With all tokens and ``repeats >= 2`` it uses the stratified variance
  :math:`\operatorname{Var}(\hat m_b) = T_b^{-2}\sum_t s^2_{bt}/R`; otherwise the copies of an
  example are treated as i.i.d. draws (conservative under stratification).

The state is sums and counts, so results over many batches and processes merge exactly
(:meth:`TokenSensitivity.merge`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..tokens.base import BoundTokens, Inputs, Tokenization, batch_size, check_device

Compare = Literal["class", "l1", "l2"]
Estimand = Literal["data", "subset"]

#: Noise is drawn from the generator in blocks of this many numbers, whatever the chunk size,
#: so chunked and unchunked evaluation consume the random stream identically.
NOISE_BLOCK = 1 << 18
DEFAULT_CHUNK = 64


@dataclass(frozen=True)
class SensitivityResult:
    """What a sensitivity measurement returns.

    ``estimate`` is the mean flip rate (or output distance); ``stderr`` and ``ci95`` belong to
    ``estimand`` (see the module docstring); ``stderr_subset`` is always the fixed-subset one.
    ``per_sample`` holds one rate per example (in input order); ``per_position`` the mean per
    token position, at positions ``positions`` (right-aligned: −1 is the last real token), with
    ``position_counts`` perturbed copies behind each. ``num_forward`` counts model evaluations
    of single examples, clean ones included.
    """

    estimate: float
    stderr: float
    ci95: tuple[float, float]
    estimand: str
    stderr_subset: float
    num_examples: int
    num_forward: int
    per_sample: Tensor
    per_position: Tensor
    positions: Tensor
    position_counts: Tensor
    sigma: float | None

    def __str__(self) -> str:
        lo, hi = self.ci95
        return (
            f"sensitivity {self.estimate:.4f} ± {self.stderr:.4f} "
            f"(95% CI {lo:.4f}–{hi:.4f}, {self.estimand}; {self.num_examples:,} examples, "
            f"{self.num_forward:,} forward passes)"
        )

    def __float__(self) -> float:
        return self.estimate


class _NoiseStream:
    """Standard-normal rows drawn in fixed-size blocks (see :data:`NOISE_BLOCK`)."""

    def __init__(self, generator: torch.Generator, row: int, device: torch.device) -> None:
        self.gen, self.row, self.device = generator, row, device
        self.rows_per_block = max(1, NOISE_BLOCK // row)
        self.buf = torch.empty(0, row, device=device)

    def take(self, n: int) -> Tensor:
        parts = [self.buf]
        have = len(self.buf)
        while have < n:
            block = torch.randn(
                self.rows_per_block, self.row, generator=self.gen, device=self.gen.device
            )
            parts.append(block.to(self.device, non_blocking=True))
            have += self.rows_per_block
        allrows = torch.cat(parts) if len(parts) > 1 else self.buf
        out, self.buf = allrows[:n], allrows[n:]
        return out

    def randint(self, high: int, n: int) -> Tensor:
        return torch.randint(high, (n,), generator=self.gen, device=self.gen.device).to(
            self.device
        )


def _predictions(out: Tensor) -> Tensor:
    if out.dim() == 1 or (out.dim() == 2 and out.shape[1] == 1):
        return out.reshape(-1) > 0  # one logit / score: the sign is the class
    if out.dim() == 2:
        return out.argmax(dim=1)
    raise ValueError(
        f"model output has shape {tuple(out.shape)}; compare='class' needs (batch,) or "
        "(batch, classes) outputs — use compare='l1' or 'l2' for other outputs"
    )


def _check_finite(out: Tensor, what: str) -> None:
    if not torch.isfinite(out).all():
        bad = (~torch.isfinite(out.reshape(len(out), -1))).any(dim=1).nonzero().flatten()
        raise FloatingPointError(
            f"model output is NaN or infinite on {len(bad)} {what} (first at row {bad[0].item()}); "
            "sensitivity is undefined there — check the model's weights and the inputs"
        )


@dataclass
class _State:
    """Sum/count state: mergeable across batches and processes."""

    n: int = 0
    s1: float = 0.0  # Σ_b m_b
    s2: float = 0.0  # Σ_b m_b²
    within: float = 0.0  # Σ_b Var̂(m_b) (token/noise randomness only)
    forward: int = 0
    pos_sum: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    pos_cnt: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    samples: list[Tensor] = field(default_factory=list)


def _interleave(per_rank: list[Any]) -> Tensor:
    """Per-sample rates of all ranks back in one-process order (example b lives on rank
    b % world; each rank's list holds one entry per update)."""
    world, out = len(per_rank), []
    for batches in zip(*per_rank, strict=True):
        n = sum(len(x) for x in batches)
        merged = [0.0] * n
        for r, rates in enumerate(batches):
            merged[r::world] = rates
        out += merged
    return torch.tensor(out, dtype=torch.float32)


def _pad_to(t: Tensor, n: int, left: bool) -> Tensor:
    if len(t) >= n:
        return t
    z = torch.zeros(n - len(t), dtype=t.dtype)
    return torch.cat([z, t] if left else [t, z])


class TokenSensitivity:
    """Accumulating token-wise sensitivity (torchmetrics-style ``update``/``compute``/``reset``).

    Args:
        model: any callable or ``nn.Module``; it is put in eval mode while measuring (its mode is
            restored afterwards) unless ``eval_mode=False``.
        tokens: a :class:`~senslab.tokens.Tokenization` — ``Patches(p)``, ``Embedding(name)``,
            ``Sequence()``; defaults to ``model.default_tokens()`` if the model has one.
        sigma: noise **standard deviation** (the paper states variances: pass ``variance=``
            instead to give σ² directly). Exactly one of the two, unless ``replace_with``.
        variance: noise variance σ².
        replace_with: a (V, D) vocabulary; the perturbation then replaces the token by a row
            drawn uniformly from it instead of adding noise (the synthetic task's sensitivity).
        repeats: noise draws per token.
        num_tokens: perturb a random subset of this many tokens per example (default: all).
        mode: ``"token"`` (one token at a time) or ``"whole"`` (noise on every token at once,
            the random-noise variant of the paper's A.2).
        compare: ``"class"`` (predicted class changes; default, as in the paper), ``"l1"`` or
            ``"l2"`` (distance between output vectors).
        estimand: ``"data"`` or ``"subset"``, which standard error ``compute`` reports.
        generator: a ``torch.Generator`` or an int seed; all randomness comes from it
            (default seed 0: same call, same numbers).
        chunk_size: perturbed copies per forward pass (bounds memory).
        autocast: a dtype (``torch.bfloat16``/``torch.float16``) to run forwards under autocast.
        align: per-position alignment, ``"left"`` or ``"right"``; default from the tokenization.
        shard: ``(rank, world_size)``: this process measures only examples ``b`` with
            ``b % world_size == rank`` of every batch, drawing the same random stream as a single
            process would; after :meth:`all_reduce` every rank holds the one-process result.

    Example:
        >>> import torch
        >>> from senslab.measure import TokenSensitivity
        >>> from senslab.tokens import Patches
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> metric = TokenSensitivity(model, Patches(2), sigma=0.5, generator=0)
        >>> for batch in torch.randn(2, 8, 1, 4, 4):
        ...     metric.update(batch)
        >>> result = metric.compute()
        >>> result.num_examples, 0.0 <= result.estimate <= 1.0
        (16, True)
    """

    def __init__(
        self,
        model: nn.Module | Any,
        tokens: Tokenization | None = None,
        *,
        sigma: float | None = None,
        variance: float | None = None,
        replace_with: Tensor | None = None,
        repeats: int = 1,
        num_tokens: int | None = None,
        mode: Literal["token", "whole"] = "token",
        compare: Compare = "class",
        estimand: Estimand = "data",
        generator: torch.Generator | int | None = None,
        chunk_size: int | None = None,
        autocast: torch.dtype | None = None,
        align: Literal["left", "right"] | None = None,
        eval_mode: bool = True,
        shard: tuple[int, int] | None = None,
    ) -> None:
        if tokens is None:
            if not hasattr(model, "default_tokens"):
                raise TypeError(
                    f"{type(model).__name__} declares no default_tokens(); pass tokens= "
                    "(Patches(p), Embedding('<module>') or Sequence())"
                )
            tokens = model.default_tokens()
        self.model, self.tokens = model, tokens
        self.sigma = _resolve_sigma(sigma, variance, replace_with)
        self.replace_with = replace_with
        if replace_with is not None and mode != "token":
            raise ValueError("replace_with works one token at a time: use mode='token'")
        _check_positive("repeats", repeats)
        if num_tokens is not None:
            _check_positive("num_tokens", num_tokens)
        if mode not in ("token", "whole"):
            raise ValueError(f"mode must be 'token' or 'whole', got {mode!r}")
        if compare not in ("class", "l1", "l2"):
            raise ValueError(f"compare must be 'class', 'l1' or 'l2', got {compare!r}")
        if estimand not in ("data", "subset"):
            raise ValueError(f"estimand must be 'data' or 'subset', got {estimand!r}")
        self.repeats, self.num_tokens, self.mode = repeats, num_tokens, mode
        self.compare, self.estimand = compare, estimand
        self.chunk_size = _check_positive("chunk_size", chunk_size or DEFAULT_CHUNK)
        self.autocast, self.eval_mode = autocast, eval_mode
        self.align = align or getattr(tokens, "align", "left")
        if self.align not in ("left", "right"):
            raise ValueError(f"align must be 'left' or 'right', got {self.align!r}")
        if generator is None or isinstance(generator, int):
            seed = 0 if generator is None else generator
            self._seed: int | None = seed
            self.generator: torch.Generator | None = None  # made on the model's device lazily
        else:
            self._seed, self.generator = None, generator
        self._stream: _NoiseStream | None = None
        if shard is not None and not (0 <= shard[0] < shard[1]):
            raise ValueError(f"shard must be (rank, world_size), 0 <= rank < world; got {shard}")
        self.shard = shard
        self.reset()

    # -- state ---------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget all accumulated examples (the random stream continues)."""
        self.state = _State()

    def merge(self, other: TokenSensitivity) -> TokenSensitivity:
        """Add ``other``'s accumulated state to this one (e.g. results of other processes)."""
        if other.align != self.align:
            raise ValueError("cannot merge results with different per-position alignment")
        a, b = self.state, other.state
        n = max(len(a.pos_sum), len(b.pos_sum))
        left = self.align == "right"
        self.state = _State(
            n=a.n + b.n,
            s1=a.s1 + b.s1,
            s2=a.s2 + b.s2,
            within=a.within + b.within,
            forward=a.forward + b.forward,
            pos_sum=_pad_to(a.pos_sum, n, left) + _pad_to(b.pos_sum, n, left),
            pos_cnt=_pad_to(a.pos_cnt, n, left) + _pad_to(b.pos_cnt, n, left),
            samples=a.samples + b.samples,
        )
        return self

    # -- measuring -----------------------------------------------------------------------------
    @torch.inference_mode()
    def update(self, inputs: Inputs, mask: Tensor | None = None) -> None:
        """Measure one batch of examples and add it to the state.

        ``inputs``: a tensor, a tuple (positional arguments) or a dict (keyword arguments) with
        the example axis first. ``mask``: (B, T) bool, true on real tokens (padding excluded).
        """
        if batch_size(inputs) == 0:
            raise ValueError("empty batch: sensitivity needs at least one example")
        device = check_device(self.model, inputs)
        if self.eval_mode and isinstance(self.model, nn.Module):
            with _eval(self.model), self._autocast(device):
                self._update(inputs, mask, device)
        else:
            with self._autocast(device):
                self._update(inputs, mask, device)

    def _autocast(self, device: torch.device) -> Any:
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast)

    def _rng(self, device: torch.device, row: int) -> _NoiseStream:
        if self.generator is None:
            self.generator = torch.Generator(device=device).manual_seed(self._seed or 0)
        if self._stream is None or self._stream.row != row:
            self._stream = _NoiseStream(self.generator, row, device)
        return self._stream

    def _update(self, inputs: Inputs, mask: Tensor | None, device: torch.device) -> None:
        with self.tokens.bind(self.model, inputs, mask) as bound:
            clean = bound.clean_output
            _check_finite(clean, "clean examples")
            valid = bound.valid
            b, t = valid.shape
            if not valid.any(dim=1).all():
                empty = (~valid.any(dim=1)).nonzero().flatten().tolist()
                raise ValueError(
                    f"examples {empty[:5]} have no real token (the mask is all padding); "
                    "drop them or fix the mask"
                )
            whole = self.mode == "whole"
            stream = self._rng(device, t * bound.dim if whole else bound.dim)
            src, tok = self._plan(valid, stream)
            ref = _predictions(clean) if self.compare == "class" else clean.float()
            vals = torch.empty(len(src), dtype=torch.float32, device=device)
            own = self._owned(src)
            for lo in range(0, len(src), self.chunk_size):
                sl = slice(lo, lo + self.chunk_size)
                vals[sl] = self._evaluate(bound, stream, src[sl], tok[sl], ref, whole, own[sl])
        if self.shard is not None:
            keep = own.nonzero().flatten()
            mine = self._owned(torch.arange(b, device=device))
            src, tok, vals = src[keep], tok[keep], vals[keep]
            b = int(mine.sum())
            remap = torch.cumsum(mine.long(), 0) - 1  # global example → local row
            valid, src = valid[mine], remap[src]
        self._accumulate(vals, src, tok, valid, whole)
        self.state.forward += b + len(src)

    def _plan(self, valid: Tensor, stream: _NoiseStream) -> tuple[Tensor, Tensor]:
        """Which example (src) and token (tok) each perturbed copy has, sample-major."""
        b, t = valid.shape
        if self.mode == "whole":
            src = torch.arange(b, device=valid.device).repeat_interleave(self.repeats)
            return src, torch.zeros_like(src)
        chosen = valid
        if self.num_tokens is not None and self.num_tokens < t:
            scores = torch.rand(b, t, generator=stream.gen, device=stream.gen.device)
            scores = scores.to(valid.device).masked_fill(~valid, float("inf"))
            rank = scores.argsort(dim=1).argsort(dim=1)
            chosen = valid & (rank < self.num_tokens)
        cells = chosen.nonzero()
        rep = self.repeats
        return cells[:, 0].repeat_interleave(rep), cells[:, 1].repeat_interleave(rep)

    def _owned(self, src: Tensor) -> Tensor:
        if self.shard is None:
            return torch.ones_like(src, dtype=torch.bool)
        rank, world = self.shard
        return src % world == rank

    def _evaluate(
        self,
        bound: BoundTokens,
        stream: _NoiseStream,
        src: Tensor,
        tok: Tensor,
        ref: Tensor,
        whole: bool,
        own: Tensor,
    ) -> Tensor:
        """Values of the copies of one chunk. Randomness is drawn for every copy of the chunk
        (so every shard consumes the stream alike); only ``own`` copies are evaluated."""
        if self.replace_with is not None:
            vocab = self.replace_with.to(ref.device)
            pick = vocab[stream.randint(len(vocab), len(src))]
        else:
            noise = stream.take(len(src)) * self.sigma
        out_vals = torch.zeros(len(src), dtype=torch.float32, device=ref.device)
        if not own.all():
            idx = own.nonzero().flatten()
            if len(idx) == 0:
                return out_vals
            src, tok = src[idx], tok[idx]
            if self.replace_with is not None:
                pick = pick[idx]
            else:
                noise = noise[idx]
        else:
            idx = None
        if self.replace_with is not None:
            noise = pick - bound.tokens(src, tok).to(pick.dtype)
        elif whole:
            noise = noise.view(len(src), -1, bound.dim)
        vals = self._compare(bound.forward_perturbed(src, None if whole else tok, noise), ref, src)
        if idx is None:
            return vals
        return out_vals.index_copy_(0, idx, vals)

    def _compare(self, out: Tensor, ref: Tensor, src: Tensor) -> Tensor:
        _check_finite(out, "perturbed copies")
        if self.compare == "class":
            return (_predictions(out) != ref[src]).float()
        diff = (out.float() - ref[src]).reshape(len(src), -1)
        return diff.abs().sum(1) if self.compare == "l1" else diff.norm(dim=1)

    def _accumulate(
        self, vals: Tensor, src: Tensor, tok: Tensor, valid: Tensor, whole: bool
    ) -> None:
        b, t = valid.shape
        v = vals.double()
        cnt = torch.zeros(b, dtype=torch.float64, device=v.device).index_add_(
            0, src, torch.ones_like(v)
        )
        mean = torch.zeros_like(cnt).index_add_(0, src, v) / cnt
        # within-example variance of each example's mean (fixed-subset estimand)
        stratified = not whole and self.repeats > 1 and self.num_tokens is None
        if stratified:
            cell = src * t + tok
            csum = torch.zeros(b * t, dtype=torch.float64, device=v.device).index_add_(0, cell, v)
            csq = torch.zeros_like(csum).index_add_(0, cell, v * v)
            r = self.repeats
            cvar = (csq - csum * csum / r) / (r - 1)  # sample variance per (example, token) cell
            k = valid.sum(1).double().to(v.device)
            within = cvar.view(b, t).sum(1) / r / k**2
        else:
            sq = torch.zeros_like(cnt).index_add_(0, src, v * v)
            var = (sq - cnt * mean * mean) / (cnt - 1).clamp(min=1)
            within = torch.where(cnt > 1, var / cnt, torch.full_like(var, float("nan")))
        st = self.state
        st.n += b
        st.s1 += mean.sum().item()
        st.s2 += (mean * mean).sum().item()
        st.within += within.sum().item()
        st.samples.append(mean.float().cpu())
        if not whole:
            self._accumulate_positions(v, src, tok, valid)

    def _accumulate_positions(self, v: Tensor, src: Tensor, tok: Tensor, valid: Tensor) -> None:
        t = valid.shape[1]
        if self.align == "right":  # index t-1 ↔ position −1 (the last real token)
            # number of real tokens after each token: 0 for the last real one
            after = valid.flip(1).cumsum(1).flip(1) - valid.long()
            idx = t - 1 - after[src, tok]
        else:
            idx = tok
        ps = torch.zeros(t, dtype=torch.float64, device=v.device).index_add_(0, idx, v).cpu()
        pc = torch.zeros(t, dtype=torch.float64, device=v.device).index_add_(
            0, idx, torch.ones_like(v)
        ).cpu()
        st = self.state
        n = max(t, len(st.pos_sum))
        left = self.align == "right"
        st.pos_sum = _pad_to(st.pos_sum, n, left) + _pad_to(ps, n, left)
        st.pos_cnt = _pad_to(st.pos_cnt, n, left) + _pad_to(pc, n, left)

    def all_reduce(self, group: Any = None) -> TokenSensitivity:
        """Sum the state over all processes of ``torch.distributed`` (every rank then holds the
        total; per-sample rates are gathered in the one-process order)."""
        import torch.distributed as dist

        st = self.state
        world = dist.get_world_size(group)
        sizes = [None] * world
        dist.all_gather_object(sizes, len(st.pos_sum), group=group)
        p = max(sizes)
        left = self.align == "right"
        scal = torch.tensor([st.n, st.s1, st.s2, st.within, st.forward], dtype=torch.float64)
        vec = torch.cat([scal, _pad_to(st.pos_sum, p, left), _pad_to(st.pos_cnt, p, left)])
        dist.all_reduce(vec, group=group)
        samples = [None] * world
        dist.all_gather_object(samples, [s.tolist() for s in st.samples], group=group)
        self.state = _State(
            n=int(vec[0]), s1=float(vec[1]), s2=float(vec[2]), within=float(vec[3]),
            forward=int(vec[4]), pos_sum=vec[5 : 5 + p].clone(), pos_cnt=vec[5 + p :].clone(),
            samples=[_interleave(samples)],
        )
        return self

    def compute(self) -> SensitivityResult:
        """The estimate over everything accumulated since the last :meth:`reset`."""
        st = self.state
        if st.n == 0:
            raise RuntimeError("no examples measured yet: call update(inputs) first")
        est = st.s1 / st.n
        var_data = (st.s2 - st.n * est * est) / (st.n - 1) if st.n > 1 else float("nan")
        se_data = math.sqrt(max(var_data, 0.0) / st.n) if st.n > 1 else float("nan")
        se_subset = math.sqrt(max(st.within, 0.0)) / st.n if math.isfinite(st.within) else math.nan
        se = se_data if self.estimand == "data" else se_subset
        lo, hi = est - 1.96 * se, est + 1.96 * se
        if self.compare == "class":
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        p = len(st.pos_sum)
        positions = torch.arange(-p, 0) if self.align == "right" else torch.arange(p)
        with torch.no_grad():
            per_pos = st.pos_sum / st.pos_cnt.clamp(min=1)
            per_pos[st.pos_cnt == 0] = float("nan")
        return SensitivityResult(
            estimate=est,
            stderr=se,
            ci95=(lo, hi),
            estimand=self.estimand,
            stderr_subset=se_subset,
            num_examples=st.n,
            num_forward=st.forward,
            per_sample=torch.cat(st.samples),
            per_position=per_pos,
            positions=positions,
            position_counts=st.pos_cnt.clone(),
            sigma=self.sigma,
        )


def token_sensitivity(
    model: nn.Module | Any,
    inputs: Inputs,
    tokens: Tokenization | None = None,
    *,
    mask: Tensor | None = None,
    **options: Any,
) -> SensitivityResult:
    """Token-wise sensitivity of ``model`` on a batch ``inputs`` (see the module docstring).

    Same options as :class:`TokenSensitivity`; equivalent to one ``update`` and ``compute``.

    Example:
        >>> import torch
        >>> from senslab.measure import token_sensitivity
        >>> from senslab.tokens import Patches
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
        >>> r = token_sensitivity(model, torch.randn(32, 3, 8, 8), Patches(4), sigma=0.1)
        >>> r.num_forward  # 32 clean + 32 examples × 4 patches × 1 draw
        160
    """
    metric = TokenSensitivity(model, tokens, **options)
    metric.update(inputs, mask)
    return metric.compute()


def _resolve_sigma(
    sigma: float | None, variance: float | None, replace_with: Tensor | None
) -> float | None:
    if replace_with is not None:
        if sigma is not None or variance is not None:
            raise ValueError("give either replace_with or a noise level (sigma/variance), not both")
        if replace_with.dim() != 2:
            raise ValueError("replace_with must be a (vocabulary, dim) tensor of token vectors")
        return None
    if (sigma is None) == (variance is None):
        raise ValueError(
            "give exactly one noise level: sigma= (standard deviation) or variance= (σ²); "
            "the paper quotes variances, e.g. variance=15 for text"
        )
    if variance is not None:
        if not variance > 0 or not math.isfinite(variance):
            raise ValueError(f"variance must be a positive finite number, got {variance}")
        return math.sqrt(variance)
    assert sigma is not None
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"sigma (noise standard deviation) must be positive, got {sigma}")
    return float(sigma)


def _check_positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.train(training)
