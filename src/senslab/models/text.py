"""Text classifiers of the main paper's language experiments
(docs/definitions.md#text-models): LSTM, RoBERTa-style
encoder (softmax or ReLU attention) and GPT-2-style decoder, all trained from scratch.

Every model maps ``input_ids`` (B, L) and an optional ``attention_mask`` (B, L) (true on real
tokens, padding on the right) to logits (B, num_classes). Each has a submodule ``embed_ln``: the
LayerNorm applied to the token embedding. Sensitivity adds noise to *its output* through a forward
hook, so the models use that output exactly as returned, and the transformers add positional
embeddings only afterwards: the noise hits the per-token embedding before positions are mixed in,
as the paper prescribes. ``default_tokens()`` is therefore ``Embedding("embed_ln")``.

This file also holds the pieces the small research models (``small.py``) share: seeded weight
initialisation, and a transformer block with softmax or ReLU
attention and pre-, post- or no LayerNorm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._onednn import missing_kernel
from ..tokens import Embedding
from ._config import (
    TRAIN_MODE_REUSE,
    check_eval,
    check_one_of,
    check_positive,
    override_config,
)
from ._registry import register_model
from .vision import check_seed, seeded

# --------------------------------------------------------------------------- shared helpers


def init_weights(
    module: nn.Module,
    generator: torch.Generator,
    *,
    linear_std: float | None = 0.02,
    embed_std: float = 0.02,
) -> None:
    """Re-initialise every Linear, Embedding, LayerNorm and LSTM in ``module`` from ``generator``
    (so a config's ``seed`` fixes the weights on its own; the registered factories build inside
    :func:`~senslab.models.vision.seeded`, so the layers' own default init, which these draws
    replace, neither moves the global RNG nor runs off the CPU under a default device).

    ``linear_std=None`` reproduces PyTorch's default Linear init, U(±1/√fan_in) on weight and
    bias; a number gives N(0, std²) weights and zero biases (GPT-2 / nanoGPT). Embeddings are
    N(0, embed_std²); LSTM weights and biases U(±1/√hidden) (PyTorch's default). Parameters
    owned directly by a model (not by these layers) are the model's own business.
    """
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                if linear_std is None:
                    bound = 1.0 / math.sqrt(m.in_features)
                    nn.init.uniform_(m.weight, -bound, bound, generator=generator)
                    if m.bias is not None:
                        nn.init.uniform_(m.bias, -bound, bound, generator=generator)
                else:
                    nn.init.normal_(m.weight, 0.0, linear_std, generator=generator)
                    if m.bias is not None:
                        m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, embed_std, generator=generator)
            elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
                m.weight.fill_(1.0)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.LSTM):
                bound = 1.0 / math.sqrt(m.hidden_size)
                for p in m.parameters():
                    nn.init.uniform_(p, -bound, bound, generator=generator)


def _bool_key_mask(key_mask: Tensor) -> Tensor:
    """``key_mask`` as a bool mask of the keys a query may read. A float mask went to
    ``scaled_dot_product_attention`` as an *additive* one: a 0/1 mask (a Hugging Face
    ``attention_mask.float()``) added 1 to real keys' scores and let the padding in, silently,
    while ReLU attention read the same mask as allowed/not; an integer one failed inside torch.
    Values other than 0 and 1 (an additive 0/−inf mask) are refused: read as "non-zero is
    allowed" they would allow the padding alone."""
    if key_mask.dtype == torch.bool:
        return key_mask
    odd = key_mask[(key_mask != 0) & (key_mask != 1)].flatten()
    if odd.numel():
        raise ValueError(
            f"key_mask must be 1 (True) on the keys a query may read and 0 (False) elsewhere, "
            f"but it holds {odd[0].item()!r}. For an additive mask (0 on allowed keys, a large "
            "negative number elsewhere) pass key_mask=(mask == 0)")
    return key_mask.to(torch.bool)


class SelfAttention(nn.Module):
    """Multi-head self-attention with weights w = φ(q·kᵀ/√d_head) over the allowed keys.

    ``attention="softmax"``: φ = softmax over keys (disallowed keys get weight 0).
    ``attention="relu"``: φ = relu, *unnormalised* (docs/definitions.md#text-models), disallowed
    keys multiplied by 0.
    Allowed keys: those with ``key_mask`` (B, L) true (bool, or 0/1 of any dtype) and, if
    ``causal``, at or before the query.
    """

    def __init__(
        self, dim: int, heads: int, *, attention: str = "softmax", dropout: float = 0.0,
        causal: bool = False,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}; use heads dividing dim")
        check_one_of("attention", attention, ("softmax", "relu"))
        self.heads, self.attention, self.causal, self.dropout = heads, attention, causal, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of ``x`` (B, L, dim), each (B, heads, L, d_head)."""
        b, length, d = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        b, length, d = x.shape
        q, k, v = self.split_heads(x)
        allowed = None  # (B or 1, 1, L, L), true where query i may look at key j
        if key_mask is not None:
            allowed = _bool_key_mask(key_mask)[:, None, None, :]
        if self.causal:
            tril = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
            allowed = tril[None, None] if allowed is None else allowed & tril
        p = self.dropout if self.training else 0.0
        if self.attention == "softmax":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)
        else:
            w = torch.relu(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
            if allowed is not None:
                w = w * allowed
            out = F.dropout(w, p, self.training) @ v
        return self.proj(out.transpose(1, 2).reshape(b, length, d))


class Block(nn.Module):
    """Transformer block: attention then MLP, each in a residual branch.

    ``norm="pre"``: x + f(LN(x)) (GPT-2); ``"post"``: LN(x + f(x)) (original Transformer,
    RoBERTa, Hahn & Rofin); ``"none"``: x + f(x) (Nanda et al.'s grokking model). The LayerNorms
    are ``ln1`` (attention) and ``ln2`` (MLP), registered in the order they run.
    """

    def __init__(
        self, dim: int, heads: int, mlp_dim: int, *, norm: str = "pre", activation: str = "gelu",
        attention: str = "softmax", dropout: float = 0.0, causal: bool = False,
    ) -> None:
        super().__init__()
        check_one_of("norm", norm, ("pre", "post", "none"))
        check_one_of("activation", activation, ("gelu", "relu"))
        self.norm = norm
        self.ln1 = nn.LayerNorm(dim) if norm != "none" else nn.Identity()
        self.attn = SelfAttention(dim, heads, attention=attention, dropout=dropout, causal=causal)
        self.ln2 = nn.LayerNorm(dim) if norm != "none" else nn.Identity()
        act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), act, nn.Linear(mlp_dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        if self.norm == "pre":
            x = x + self.drop(self.attn(self.ln1(x), key_mask))
            return x + self.drop(self.mlp(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x, key_mask)))
        return self.ln2(x + self.drop(self.mlp(x)))


# --------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class TextConfig:
    """Shared by the three text models (docs/definitions.md#text-models; the paper's 4 layers,
    width 256, 8 heads).

    ``vocab_size`` and ``pad_id`` must match the tokenizer (senslab's text datasets report both).
    The LSTM has no attention heads or position table; it ignores ``heads`` but still refuses
    inputs longer than ``max_len`` so all three models accept the same batches.
    """

    vocab_size: int = 8000
    max_len: int = 128
    dim: int = 256
    layers: int = 4
    heads: int = 8
    num_classes: int = 2
    dropout: float = 0.1
    pad_id: int = 1
    seed: int = 0  #: seeds the weight initialisation (an explicit generator, never global RNG)

    def __post_init__(self) -> None:
        # integers, not just positive: a float ``heads`` (8.0) built and failed only at the first
        # forward, inside a reshape; a bool ``layers`` (True) built one layer
        check_positive(self, "vocab_size", "max_len", "dim", "layers", "heads", "num_classes")
        check_seed(self)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(
                f"pad_id {self.pad_id} is not a token id of a vocabulary of size {self.vocab_size}"
            )


@dataclass(frozen=True)
class RobertaConfig(TextConfig):
    """RoBERTa-style encoder. ``attention``: "softmax" or "relu" (unnormalised relu(QKᵀ/√d)).
    ``norm``: "post" (RoBERTa's own LN(x + f(x)), the default) or "pre" (x + f(LN(x)) with a
    final LayerNorm; more stable for deep models)."""

    attention: str = "softmax"
    norm: str = "post"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_one_of("attention", self.attention, ("softmax", "relu"))
        check_one_of("norm", self.norm, ("post", "pre"))


def _real_tokens(input_ids: Tensor, attention_mask: Tensor | None, cfg: TextConfig) -> Tensor:
    """Validated (B, L) bool mask of real tokens (from ``attention_mask``, else ``!= pad_id``).

    Refused: token ids the embedding does not have (torch's bare "index out of range", on a GPU
    a device-side assert that ends the process), a mask holding values other than 0 and 1 (an
    additive or soft mask, whose non-zero entries would read as real tokens), zero-length
    sequences, and rows that are not real tokens followed only by padding."""
    if (input_ids.dim() != 2 or input_ids.is_floating_point() or input_ids.is_complex()
            or input_ids.dtype == torch.bool):
        raise ValueError(
            f"input_ids must be a (batch, length) tensor of token ids, got dtype "
            f"{input_ids.dtype} and shape {tuple(input_ids.shape)}"
        )
    if input_ids.dtype not in (torch.int64, torch.int32):
        # the embedding takes int64 or int32 ids only; uint16 (token files written by numpy)
        # failed in a comparison torch has no kernel for, int16 and uint8 deep in the embedding
        raise ValueError(
            f"input_ids has dtype {input_ids.dtype}, but the embedding takes token ids as int64 "
            f"or int32; pass input_ids.long()"
        )
    if input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids has shape {tuple(input_ids.shape)}: sequences of length 0 have no real "
            "token to read; every sequence needs at least one"
        )
    if input_ids.shape[1] > cfg.max_len:
        raise ValueError(
            f"sequence length {input_ids.shape[1]} exceeds max_len {cfg.max_len}; truncate the "
            f"inputs or build the model with max_len={input_ids.shape[1]}"
        )
    if attention_mask is None:
        mask = input_ids != cfg.pad_id
        binary = torch.ones((), dtype=torch.bool, device=input_ids.device)
    else:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, "
                             f"input_ids {tuple(input_ids.shape)}")
        binary = ((attention_mask == 0) | (attention_mask == 1)).all()
        mask = attention_mask.to(torch.bool)
    # one host sync for all checks: ids in the vocabulary, a 0/1 mask, a real first token, and
    # no real token after a pad
    outside, not_binary, first_pad, gap = torch.stack([
        ((input_ids < 0) | (input_ids >= cfg.vocab_size)).any(), ~binary,
        (~mask[:, 0]).any(), (mask[:, 1:] & ~mask[:, :-1]).any(),
    ]).tolist()
    if outside:
        raise ValueError(
            f"input_ids holds token ids from {int(input_ids.min())} to {int(input_ids.max())}, "
            f"but the model embeds only ids 0 to {cfg.vocab_size - 1} (vocab_size "
            f"{cfg.vocab_size}); build the model with the tokenizer's vocab_size"
        )
    if not_binary:
        odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)].flatten()[0]
        raise ValueError(
            f"attention_mask must be 1 (True) on real tokens and 0 (False) on padding, but it "
            f"holds {odd.item()!r}: every non-zero value would read as a real token. For an "
            "additive mask (0 on real tokens, a large negative number on padding) pass "
            "attention_mask=(mask == 0)"
        )
    if first_pad or gap:
        if first_pad:
            row = int((~mask[:, 0]).nonzero()[0, 0])
            what = f"row {row} starts with padding (an all-padding row, or left padding)"
        else:
            row, pos = (int(i) for i in (mask[:, 1:] & ~mask[:, :-1]).nonzero()[0])
            what = f"row {row} has a real token at position {pos + 1} after padding"
        why = ("" if attention_mask is not None else
               f". No attention_mask was given, so padding is wherever input_ids equals pad_id "
               f"{cfg.pad_id}: if that id is also a real token (an end token that doubles as "
               f"padding), pass the attention_mask")
        raise ValueError(
            f"every sequence needs real tokens followed only by padding (right padding, a real "
            f"first token), but {what}; left-padded or empty rows are not supported{why}"
        )
    return mask


def _last_real(h: Tensor, mask: Tensor) -> Tensor:
    """Rows of ``h`` (B, L, D) at each sequence's last real token (right padding)."""
    last = mask.sum(dim=1) - 1
    return h[torch.arange(h.shape[0], device=h.device), last]


def _after_last(last: Tensor, src: Tensor, tok: Tensor, noise: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
    """Prefix reuse: ``(tok, noise, lengths)`` with a copy perturbed after its example's last
    real token (``last``, per example: a position the model reads as padding, which a
    measurement mask of ``True`` there still perturbs) moved to that last token with zero noise:
    the model reads its output at the last real token, which a later position never reaches,
    so the copy's logits are the clean ones — as a full forward gives. Its suffix length had
    been ≤ 0, which failed with torch's "negative dimension" (GPT-2) or a range error (LSTM)."""
    end = last[src]
    after = tok > end
    tok = torch.where(after, end, tok)
    noise = noise.masked_fill(after[:, None], 0.0)
    return tok, noise, end - tok + 1


def _per_bucket(lengths: Tensor, buckets: int, run: Callable[[Tensor], Tensor]) -> Tensor:
    """Prefix reuse: the logits of copies with suffixes of ``lengths``, computed in ``buckets``
    groups of similar length (``run`` maps one group's indices to its logits), so padding each
    group to its longest suffix wastes little."""
    out: Tensor | None = None
    for part in lengths.argsort().chunk(buckets):
        logits = run(part)
        if out is None:
            out = logits.new_empty(len(lengths), logits.shape[1])
        out[part] = logits
    assert out is not None
    return out


# --------------------------------------------------------------------------- models
def _run_lstm(lstm: nn.LSTM, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """``lstm(x, hx)``'s outputs. Under bf16 autocast on a CPU whose oneDNN has no bf16 LSTM
    (AVX2 without AVX-512: it raises instead of computing), the LSTM alone runs in float32 —
    more precise, not less — and the rest of the model stays in autocast."""
    try:
        return lstm(x, hx)[0]
    except RuntimeError as err:
        if not missing_kernel(err, x.device):
            raise
    with torch.autocast("cpu", enabled=False):
        hx32 = None if hx is None else (hx[0].float(), hx[1].float())
        return lstm(x.float(), hx32)[0]


class LSTMClassifier(nn.Module):
    """embedding → ``embed_ln`` → ``layers``-layer LSTM (hidden ``dim``) → linear head on the top
    layer's state at the last real token. Every parameter is trained (the paper code left the
    embedding and head out of the optimiser — a bug). Init: PyTorch's defaults."""

    output_kind = "logits"

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.embed_ln = nn.LayerNorm(c.dim)
        self.drop = nn.Dropout(c.dropout)
        # nn.LSTM's dropout acts between stacked layers only (and warns when there is one layer)
        self.lstm = nn.LSTM(c.dim, c.dim, c.layers, batch_first=True,
                            dropout=c.dropout if c.layers > 1 else 0.0)
        self.head = nn.Linear(c.dim, c.num_classes)
        init_weights(self, torch.Generator().manual_seed(c.seed), linear_std=None, embed_std=1.0)

    def default_tokens(self) -> Embedding:
        return Embedding("embed_ln")

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = _real_tokens(input_ids, attention_mask, self.config)
        out = _run_lstm(self.lstm, self.drop(self.embed_ln(self.embed(input_ids))))
        # The LSTM reads left to right, so its state at the last real token has never seen the
        # right padding: no packing needed for padding to leave the logits unchanged.
        return self.head(self.drop(_last_real(out, mask)))

    # -- prefix reuse (senslab.tokens.Embedding): a copy perturbed at token t re-runs only the
    # positions t.. from the clean states at t − 1, about half the recurrent work on average.
    prefix_module = "embed_ln"
    SUFFIX_BUCKETS = 8

    @torch.no_grad()
    def prefix_cache(self, tokens: Tensor, inputs: Any) -> dict[str, Tensor]:
        """Clean per-layer states (h, c) at every position, from ``tokens`` — the (B, T, D)
        output of ``embed_ln`` on ``inputs``: each layer's input projection as one matrix
        product, then the LSTM cell stepped in tensor ops (nn.LSTM returns the cell state of the
        last position only). Eval mode only: dropout would make a suffix differ from a full
        forward."""
        check_eval(self, "prefix", "Embedding(..., reuse_prefix=False)")
        ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs
        mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
        last = _real_tokens(ids, mask, self.config).sum(dim=1) - 1
        b, t, _ = tokens.shape
        lstm = self.lstm
        hs = tokens.new_empty(t, lstm.num_layers, b, lstm.hidden_size)
        cs = torch.empty_like(hs)
        x = tokens
        for layer in range(lstm.num_layers):
            w_ih, w_hh, b_ih, b_hh = (getattr(lstm, f"{n}_l{layer}")
                                      for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            gates_x = torch.addmm(b_ih + b_hh, x.reshape(b * t, -1), w_ih.t()).view(b, t, -1)
            h = tokens.new_zeros(b, lstm.hidden_size)
            c = torch.zeros_like(h)
            for pos in range(t):
                i, f, g, o = torch.addmm(gates_x[:, pos], h, w_hh.t()).chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                hs[pos, layer], cs[pos, layer] = h, c
            x = hs[:, layer].transpose(0, 1)
        return {"tokens": tokens, "h": hs, "c": cs, "last": last}

    def forward_suffix(self, cache: dict[str, Tensor], src: Tensor, tok: Tensor,
                       noise: Tensor) -> Tensor:
        """Logits of copies of examples ``src`` whose token ``tok`` (a real token) has
        ``noise`` added at the ``embed_ln`` output: the LSTM resumes at ``tok`` from the clean
        states and reads up to each example's last real token, in buckets of similar suffix
        length (unpacked, so nn.LSTM's fused kernel runs; a packed call steps time by time)."""
        if self.training:  # the suffix skips the embedding's dropout a train-mode forward applies
            raise RuntimeError(TRAIN_MODE_REUSE)
        tok, noise, lengths = _after_last(cache["last"], src, tok, noise)
        return _per_bucket(lengths, self.SUFFIX_BUCKETS, lambda part: self._suffix(
            cache, src[part], tok[part], noise[part], lengths[part]))

    def _suffix(self, cache: dict[str, Tensor], src: Tensor, tok: Tensor, noise: Tensor,
                lengths: Tensor) -> Tensor:
        tokens, hs, cs = cache["tokens"], cache["h"], cache["c"]
        span = torch.arange(int(lengths.max()), device=tok.device)
        x = tokens[src[:, None], (tok[:, None] + span).clamp(max=tokens.shape[1] - 1)]
        x[:, 0] += noise.to(x.dtype)
        prev = (tok - 1).clamp(min=0)
        start = (tok > 0).to(hs.dtype)[None, :, None]  # zero states before the first token
        h0 = hs[prev, :, src].transpose(0, 1) * start
        c0 = cs[prev, :, src].transpose(0, 1) * start
        # a shorter suffix's positions past its last real token hold other tokens; they come
        # after the output read, so they cannot change it (the LSTM reads left to right)
        out = _run_lstm(self.lstm, x, (h0.contiguous(), c0.contiguous()))
        return self.head(out[torch.arange(len(src), device=src.device), lengths - 1])


class _TextTransformer(nn.Module):
    """Token embedding → ``embed_ln`` → + learned positions → blocks → final norm.

    Weights start N(0, 0.02²) as in GPT-2 and RoBERTa. At that scale the attention branches
    are small, so at init the read-out position depends only weakly on the other tokens.
    """

    output_kind = "logits"

    def __init__(self, config: TextConfig, *, norm: str, attention: str, causal: bool) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.embed_ln = nn.LayerNorm(c.dim)
        self.pos_embed = nn.Embedding(c.max_len, c.dim)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            Block(c.dim, c.heads, 4 * c.dim, norm=norm, activation="gelu", attention=attention,
                  dropout=c.dropout, causal=causal)
            for _ in range(c.layers)
        )
        # post-LN blocks already end in a LayerNorm; pre-LN needs one before the head
        self.norm = nn.LayerNorm(c.dim) if norm == "pre" else nn.Identity()

    def default_tokens(self) -> Embedding:
        return Embedding("embed_ln")

    def _encode(self, input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        mask = _real_tokens(input_ids, attention_mask, self.config)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # positions are added *after* embed_ln so that injected noise hits the token alone
        h = self.drop(self.embed_ln(self.embed(input_ids)) + self.pos_embed(positions))
        for block in self.blocks:
            h = block(h, mask)
        return self.norm(h), mask

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Final hidden states (B, L, dim), before the classification head."""
        return self._encode(input_ids, attention_mask)[0]


class RobertaClassifier(_TextTransformer):
    """Bidirectional encoder, padding keys masked; the head reads position 0 (``<s>``, the CLS
    token) through dense → tanh → dropout → linear, as RoBERTa's classification head does."""

    def __init__(self, config: RobertaConfig) -> None:
        super().__init__(config, norm=config.norm, attention=config.attention, causal=False)
        self.head = nn.Sequential(
            nn.Linear(config.dim, config.dim), nn.Tanh(), nn.Dropout(config.dropout),
            nn.Linear(config.dim, config.num_classes),
        )
        init_weights(self, torch.Generator().manual_seed(config.seed))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        h, _ = self._encode(input_ids, attention_mask)
        return self.head(h[:, 0])


class GPT2Classifier(_TextTransformer):
    """Causal pre-LN decoder (GELU MLP); a linear head on the last real token, the only position
    that has seen the whole sequence."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__(config, norm="pre", attention="softmax", causal=True)
        self.head = nn.Linear(config.dim, config.num_classes)
        init_weights(self, torch.Generator().manual_seed(config.seed))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        h, mask = self._encode(input_ids, attention_mask)
        return self.head(_last_real(h, mask))

    # -- prefix reuse (senslab.tokens.Embedding): causal attention leaves positions before a
    # perturbed token t unchanged, so a copy recomputes only positions t.. against the clean
    # keys and values of the prefix (about half the work). The copies' suffix rows are packed
    # one after another, so every matrix product runs once per layer on real rows only; the
    # attention alone groups copies by suffix length (padding each group to its longest). The
    # last block needs every suffix row's keys and values but the rest of each copy's last
    # row alone, the one the head reads
    prefix_module = "embed_ln"
    SUFFIX_BUCKETS = 8

    @torch.no_grad()
    def prefix_cache(self, tokens: Tensor, inputs: Any) -> dict[str, Any]:
        """The clean residual stream entering the first block (``tokens`` — the ``embed_ln``
        output — plus positions) and every block's keys and values, (B, heads, T, d_head)."""
        check_eval(self, "prefix", "Embedding(..., reuse_prefix=False)")
        ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs
        mask = _real_tokens(ids, inputs.get("attention_mask") if isinstance(inputs, dict)
                            else None, self.config)
        h = tokens + self.pos_embed(torch.arange(tokens.shape[1], device=tokens.device))
        keys, values = [], []
        x = h
        for block in self.blocks:
            k, v = block.attn.split_heads(block.ln1(x))[1:]
            keys.append(k)
            values.append(v)
            x = block(x, mask)
        return {"h": h, "k": keys, "v": values, "last": mask.sum(dim=1) - 1}

    def forward_suffix(self, cache: dict[str, Any], src: Tensor, tok: Tensor,
                       noise: Tensor) -> Tensor:
        """Logits of copies of examples ``src`` with ``noise`` added to token ``tok`` (a real
        token) at the ``embed_ln`` output."""
        if self.training:  # the suffix applies none of the dropout a train-mode forward would
            raise RuntimeError(TRAIN_MODE_REUSE)
        h0 = cache["h"]
        # each copy's suffix: tokens tok..last
        tok, noise, lengths = _after_last(cache["last"], src, tok, noise)
        n, dim = len(src), h0.shape[2]
        starts = lengths.cumsum(0) - lengths  # copy i's rows: starts[i] .. starts[i] + lengths[i]
        total = int(lengths.sum())
        copy = torch.repeat_interleave(torch.arange(n, device=src.device), lengths,
                                       output_size=total)
        x = h0[src[copy], tok[copy] + torch.arange(total, device=src.device) - starts[copy]]
        x[starts] += noise.to(x.dtype)
        ends = starts + lengths - 1  # the row the head reads
        groups: list[_SuffixGroup] = []
        for i, (block, k_clean, v_clean) in enumerate(
                zip(self.blocks, cache["k"], cache["v"], strict=True)):
            # the last block: every row's keys and values, then the attention, projection and
            # MLP of each copy's last row alone, the only row the head reads
            last = i == len(self.blocks) - 1
            qkv = block.attn.qkv(block.ln1(x))
            if not groups:  # the attention's dtype: the products' (bf16 under autocast)
                groups = [_SuffixGroup(part, src, tok, lengths, starts, qkv.dtype)
                          for part in lengths.argsort().chunk(self.SUFFIX_BUCKETS)]
            heads = block.attn.heads
            a = qkv.new_empty(n if last else total, dim)
            for g in groups:
                q, k, v = qkv[g.rows].view(g.n, g.s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
                k = torch.cat([k_clean[g.src, :, :g.width].to(k.dtype), k], dim=2)
                v = torch.cat([v_clean[g.src, :, :g.width].to(v.dtype), v], dim=2)
                if last:
                    at = torch.arange(g.n, device=src.device)
                    q = q[at, :, g.last, None]  # (n, heads, 1, d_head)
                    mask = g.mask[at, :, g.last, None]
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    a[g.part] = o.reshape(g.n, dim)
                else:
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=g.mask)
                    a[g.to_rows] = o.transpose(1, 2).reshape(g.n * g.s, dim).index_select(
                        0, g.real)
            x = (x[ends] if last else x) + block.attn.proj(a)
            x = x + block.mlp(block.ln2(x))
        return self.head(self.norm(x))


class _SuffixGroup:
    """Copies ``part`` of a :meth:`GPT2Classifier.forward_suffix` call, for the attention: their
    suffix rows padded to the group's longest suffix ``s`` (``rows``: each padded slot's packed
    row, a padding slot repeating its copy's last row), which of the ``n × s`` slots are real
    (``real``) and their packed rows (``to_rows``), and the keys each query may read (``mask``:
    0 where allowed, −inf elsewhere): the clean prefix (positions < t, read up to the group's
    latest t, ``width``) and its own suffix up to itself; ``last``: each copy's last slot (the
    row the head reads)."""

    def __init__(self, part: Tensor, src: Tensor, tok: Tensor, lengths: Tensor,
                 starts: Tensor, dtype: torch.dtype) -> None:
        t, length = tok[part], lengths[part]
        self.n, self.s, self.width = len(part), int(length.max()), int(t.max())
        self.part, self.last = part, length - 1
        self.src = src[part]
        span = torch.arange(self.s, device=src.device)
        real = span[None, :] < length[:, None]  # (n, s)
        self.rows = starts[part][:, None] + torch.minimum(span[None, :], length[:, None] - 1)
        self.real = real.flatten().nonzero().squeeze(1)
        self.to_rows = self.rows.flatten().index_select(0, self.real)
        prefix_ok = torch.arange(self.width, device=src.device)[None, :] < t[:, None]  # (n, w)
        causal = torch.ones(self.s, self.s, dtype=torch.bool, device=src.device).tril()
        suffix_ok = causal[None] & real[:, None, :]  # (n, s, s)
        allowed = torch.cat([prefix_ok[:, None, :].expand(self.n, self.s, self.width),
                             suffix_ok], dim=2)[:, None]
        # as an additive mask in the attention's dtype, built once for every layer (a boolean
        # one is converted on every call)
        self.mask = torch.zeros(allowed.shape, dtype=dtype, device=src.device).masked_fill_(
            ~allowed, float("-inf"))


# --------------------------------------------------------------------------- registry
@register_model("lstm", config=TextConfig())
def lstm(**overrides: Any) -> LSTMClassifier:
    """LSTM baseline: embedding 256 → LayerNorm → 4-layer LSTM 256 → linear
    (docs/definitions.md#text-models)."""
    return seeded(LSTMClassifier, override_config(TextConfig(), overrides))


@register_model("roberta", config=RobertaConfig())
def roberta(**overrides: Any) -> RobertaClassifier:
    """RoBERTa-like encoder, 4 layers, 256 wide, 8 heads, softmax attention
    (docs/definitions.md#text-models)."""
    return seeded(RobertaClassifier, override_config(RobertaConfig(), overrides))


@register_model("roberta_relu", config=RobertaConfig(attention="relu"))
def roberta_relu(**overrides: Any) -> RobertaClassifier:
    """``roberta`` with unnormalised ReLU attention relu(QKᵀ/√d)
    (docs/definitions.md#text-models)."""
    return seeded(RobertaClassifier, override_config(RobertaConfig(attention="relu"), overrides))


@register_model("gpt2", config=TextConfig())
def gpt2(**overrides: Any) -> GPT2Classifier:
    """GPT-2-like causal decoder, 4 layers, 256 wide, 8 heads (main paper A.4;
    docs/definitions.md#text-models)."""
    return seeded(GPT2Classifier, override_config(TextConfig(), overrides))
