"""Vision transformers of the vision experiments (docs/definitions.md#vision-models): ViT-small
(Lee et al. 2021, "ViT for small datasets": shifted patch tokenization + locality self-attention)
and ViT-simple (Beyer et al. 2022: 2-D sin-cos positions, mean pooling).

Both map images (B, C, H, W) to logits and measure sensitivity on their own patches
(``default_tokens()`` is ``Patches(patch_size)``). Defaults marked *(paper code)* follow the
implementations the paper used (lucidrains' ``vit_for_small_dataset`` / ``simple_vit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._autocast import autocast_dtype, autocast_on
from ._config import (
    TRAIN_MODE_REUSE,
    check_choice,
    check_divides,
    check_eval,
    check_positive,
    make_config,
)
from ._registry import register_model
from .vision import ImageClassifier, ImageConfig, patchify, seeded

#: bytes of logits per tile of copies in the fused attention on the host
#: (:meth:`Attention.forward_fused`): a tile's queries, logits and weights stay in cache
ATTENTION_TILE_BYTES = 8 << 20
#: the fewest query rows (copies × query tokens) in a tile: on two threads MKL's float32 product
#: of fewer rows by the 64-wide fused query weights ran at well under its rate from 1,024 rows on,
#: and ViT-small's tiles of 15 copies (975 rows) were slower than tiles of 16
#: (docs/benchmarks.md, *ViT-small's attention tiles of 1,024 rows*)
ATTENTION_TILE_ROWS = 1024

#: local reuse's first block (:meth:`Attention._forward_reached`) recomputes in full a query's
#: row whose clean weight on the keys a patch reached exceeds this share (the update would
#: subtract most of the row's sum, magnifying rounding)
REACHED_SHARE = 0.5

#: ``torch.compiler.is_compiling`` is new in torch 2.3. On 2.1/2.2 "not compiling" is assumed:
#: under ``torch.compile`` there, reading the LSA temperature may cost a graph break, same numbers.
_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


# ---------------------------------------------------------------- transformer parts


class Mixtures(NamedTuple):
    """A fused attention's clean rows (query token, head), for copies that change a few tokens
    (:meth:`Attention._forward_reached`)."""

    exps: Tensor  #: (N, T keys, heads, T queries) exp(logit − the row's maximum); LSA's diagonal 0
    top: Tensor  #: (N, heads, T) the rows' maxima
    sums: Tensor  #: (N, heads, T) the rows' sums of ``exps``
    values: Tensor  #: (N, T, heads, dim out) each token through each head's output projection
    mixed: Tensor  #: (N, T, heads, dim out) each row's ``exps``-weighted sum of ``values``
    key_w: Tensor  #: (dim, heads·dim) token j to M_a x_j for every head a (fused query-key)
    value_w: Tensor  #: (dim, heads·dim out) token to ``values`` (fused value-output)


class Reached(NamedTuple):
    """Copies of clean images (:class:`Mixtures`): each copy's image ``src`` (B,) and the
    rows ``where`` (B, k) in which its tokens differ."""

    mixtures: Mixtures
    src: Tensor
    where: Tensor


class Attention(nn.Module):
    """Multi-head self-attention, optionally with Lee et al.'s locality self-attention (LSA).

    Logits A = Q Kᵀ · s. Plain: s = 1/√d_head, fixed. LSA: s = exp(θ) with θ learnable and
    initialised to log(1/√d_head) (a learnable temperature τ = 1/s starting at √d_head; the log
    keeps it positive), and the diagonal of A masked so a token cannot attend to itself, which
    sharpens attention onto *other* tokens. ``kind="softmax"``: weights softmax(A) row-wise;
    ``kind="relu"``: relu(A), unnormalised (docs/definitions.md#vision-models), the diagonal then
    being 0.
    """

    def __init__(
        self, dim: int, heads: int, dim_head: int, dropout: float, kind: str, locality: bool
    ) -> None:
        super().__init__()
        self.heads, self.kind, self.locality = heads, kind, locality
        self.qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout))
        self.drop = nn.Dropout(dropout)
        log_scale = torch.tensor(math.log(dim_head**-0.5))
        if locality:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.heads_of(self.qkv(x))  # each (B, heads, T, d_head)

    def _weights(self, q: Tensor, k: Tensor) -> Tensor:
        """Weights of queries ``q`` (tokens 0…Tq−1) over all keys ``k``."""
        logits = q @ k.transpose(-1, -2) * self.log_scale.exp()
        if self.locality:
            t, tq = logits.shape[-1], logits.shape[-2]
            eye = torch.eye(t, dtype=torch.bool, device=logits.device)[:tq]
            logits = logits.masked_fill(eye, float("-inf"))  # relu(-inf) = 0 as well
        return logits.softmax(-1) if self.kind == "softmax" else F.relu(logits)

    def attention_weights(self, x: Tensor) -> Tensor:
        """Attention matrix (B, heads, T, T) on (already normalised) tokens ``x`` (B, T, dim)."""
        q, k, _ = self._split(x)
        return self._weights(q, k)

    def _host_inference(self, q: Tensor) -> bool:
        """Evaluation without autograd on the host, outside ``torch.compile``: reading the
        temperature as a Python number is free there (on a GPU it would wait for the device;
        under compile it would break the graph)."""
        return (q.device.type == "cpu" and not self.training and not torch.is_grad_enabled()
                and not _is_compiling())

    def forward(self, x: Tensor) -> Tensor:
        return self.project(*self._split(x))

    def project(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """:meth:`attend`, heads merged and projected: (B, Tq, dim)."""
        return self.out(self.attend(q, k, v).transpose(1, 2).flatten(2))

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of queries ``q`` (B, heads, Tq, d_head) over all T keys and values; the
        queries are tokens 0…Tq−1 (for LSA's diagonal mask), so Tq < T computes the first rows
        only (local reuse reads the CLS row alone). Returns (B, heads, Tq, d_head)."""
        if self.kind == "softmax":
            # the fused kernel avoids materialising the (B, heads, T, T) logits and the copies
            # of the split heads: ~2.7× faster attention on CPU (1 thread, ViT-small shapes).
            # The scale is folded into q so that a learnable LSA temperature still gets a
            # gradient; the boolean mask marks the keys a query may attend to.
            allowed = None
            if self.locality:
                t, tq = k.shape[-2], q.shape[-2]
                allowed = ~torch.eye(t, dtype=torch.bool, device=q.device)[:tq]
            if self._host_inference(q):
                # no gradient wanted: the kernel applies the scale itself, sparing a scaled
                # copy of q (~4% of ViT-small's forward on 2 CPU threads, same numbers)
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=allowed, scale=math.exp(float(self.log_scale)))
            return F.scaled_dot_product_attention(
                q * self.log_scale.exp(), k, v, attn_mask=allowed, scale=1.0,
                dropout_p=self.drop.p if self.training else 0.0,
            )
        return self.drop(self._weights(q, k)) @ v

    @torch.no_grad()
    def fused(self) -> tuple[Tensor, Tensor] | None:
        """Weights for :meth:`forward_fused`: (dim, heads·dim) ``qk`` and (dim, heads·dim)
        ``vo``, or None where they would not save work (a qkv bias, relu attention, or heads
        narrower than the tokens).

        Without a bias, head h's logits are x W_qᵀ W_k xᵀ·s = (x M_h) xᵀ with M_h = s·W_qᵀW_k,
        and its share of the output projection A_h x W_vᵀ W_oᵀ = (A_h x) N_h: the keys and values
        are the normalised tokens themselves, so the K and V projections (and their
        heads·d_head-wide activations) drop out. Equal up to float rounding."""
        dim, inner = self.qkv.in_features, self.qkv.out_features // 3
        d = inner // self.heads
        if self.kind != "softmax" or self.qkv.bias is not None or dim > d:
            return None
        wq, wk, wv = self.qkv.weight.view(3, self.heads, d, dim)
        qk = torch.einsum("hid,hie->dhe", wq, wk).reshape(dim, self.heads * dim)
        wo = self.out[0].weight.view(-1, self.heads, d)
        vo = torch.einsum("hie,ohi->ohe", wv, wo).reshape(wo.shape[0], self.heads * dim)
        return qk * self.log_scale.exp(), vo

    def forward_fused(self, x: Tensor, fused: tuple[Tensor, Tensor],
                      rows: int | None = None, scratch: dict[str, Tensor] | None = None,
                      clean: Reached | None = None) -> Tensor:
        """:meth:`forward` on normalised tokens ``x`` (B, T, dim) by :meth:`fused`'s weights;
        ``rows``: the outputs of the first ``rows`` tokens only. ``scratch``: a dict in which
        the heads·dim-wide intermediates keep their memory from call to call (host inference
        only; see :func:`_scratch`). ``clean``: copies of clean images that differ from them in
        a few rows (:class:`Reached`, local reuse's first block), computed by
        :meth:`_forward_reached` where the memory is kept."""
        qk, vo = fused
        b, t, dim = x.shape
        xq = x if rows is None else x[:, :rows]
        tq = xq.shape[1]
        # every head has the same keys and values, the tokens x: the logits of all heads are
        # one product per copy, rows (query token, head) against the t tokens — one GEMM with
        # heads·tq rows, where an attention kernel would run heads small ones (and on CPU its
        # flash kernel ran at a third of the GEMM rate for these shapes)
        store = scratch if self.keeps(x, qk, scratch) else None

        def kept(key: str, shape: tuple[int, ...] | torch.Size) -> Tensor | None:
            """Memory kept from the last call for an intermediate (None: a fresh tensor)."""
            return None if store is None else _scratch(store, key, shape, x)

        if clean is not None and store is not None and rows is None:
            return self.out[1](self._forward_reached(x, fused, clean, kept))
        # on the host a tile of copies at a time: its queries, logits, weights and mixed tokens
        # (together about 2 MB a copy for ViT-small) stay in cache from the first product
        # through the softmax to the output projection. Under autocast, without kept memory, a
        # whole chunk's (tens of MB, fresh at every call) could have its pages faulted in again
        # at every call (docs/benchmarks.md, ViT-small's attention in tiles)
        tile = b if not self._host_inference(x) else max(
            1, ATTENTION_TILE_BYTES // (tq * self.heads * t * _product_size(x)),
            -(-ATTENTION_TILE_ROWS // tq))
        bias = self.out[0].bias
        out = kept("out", (b * tq, vo.shape[0]))
        parts = []  # without kept memory: each tile's projection a fresh tensor
        for lo in range(0, b, tile):
            hi = min(lo + tile, b)
            y = self._attend_fused(x[lo:hi], xq[lo:hi], qk, kept,
                                   kept("y", (hi - lo, tq * self.heads, dim)))
            y = y.reshape(-1, self.heads * dim)
            if out is None:
                parts.append(F.linear(y, vo, bias))
            elif bias is not None:
                torch.addmm(bias, y, vo.t(), out=out[lo * tq:hi * tq])
            else:
                torch.mm(y, vo.t(), out=out[lo * tq:hi * tq])
        if out is None:
            out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.out[1](out.view(b, tq, -1))

    def _attend_fused(self, x: Tensor, xq: Tensor, qk: Tensor, kept: Any,
                      into: Tensor | None) -> Tensor:
        """Every head's attention output (B, Tq·heads, dim) of queries ``xq`` over tokens ``x``
        (before the output projection), written ``into`` if given."""
        q, logits = self._logits(xq, x, qk, kept)
        self._mask_self(logits)
        keep = kept("weights", logits.shape)
        weights = (logits.softmax(-1) if keep is None
                   else torch.ops.aten._softmax.out(logits, -1, False, out=keep))
        return torch.bmm(weights, x.to(q.dtype), out=into)

    def _logits(self, xq: Tensor, x: Tensor, qk: Tensor, kept: Any = None
                ) -> tuple[Tensor, Tensor]:
        """The queries (B, Tq·heads, dim) of tokens ``xq`` by the fused ``qk`` and their logits
        (B, Tq·heads, T) against the tokens ``x``, before LSA's mask; ``kept``: see
        :meth:`forward_fused` (None: fresh tensors)."""
        b, tq, dim = xq.shape
        keep = kept or (lambda key, shape: None)
        q = torch.matmul(xq, qk, out=keep("q", (b, tq, self.heads * dim)))
        q = q.view(b, tq * self.heads, dim)
        logits = torch.bmm(q, x.to(q.dtype).transpose(1, 2),
                           out=keep("logits", (b, tq * self.heads, x.shape[1])))
        return q, logits

    def _mask_self(self, logits: Tensor) -> None:
        """LSA: query token i never attends to key i — the diagonal of ``logits`` (B,
        Tq·heads, T), rows (query token, head), set to −inf in place (nothing without LSA)."""
        if self.locality:
            b, rows, t = logits.shape
            logits.view(b, rows // self.heads, self.heads, t).diagonal(
                dim1=1, dim2=3).fill_(float("-inf"))

    @torch.no_grad()
    def clean_mixtures(self, x: Tensor, fused: tuple[Tensor, Tensor]) -> Mixtures:
        """What :meth:`_forward_reached` reads of clean normalised tokens ``x`` (N, T, dim):
        :class:`Mixtures`."""
        qk, vo = fused
        n, t, dim = x.shape
        heads, d_out = self.heads, vo.shape[0]
        _, logits = self._logits(x, x, qk)
        self._mask_self(logits)
        logits = logits.view(n, t, heads, t)  # (query, head, key)
        top = logits.amax(-1)  # finite: every row has a key besides its own
        e = torch.exp(logits - top[..., None])
        # each token through each head's share of the output projection: (N, T, heads, dim out)
        value_w = vo.view(d_out, heads, dim).permute(2, 1, 0).reshape(dim, heads * d_out)
        values = (x @ value_w).view(n, t, heads, d_out)
        mixed = torch.einsum("niaj,njao->niao", e, values)
        key_w = qk.view(dim, heads, dim).permute(2, 1, 0).reshape(dim, heads * dim)
        return Mixtures(e.permute(0, 3, 2, 1).contiguous(), top.transpose(1, 2).contiguous(),
                        e.sum(-1).transpose(1, 2).contiguous(), values, mixed, key_w, value_w)

    def _forward_reached(self, x: Tensor, fused: tuple[Tensor, Tensor], clean: Reached,
                         kept: Any) -> Tensor:
        """The projected attention output (B, T, dim) of copies whose normalised tokens ``x``
        differ from their clean image's only in the rows ``clean.where`` (local reuse's first
        block), exact up to float rounding.

        A query the patch did not reach keeps its logits against every key it did not reach:
        with the clean row's exponentials e_j = exp(l_j − m) (m its maximum), sum Z and
        projected mixture P = Σ_j e_j V_j (V_j: token j through the head's share of the output
        projection), its new output is (f·(P − Σ_R e_j V_j) + Σ_R e'_j V'_j) / (f·(Z − Σ_R e_j)
        + Σ_R e'_j), the sums over the reached keys R, e'_j = exp(l'_j − m'), m' the larger of
        m and the new logits, f = exp(m − m'). Only the logits against the reached keys are
        computed. The subtraction leaves the other keys' share of the clean sum; a row where
        the reached keys held more than :data:`REACHED_SHARE` of it (rounding would be
        magnified) is computed in full, as are the reached queries' rows."""
        qk, vo = fused
        n, t, dim = x.shape
        heads, d_out = self.heads, vo.shape[0]
        mix, src, where = clean.mixtures, clean.src, clean.where
        k = where.shape[1]
        xr = x.gather(1, where[..., None].expand(-1, -1, dim))  # (B, k, dim)
        # rows (reached key j, head a), columns query i: l'_{ja,i} = x_i · (M_a x_j)
        new = torch.bmm((xr @ mix.key_w).view(n, k * heads, dim), x.transpose(1, 2))
        new = new.view(n, k, heads, t)
        old = mix.exps[src[:, None], where]  # (B, k, heads, T)
        top = mix.top.index_select(0, src)  # (B, heads, T)
        peak = torch.maximum(top, new.amax(1))
        f = top.sub_(peak).exp_()
        e_new = new.sub_(peak[:, None]).exp_()
        z, reached = mix.sums.index_select(0, src), old.sum(1)
        redo = reached > REACHED_SHARE * z  # rows the reached keys dominated
        total = z.sub_(reached).mul_(f).add_(e_new.sum(1))  # the other keys' share, and the new
        scale = f.div_(total)
        old.mul_(scale[:, None]).neg_()
        e_new.div_(total[:, None])
        v_new = (xr @ mix.value_w).view(n, k * heads, d_out)
        v_old = mix.values[src[:, None], where].view(n, k * heads, d_out)
        out = torch.bmm(old.view(n, k * heads, t).transpose(1, 2), v_old,
                        out=kept("out", (n, t, d_out)))
        out.baddbmm_(e_new.view(n, k * heads, t).transpose(1, 2), v_new)
        # the clean mixtures, rescaled: for each run of copies of one image, a (copies × heads)
        # by (heads × dim out) product for each query token
        first = 0
        for image, count in zip(*(v.tolist() for v in torch.unique_consecutive(
                src, return_counts=True)), strict=True):
            part = slice(first, first + count)
            out[part] += torch.bmm(scale[part].permute(2, 0, 1), mix.mixed[image]).transpose(0, 1)
            first += count
        # rows computed in full: the reached queries (their rows of every head) ...
        q = (xr @ qk).view(n, k * heads, dim)
        logits = torch.bmm(q, x.transpose(1, 2)).view(n, k, heads, t)
        if self.locality:
            logits.scatter_(3, where[:, :, None, None].expand(-1, -1, heads, 1), float("-inf"))
        y = torch.bmm(logits.view(n, k * heads, t).softmax(-1), x).view(n, k, heads * dim)
        out.scatter_(1, where[..., None].expand(-1, -1, d_out), y @ vo.t())
        # ... and any other row the reached keys dominated
        redo = redo.any(1)
        redo.scatter_(1, where, False)
        if redo.any():
            b_idx, i_idx = redo.nonzero(as_tuple=True)
            keys = x.index_select(0, b_idx)  # (F, T, dim)
            logits = torch.bmm((x[b_idx, i_idx] @ qk).view(-1, heads, dim), keys.transpose(1, 2))
            if self.locality:
                logits[torch.arange(len(i_idx), device=x.device), :, i_idx] = float("-inf")
            y = torch.bmm(logits.softmax(-1), keys).view(-1, heads * dim)
            out[b_idx, i_idx] = y @ vo.t()
        bias = self.out[0].bias
        return out if bias is None else out.add_(bias)

    def keeps(self, x: Tensor, qk: Tensor, scratch: dict[str, Tensor] | None) -> bool:
        """Whether :meth:`forward_fused` on ``x`` writes into ``scratch``'s kept memory: host
        inference (:meth:`_host_inference`) in the weights' dtype, without autocast."""
        return (scratch is not None and self._host_inference(x) and x.dtype == qk.dtype
                and not autocast_on(x.device.type))

    def heads_of(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``qkv`` (B, T, 3·heads·d_head), the output of :attr:`qkv`, split as in forward."""
        b, t, _ = qkv.shape
        q, k, v = qkv.view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return q, k, v

    def first_row(self, x: Tensor) -> Tensor:
        """Token 0's output of this attention on normalised tokens ``x`` (B, T, dim): keys and
        values of every token, the query of token 0 alone. (B, 1, dim)."""
        w, bias = self.qkv.weight, self.qkv.bias
        inner = w.shape[0] // 3
        q = F.linear(x[:, :1], w[:inner], None if bias is None else bias[:inner])
        kv = F.linear(x, w[inner:], None if bias is None else bias[inner:])
        b, t, _ = x.shape
        k, v = kv.view(b, t, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        q = q.view(b, 1, self.heads, -1).transpose(1, 2)
        return self.project(q, k, v)


def _product_size(x: Tensor) -> int:
    """Bytes per element of the products on ``x``: autocast's dtype where it is on."""
    if autocast_on(x.device.type):
        return autocast_dtype(x.device.type).itemsize
    return x.element_size()


def _scratch(store: dict[str, Tensor], key: str, shape: tuple[int, ...] | torch.Size,
             like: Tensor) -> Tensor:
    """A ``shape`` tensor of ``like``'s dtype and device on memory kept in ``store`` under
    ``key`` (grown when too small). On the host a fresh tensor of tens of MB is mapped from the
    system on every allocation and its pages fault in again; memory kept across the calls of a
    batch's copies does not (local reuse's fused attention: docs/benchmarks.md, ViT-small)."""
    need = math.prod(shape)
    buf = store.get(key)
    if buf is None or buf.numel() < need or buf.dtype != like.dtype or buf.device != like.device:
        buf = store[key] = torch.empty(need, dtype=like.dtype, device=like.device)
    return buf[:need].view(shape)


def _shares(x: Tensor, buf: Tensor | None) -> bool:
    """Whether ``x`` lies in ``buf``'s memory."""
    return buf is not None and x.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()


class Block(nn.Module):
    """Pre-LN transformer block: x + Attn(LN x), then x + MLP(LN x) with a GELU MLP."""

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        mlp_dim: int,
        dropout: float,
        kind: str,
        locality: bool,
    ) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dim_head, dropout, kind, locality)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim), nn.Dropout(dropout),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward_qkv(self, x: Tensor, qkv: Tensor) -> Tensor:
        """This block on tokens ``x`` whose ``attn.qkv(ln1(x))`` is given as ``qkv``."""
        x = x + self.attn.project(*self.attn.heads_of(qkv))
        return x + self.mlp(self.ln2(x))

    def forward_first_row(self, x: Tensor) -> Tensor:
        """Token 0's output (B, 1, dim): the only row a classifier reading the CLS token
        uses of its last block."""
        c = x[:, :1] + self.attn.first_row(self.ln1(x))
        return c + self.mlp(self.ln2(c))

    def forward_fused(self, x: Tensor, fused: tuple[Tensor, Tensor] | None,
                      first_row: bool = False, scratch: dict[str, Tensor] | None = None,
                      clean: Reached | None = None) -> Tensor:
        """This block (``first_row``: token 0's output alone) with :meth:`Attention.fused`
        weights, or as :meth:`forward`/:meth:`forward_first_row` where ``fused`` is None;
        ``scratch`` and ``clean``: see :meth:`Attention.forward_fused`."""
        if fused is None:
            return self.forward_first_row(x) if first_row else self(x)
        rows = 1 if first_row else None
        c = x if rows is None else x[:, :rows]
        a = self.attn.forward_fused(self.ln1(x), fused, rows, scratch, clean)
        if scratch is None or not self.attn.keeps(x, fused[0], scratch):
            c = c + a
            return c + self.mlp(self.ln2(c))
        # kept memory (host inference): the residual sums in place, the MLP's hidden layer and
        # the block's output in buffers kept from call to call, the GELU in place. Fresh tensors
        # of this size cost page faults on every call (the GELU ran at a fifth of its speed).
        # The same operations in the same order as the lines above.
        c = a.add_(c)  # the attention's output is kept memory of its own
        b, tq, dim = c.shape
        up, down = self.mlp[0], self.mlp[3]
        h = torch.addmm(up.bias, self.ln2(c).view(b * tq, dim), up.weight.t(),
                        out=_scratch(scratch, "hidden", (b * tq, up.out_features), c))
        torch.ops.aten.gelu_(h, approximate=self.mlp[1].approximate)
        # two output buffers in turn: this block's input may be the last block's output
        key = "block1" if _shares(x, scratch.get("block0")) else "block0"
        out = torch.addmm(down.bias, h, down.weight.t(),
                          out=_scratch(scratch, key, (b * tq, dim), c)).view(b, tq, dim)
        return out.add_(c)


# ---------------------------------------------------------------- ViT-small (Lee et al. 2021)


@dataclass(frozen=True)
class ViTSmallConfig(ImageConfig):
    """ViT for small datasets. Defaults *(paper code)*: dim 64, depth 8, heads 32, dim_head 64,
    mlp 512, dropout 0.1, patch 4.

    ``shift``: the shifted copies of Shifted Patch Tokenization. ``"axis"`` (default) shifts by
    one pixel left/right/up/down, as the public port the paper code used; ``"diagonal"`` shifts
    by half a patch towards the four corners, as Lee et al. describe; ``"none"`` disables SPT.
    ``locality``: LSA (learnable temperature + diagonal mask) on, or plain scaled attention.
    ``attention``: ``"softmax"`` or ``"relu"`` (unnormalised relu(QKᵀ·s),
    docs/definitions.md#vision-models).
    """

    patch_size: int = 4
    dim: int = 64
    depth: int = 8
    heads: int = 32
    dim_head: int = 64
    mlp_dim: int = 512
    dropout: float = 0.1
    emb_dropout: float = 0.1
    shift: str = "axis"
    locality: bool = True
    attention: str = "softmax"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "patch_size", "dim", "depth", "heads", "dim_head", "mlp_dim")
        check_divides(self.patch_size, self.image_size, "patch_size")
        check_choice(self, "shift", ("axis", "diagonal", "none"))
        check_choice(self, "attention", ("softmax", "relu"))


class ShiftedPatchTokenizer(nn.Module):
    """SPT: concatenate the image with 4 shifted copies (zero fill) → 5·C channels, cut p×p
    patches, LayerNorm + Linear to ``dim``. Shifted copies let each patch see its neighbours'
    border pixels, widening the receptive field of one token on small images."""

    def __init__(self, in_channels: int, patch: int, dim: int, shift: str) -> None:
        super().__init__()
        s = 1 if shift == "axis" else max(1, patch // 2)
        # F.pad(x, (left, right, top, bottom)); a negative pad crops, so (s, -s, ...) moves the
        # content s pixels right while keeping the size
        axis = [(s, -s, 0, 0), (-s, s, 0, 0), (0, 0, s, -s), (0, 0, -s, s)]
        diagonal = [(s, -s, s, -s), (-s, s, s, -s), (s, -s, -s, s), (-s, s, -s, s)]
        self.pads = {"axis": axis, "diagonal": diagonal, "none": []}[shift]
        self.patch = patch
        patch_dim = (1 + len(self.pads)) * in_channels * patch * patch
        self.norm, self.proj = nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim)

    def pieces(self, x: Tensor) -> Tensor:
        """(B, T, 5·C·p²): each patch of the image and of its shifted copies, before the
        LayerNorm and projection."""
        return patchify(torch.cat([x, *(F.pad(x, pad) for pad in self.pads)], dim=1), self.patch)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.norm(self.pieces(x)))


class ViTSmall(ImageClassifier):
    """SPT tokens + CLS token + learned positions → pre-LN LSA blocks → LN + Linear on CLS."""

    def __init__(self, config: ViTSmallConfig | None = None) -> None:
        cfg = config or ViTSmallConfig()
        super().__init__(cfg, cfg.patch_size)
        n = (cfg.image_size // cfg.patch_size) ** 2
        self.tokenizer = ShiftedPatchTokenizer(cfg.in_channels, cfg.patch_size, cfg.dim, cfg.shift)
        # N(0, 1) init of CLS and positions, as the paper code
        self.cls = nn.Parameter(torch.randn(1, 1, cfg.dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, cfg.dim))
        self.drop = nn.Dropout(cfg.emb_dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.heads, cfg.dim_head, cfg.mlp_dim, cfg.dropout, cfg.attention,
                  cfg.locality)
            for _ in range(cfg.depth)
        )  # fmt: skip
        self.head = nn.Sequential(nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.num_classes))

    def _embed(self, x: Tensor) -> Tensor:
        t = self.tokenizer(x)
        return torch.cat([self.cls.expand(len(t), -1, -1), t], dim=1) + self.pos

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        t = self.drop(self._embed(x))
        for blk in self.blocks:
            t = blk(t)
        return self.head(t[:, 0])

    # -- local reuse (senslab.tokens.Patches): noise on one patch changes only the SPT tokens
    # whose patch, in the image or in one of its shifted copies, overlaps it (5 of 64 for a
    # patch-sized noise with one-pixel axis shifts). A perturbed copy recomputes those tokens and
    # their rows of the first block's Q, K and V (the other rows are the cached clean ones), runs
    # the middle blocks in full, and the last block for the CLS row alone, the only row the head
    # reads. Where heads are as wide as the tokens (ViT-small: 32 heads of 64 on 64-wide tokens)
    # every block runs on fused query-key and value-output weights instead (Attention.fused):
    # the keys and values are the normalised tokens themselves, so no K/V projections; the first
    # block then updates its clean rows for the reached tokens (Attention._forward_reached): the
    # logits against the reached keys alone, the rest from the cache. Same predictions as a full
    # forward up to float rounding.

    @torch.no_grad()
    def local_cache(self, x: Tensor, patch: int) -> dict[str, Any]:
        """Clean tokens of images ``x`` and their first block's ``qkv`` rows."""
        check_eval(self, "local", "Patches(p, reuse_local=False)")
        self.check_input(x)
        t = self._embed(x)
        first = self.blocks[0]
        fused = [blk.attn.fused() for blk in self.blocks]
        qkv = first.attn.qkv(first.ln1(t)) if fused[0] is None else None
        # the first block's clean rows of fused attention (Attention._forward_reached)
        clean = None if fused[0] is None else first.attn.clean_mixtures(first.ln1(t), fused[0])
        return {"x": x, "tokens": t, "qkv": qkv, "fused": fused, "clean": clean,
                "reach": self._reach(x.shape[2], x.shape[3], patch)}

    def _reach(self, h: int, w: int, patch: int) -> int:
        """The most tokens one ``patch``×``patch`` patch reaches, over every patch position: a
        fixed number of tokens per copy to recompute, known before any copy (no read of the
        device per chunk, and no data-dependent shape under ``torch.compile``).

        The tokenizer's pieces of an image whose pixels hold their patch's number (1-based; the
        shifted copies' zero fill is 0) name the patches each token reads: the tokens that
        :meth:`reached_tokens` marks for every patch position at once, on the host, in memory of
        the tokens' size. (One mask per position, (H/p)²·H·W values growing as H⁴, took 1.7 GB
        and 6 s for 160-pixel images and ``Patches(4)``, again at every chunk's cache.)"""
        gh, gw = h // patch, w // patch
        rows = torch.arange(h, dtype=torch.float64)[:, None].div(patch, rounding_mode="floor")
        cols = torch.arange(w, dtype=torch.float64)[None, :].div(patch, rounding_mode="floor")
        cells = (rows * gw + cols + 1).view(1, 1, h, w)  # exact in float64
        read = self.tokenizer.pieces(cells)[0].long()  # (T, 5·p²): the patch of each value
        hit = torch.zeros(read.shape[0], gh * gw + 1, dtype=torch.bool)
        hit.scatter_(1, read, True)
        return int(hit[:, 1:].sum(0).max())

    def local_copy_bytes(self, cache: dict[str, Any]) -> int:
        """Bytes per copy of the memory :meth:`forward_local` keeps in ``cache["scratch"]`` from
        call to call (fused blocks on the host; 0 where it keeps none): the queries, logits,
        softmax weights and mixed tokens (heads·T wide), the attention's output, the MLP's hidden
        layer and two block outputs. The chunk sizing adds it to what its probe measures, which
        sees temporaries only. Where a chunk is larger than a tile of the attention
        (:data:`ATTENTION_TILE_BYTES`), the queries, logits, weights and mixed tokens are kept
        for one tile only, so this per-copy count bounds the memory from above."""
        if not cache.get("scratch"):
            return 0
        t, dim = cache["tokens"].shape[1:]
        attn, mlp = self.blocks[0].attn, self.blocks[0].mlp[0].out_features
        wide = t * attn.heads
        return cache["tokens"].element_size() * (
            2 * wide * dim + 2 * wide * t + 3 * t * dim + t * mlp)

    def reached_tokens(self, mask: Tensor) -> Tensor:
        """(n, T) bool: the image tokens that pixels marked in ``mask`` (n, 1, H, W) reach
        through the tokenizer's shifted copies."""
        return self.tokenizer.pieces(mask).amax(-1) > 0

    def forward_local(self, cache: dict[str, Any], rows: Tensor, top: Tensor, left: Tensor,
                      patch: Tensor) -> Tensor:
        """Logits of copies of the cached images ``rows`` whose pixels at ``top``/``left``
        (a patch) are replaced by ``patch`` (n, C, p, p)."""
        if self.training:  # the reuse applies no dropout, which a train-mode forward would
            raise RuntimeError(TRAIN_MODE_REUSE)
        x = cache["x"].index_select(0, rows)
        n, c, h, w = x.shape
        p = patch.shape[-1]
        idx = torch.arange(n, device=x.device)
        at = (idx, slice(None), top // p, slice(None), left // p, slice(None))
        x.view(n, c, h // p, p, w // p, p)[at] = patch.to(x.dtype)
        mask = torch.zeros(n, 1, h, w, dtype=x.dtype, device=x.device)
        mask.view(n, 1, h // p, p, w // p, p)[at] = 1.0
        reached = self.reached_tokens(mask)
        k = cache["reach"]
        # the reached tokens first; a copy that reaches fewer than k recomputes a few clean
        # tokens besides, which changes nothing
        order = torch.argsort((~reached).to(torch.int8), dim=1, stable=True)[:, :k]
        spt = self.tokenizer
        pieces = spt.pieces(x)
        pieces = pieces.gather(1, order[..., None].expand(-1, -1, pieces.shape[-1]))
        where = order + 1  # the CLS token comes first
        new = spt.proj(spt.norm(pieces)) + self.pos[0, where]
        t = cache["tokens"].index_select(0, rows)
        t.scatter_(1, where[..., None].expand(-1, -1, t.shape[-1]), new.to(t.dtype))
        first, fused = self.blocks[0], cache["fused"]
        scratch = cache.setdefault("scratch", {})  # the fused attention's kept memory
        if fused[0] is None:
            qkv = cache["qkv"].index_select(0, rows)
            fresh = first.attn.qkv(first.ln1(new))
            qkv.scatter_(1, where[..., None].expand(-1, -1, qkv.shape[-1]), fresh.to(qkv.dtype))
            t = first.forward_qkv(t, qkv)
        else:  # fused weights: the clean rows, updated for the reached tokens
            t = first.forward_fused(t, fused[0], scratch=scratch,
                                    clean=Reached(cache["clean"], rows, where))
        if len(self.blocks) > 1:
            for blk, f in zip(self.blocks[1:-1], fused[1:-1], strict=True):
                t = blk.forward_fused(t, f, scratch=scratch)
            t = self.blocks[-1].forward_fused(t, fused[-1], first_row=True, scratch=scratch)
        return self.head(t[:, 0])


@register_model("vit_small", config=ViTSmallConfig())
def vit_small(**overrides: Any) -> ViTSmall:
    """ViT for small datasets (Lee et al. 2021) with SPT and LSA; see :class:`ViTSmallConfig`."""
    return seeded(ViTSmall, make_config(ViTSmallConfig, overrides))


# ---------------------------------------------------------------- ViT-simple (Beyer et al. 2022)


@dataclass(frozen=True)
class ViTSimpleConfig(ImageConfig):
    """Simple ViT: fixed 2-D sin-cos positions, mean pooling, no dropout, no CLS. Sizes *(ours)*:
    dim 256, depth 6, heads 8, dim_head 32, mlp 512. The paper text's depth, heads and MLP width
    were lost from our copy; the paper code's defaults (``cifar_sens.py``) are dim 64, depth 8,
    heads 32, mlp 512, and its commands are not published (docs/fidelity.md)."""

    patch_size: int = 4
    dim: int = 256
    depth: int = 6
    heads: int = 8
    dim_head: int = 32
    mlp_dim: int = 512
    attention: str = "softmax"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "patch_size", "dim", "depth", "heads", "dim_head", "mlp_dim")
        check_divides(self.patch_size, self.image_size, "patch_size")
        check_choice(self, "attention", ("softmax", "relu"))
        if self.dim % 4:
            raise ValueError(
                f"ViTSimpleConfig.dim must be a multiple of 4 (2-D sin-cos positions use dim/4 "
                f"frequencies per axis and function), got {self.dim}"
            )


def sincos_2d(rows: int, cols: int, dim: int, temperature: float = 10_000.0) -> Tensor:
    """Fixed positions (rows·cols, dim): for token (r, c) and frequencies ω_j = T^(−j/(dim/4−1)),
    j < dim/4, the concatenation [sin(c ω), cos(c ω), sin(r ω), cos(r ω)]."""
    q = dim // 4
    omega = temperature ** -(torch.arange(q, dtype=torch.float32) / max(q - 1, 1))
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    r = r.flatten().float()[:, None] * omega
    c = c.flatten().float()[:, None] * omega
    return torch.cat([c.sin(), c.cos(), r.sin(), r.cos()], dim=1)


class ViTSimple(ImageClassifier):
    """Patch embedding LN → Linear → LN (as the public simple ViT), plus sin-cos positions →
    pre-LN blocks → mean over tokens → LN + Linear."""

    def __init__(self, config: ViTSimpleConfig | None = None) -> None:
        cfg = config or ViTSimpleConfig()
        super().__init__(cfg, cfg.patch_size)
        g, patch_dim = cfg.image_size // cfg.patch_size, cfg.in_channels * cfg.patch_size**2
        self.embed = nn.Sequential(
            nn.LayerNorm(patch_dim), nn.Linear(patch_dim, cfg.dim), nn.LayerNorm(cfg.dim)
        )
        self.register_buffer("pos", sincos_2d(g, g, cfg.dim), persistent=False)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.heads, cfg.dim_head, cfg.mlp_dim, 0.0, cfg.attention, False)
            for _ in range(cfg.depth)
        )
        self.head = nn.Sequential(nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.num_classes))

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        t = self.embed(patchify(x, self.config.patch_size)) + self.pos.to(x.dtype)
        for blk in self.blocks:
            t = blk(t)
        return self.head(t.mean(dim=1))


@register_model("vit_simple", config=ViTSimpleConfig())
def vit_simple(**overrides: Any) -> ViTSimple:
    """Simple ViT (Beyer et al. 2022); see :class:`ViTSimpleConfig`."""
    return seeded(ViTSimple, make_config(ViTSimpleConfig, overrides))


# ---------------------------------------------------------------- MLP and CNN (Fashion-MNIST)
