"""The small research models of the three papers.

=====================  =====================================================================
``sparse_attention``   one softmax self-attention layer + linear head, sparse/frequent task
                       (docs/definitions.md#sparse-frequent-task)
``modadd_transformer`` one-layer transformer for (a + b) mod p, the grokking run
                       (docs/definitions.md#modular-addition, docs/definitions.md#grokking)
``parity_transformer`` two-layer transformer on n bits, the sparse-parity run (main paper A.6;
                       docs/definitions.md#sparse_parity)
``boolean_transformer`` Hahn & Rofin's post-LN encoder for Boolean functions
                       (docs/definitions.md#hahn-and-rofin-setup)
``attention_model``    Φ(X) = vᵀ Xᵀ softmax(X W x₁) of Vasudeva et al.
                       (docs/definitions.md#attention-model)
=====================  =====================================================================

All five are defined in docs/definitions.md#small-models. Every model has a frozen dataclass
``config`` (with a ``seed`` that alone fixes the initial weights) and ``default_tokens()``.

Bit inputs (parity, boolean): a (B, n) tensor, either floats in {−1, +1} or integers in {0, 1};
bit 1 means +1, i.e. x = 2·bit − 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .._autocast import autocast_on
from ..tokens import Embedding, Sequence
from ._config import check_one_of, check_positive, override_config
from ._registry import register_model
from .text import Block, init_weights
from .vision import check_seed, seeded

# Sizes go through check_positive: integers, not just >= 1 (a float ``heads`` of 4.0 built and
# failed only at the first forward, inside a reshape; a float ``dim`` or ``n_bits`` failed
# inside a torch constructor that named neither the field nor the fix).


def _check_init_scale(config: Any) -> None:
    """Error unless ``config.init_scale`` (the std of the initial weights) is finite and >= 0:
    NaN passed ``init_scale < 0`` and, like infinity, built a model whose every output was NaN,
    unsaid."""
    scale = config.init_scale
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"{type(config).__name__}.init_scale must be a finite number >= 0 (the "
                         f"std of the initial weights), got {scale!r}; e.g. init_scale=0.01, or "
                         f"0 to start from zero weights")


def _check_vectors(x: Tensor, dim: int, weight: Tensor) -> None:
    if x.dim() != 3 or x.shape[-1] != dim or not x.is_floating_point():
        raise ValueError(
            f"expected float token vectors of shape (batch, length, {dim}), got dtype {x.dtype} "
            f"and shape {tuple(x.shape)}; one-hot encode token ids with "
            f"torch.nn.functional.one_hot(ids, {dim}).float()"
        )
    if x.shape[1] == 0:
        # attention over no tokens: a mean-pooled output would be NaN and a summed one 0, a
        # logit at the decision boundary, for an input that holds nothing to classify
        raise ValueError(
            f"got token vectors of shape {tuple(x.shape)}: sequences of length 0 have no token "
            "to attend to; every sequence needs at least one"
        )
    # vectors of another float dtype than the weights' (outside autocast, which casts all but
    # float64) reached torch's "expected scalar type Float but found Double", which named
    # neither the vectors nor the fix
    if x.dtype != weight.dtype and (x.dtype == torch.float64 or not autocast_on(x.device.type)):
        raise TypeError(
            f"got {x.dtype} token vectors for a model with {weight.dtype} weights: convert the "
            f"vectors with x.to({weight.dtype}), or the model with model.to({x.dtype})")


def _bit_ids(x: Tensor, max_bits: int) -> Tensor:
    """(B, n) bits as {±1} floats or {0, 1} integers → long ids, 1 ↔ +1."""
    if x.dim() != 2 or not 1 <= x.shape[1] <= max_bits:
        # the fix depends on what is wrong: only a string too long is cured by a larger table
        if x.dim() != 2:
            fix = ("pass a 2-D batch of bit strings, one string per row (a single string: "
                   "bits.unsqueeze(0))")
        elif x.shape[1] == 0:
            fix = "strings of 0 bits have nothing to read; every string needs at least one bit"
        else:
            fix = f"for longer strings build the model with n_bits={x.shape[1]}"
        raise ValueError(
            f"expected bits of shape (batch, n) with 1 <= n <= {max_bits}, got "
            f"{tuple(x.shape)}; {fix}"
        )
    if x.is_floating_point():
        if not ((x == 1) | (x == -1)).all():
            raise ValueError("float bits must be exactly -1 or +1 (or pass {0, 1} integers)")
        return (x > 0).long()
    if not ((x == 0) | (x == 1)).all():
        raise ValueError("integer bits must be 0 or 1 (or pass -1/+1 floats)")
    return x.long()


# ------------------------------ sparse attention (docs/definitions.md#sparse-frequent-task)
@dataclass(frozen=True)
class SparseAttentionConfig:
    """``dim``: token vector size (V for one-hot tokens; must match the data). ``init_scale``:
    std of the N(0, s²) initial entries of W and v *(ours; the paper only says "small")*.
    ``pool``: "mean" or "sum" over query positions."""

    dim: int = 32
    init_scale: float = 0.01
    pool: str = "mean"
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self)
        check_positive(self, "dim")
        check_one_of("pool", self.pool, ("mean", "sum"))
        _check_init_scale(self)


class SparseAttention(nn.Module):
    """Single-head self-attention with a linear head, our reading of the main paper's Eq. 3.

    For tokens X = (x_1 … x_L) ∈ R^{L×d} every position i attends over all positions j with
    A_ij = softmax_j(x_jᵀ W x_i) (key-query product merged into one W ∈ R^{d×d}, identity value
    map), and the output is

        f(X) = pool_i ⟨v, Σ_j A_ij x_j⟩ = pool_i Σ_j A_ij vᵀ x_j,

    pool = mean (default) or sum over i. With query x_1 alone this is Vasudeva et al.'s model
    (docs/definitions.md#attention-model). f(X) is a logit for the label y ∈ {±1} (logistic
    loss). ``attention_weights(X).mean(1)`` gives the attention each key position receives, to be
    summed per token type.
    """

    output_kind = "logits"  # one logit (B,): its sign is the label (small init: all in (0, 1))

    def __init__(self, config: SparseAttentionConfig) -> None:
        super().__init__()
        self.config = c = config
        g = torch.Generator().manual_seed(c.seed)
        self.W = nn.Parameter(torch.randn(c.dim, c.dim, generator=g) * c.init_scale)
        self.v = nn.Parameter(torch.randn(c.dim, generator=g) * c.init_scale)

    def default_tokens(self) -> Sequence:
        return Sequence()

    def attention_weights(self, x: Tensor) -> Tensor:
        """A (B, L_query, L_key); every row sums to 1."""
        _check_vectors(x, self.config.dim, self.W)
        scores = torch.einsum("bjd,de,bie->bij", x, self.W, x)  # [b, i, j] = x_jᵀ W x_i
        return scores.softmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        # (B, L): Σ_j A_ij vᵀx_j for every query i
        per_query = (self.attention_weights(x) @ (x @ self.v).unsqueeze(-1)).squeeze(-1)
        return per_query.mean(1) if self.config.pool == "mean" else per_query.sum(1)


# ---------------------------------------------------- grokking (docs/definitions.md#grokking)
@dataclass(frozen=True)
class ModAddConfig:
    """Nanda et al.-style grokking model: p = 113, d 128, 4 heads, ReLU MLP 512, one layer.

    ``layer_norm=False`` leaves LayerNorm out (as Nanda et al.); True makes the block pre-LN.
    The other options reproduce the paper code's ``SimpleTransformer`` (all off by default):
    ``residual=False`` chains attention and MLP with no residual branches, h = MLP(Attn(x));
    ``pos_init="zeros"`` starts the positional embedding at zero instead of N(0, 1);
    ``attn_init="mha"`` initialises attention as ``torch.nn.MultiheadAttention`` does
    (Xavier-uniform query/key/value weights, zero biases) instead of U(±1/√d) everywhere;
    ``eq_logit=True`` reads out p + 1 logits, one per vocabulary entry including ``=``.
    """

    p: int = 113
    dim: int = 128
    heads: int = 4
    mlp_dim: int = 512
    layer_norm: bool = False
    residual: bool = True
    pos_init: str = "normal"
    attn_init: str = "linear"
    eq_logit: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self)
        check_positive(self, "dim", "heads", "mlp_dim")
        if isinstance(self.p, bool) or not isinstance(self.p, int) or self.p < 2:
            raise ValueError(f"modulus p must be an integer of at least 2, got {self.p!r}")
        check_one_of("pos_init", self.pos_init, ("normal", "zeros"))
        check_one_of("attn_init", self.attn_init, ("linear", "mha"))
        if self.layer_norm and not self.residual:
            raise ValueError("layer_norm=True needs residual=True (the pre-LN block); the paper "
                             "code's block without residuals has no LayerNorm either")


class ModAddTransformer(nn.Module):
    """Input tokens (B, 3) = ``a b =`` with a, b ∈ [0, p) and ``=`` the id p; output logits
    (B, p) for (a + b) mod p, read at the ``=`` position ((B, p + 1) with ``eq_logit``: the last
    column is the ``=`` token's, never a target).

    The number embedding is the submodule ``embed`` (positions are added after it), so
    ``default_tokens()`` = ``Embedding("embed")`` puts noise on the token embeddings. Its output
    also holds the ``=`` token: measurements should pass ``mask=model.number_mask(tokens)`` so
    that only the two numbers are perturbed, as the paper does. Init follows PyTorch's defaults
    (embeddings N(0, 1), linear U(±1/√fan_in)) and positions N(0, 1); the total weight norm at
    init is ≈ 125 (≈ 124 with the paper code's options), close to the 123 the paper code logged.
    """

    output_kind = "logits"

    def __init__(self, config: ModAddConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.p + 1, c.dim)
        self.pos_embedding = nn.Parameter(torch.empty(3, c.dim))
        norm = "pre" if c.layer_norm else "none"
        self.block = Block(c.dim, c.heads, c.mlp_dim, norm=norm, activation="relu")
        self.norm = nn.LayerNorm(c.dim) if c.layer_norm else nn.Identity()
        self.unembed = nn.Linear(c.dim, c.p + 1 if c.eq_logit else c.p)
        g = torch.Generator().manual_seed(c.seed)
        init_weights(self, g, linear_std=None, embed_std=1.0)
        with torch.no_grad():
            # the options draw only after the default init, so their defaults change nothing
            if c.pos_init == "normal":
                nn.init.normal_(self.pos_embedding, 0.0, 1.0, generator=g)
            else:
                self.pos_embedding.zero_()
            if c.attn_init == "mha":
                attn = self.block.attn
                nn.init.xavier_uniform_(attn.qkv.weight, generator=g)  # the stacked (3d, d)
                attn.qkv.bias.zero_()
                attn.proj.bias.zero_()

    def default_tokens(self) -> Embedding:
        return Embedding("embed")

    @staticmethod
    def number_mask(tokens: Tensor) -> Tensor:
        """(B, 3) bool, true on the two number positions (the tokens sensitivity perturbs)."""
        mask = torch.ones(tokens.shape[0], 3, dtype=torch.bool, device=tokens.device)
        mask[:, 2] = False
        return mask

    def forward(self, tokens: Tensor) -> Tensor:
        p = self.config.p
        if (tokens.dim() != 2 or tokens.shape[1] != 3 or tokens.is_floating_point()
                or tokens.is_complex() or tokens.dtype == torch.bool):
            raise ValueError(f"expected token ids of shape (batch, 3) = `a b =`, got "
                             f"{tuple(tokens.shape)} ({tokens.dtype})")
        if tokens.dtype not in (torch.int64, torch.int32):
            # the embedding takes int64 or int32 ids only: uint16 failed in the range check
            # ("lt_cpu" not implemented), uint8 and int16 deep inside the embedding
            raise ValueError(f"token ids have dtype {tokens.dtype}, but the embedding takes "
                             f"int64 or int32 ids; pass tokens.long()")
        if ((tokens[:, :2] < 0) | (tokens[:, :2] >= p)).any() or (tokens[:, 2] != p).any():
            raise ValueError(f"tokens must be `a b =` with a, b in [0, {p}) and `=` = {p}")
        h = self.embed(tokens) + self.pos_embedding
        if self.config.residual:
            h = self.block(h)
        else:  # norm "none" and no dropout: the block's branches alone, one after the other
            h = self.block.mlp(self.block.attn(h))
        return self.unembed(self.norm(h)[:, -1])


# ---------------------------------------- sparse parity (docs/definitions.md#sparse_parity)
@dataclass(frozen=True)
class ParityConfig:
    """Two-layer pre-LN transformer on up to ``n_bits`` bits *(sizes ours)*. ``num_classes``:
    2 → logits (B, 2), class 1 ↔ label +1; 1 → a scalar logit (B,) whose sign is the label."""

    n_bits: int = 20
    dim: int = 64
    heads: int = 4
    layers: int = 2
    mlp_dim: int = 256
    num_classes: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self)
        check_positive(self, "n_bits", "dim", "heads", "layers", "mlp_dim")
        # type() too: True and 2.0 compare equal to 1 and 2, and failed inside nn.Linear
        if type(self.num_classes) is not int or self.num_classes not in (1, 2):
            raise ValueError(f"num_classes must be 1 (scalar logit) or 2, got "
                             f"{self.num_classes!r}")


class ParityTransformer(nn.Module):
    """Bits → ``embed`` (a 2-entry token embedding) + learned positions → ``layers`` pre-LN
    blocks → final LayerNorm → mean over positions → linear head. Mean pooling keeps every bit
    one hop from the read-out, which a k-sparse parity needs."""

    output_kind = "logits"  # with num_classes=1 one logit whose sign is the label

    def __init__(self, config: ParityConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(2, c.dim)
        self.pos_embedding = nn.Parameter(torch.empty(c.n_bits, c.dim))
        self.blocks = nn.ModuleList(
            Block(c.dim, c.heads, c.mlp_dim, norm="pre") for _ in range(c.layers)
        )
        self.norm = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.num_classes)
        g = torch.Generator().manual_seed(c.seed)
        init_weights(self, g)
        with torch.no_grad():
            nn.init.normal_(self.pos_embedding, 0.0, 0.02, generator=g)

    def default_tokens(self) -> Embedding:
        return Embedding("embed")

    def forward(self, bits: Tensor) -> Tensor:
        ids = _bit_ids(bits, self.config.n_bits)
        h = self.embed(ids) + self.pos_embedding[: ids.shape[1]]
        for block in self.blocks:
            h = block(h)
        out = self.head(self.norm(h).mean(dim=1))
        return out.squeeze(-1) if self.config.num_classes == 1 else out


# ---------------------------------- Hahn & Rofin (docs/definitions.md#hahn-and-rofin-setup)
@dataclass(frozen=True)
class BooleanConfig:
    """Hahn & Rofin's encoder: d = 128, 2 layers, 2 heads, FF width d, dropout 0, post-LN.
    ``n_bits`` is the size of the positional table, i.e. the longest accepted input.

    ``init``: "independent" draws every block on its own, all Linear layers (attention too)
    U(±1/√fan_in) on weight and bias; "torch_encoder" is the initial state of the authors'
    ``nn.TransformerEncoder``: the fused q/k/v matrix Xavier-uniform with zero bias, the attention
    output bias zero, and every block a copy of the first (the encoder clones one layer)."""

    n_bits: int = 30
    dim: int = 128
    layers: int = 2
    heads: int = 2
    ff_dim: int = 128
    dropout: float = 0.0
    init: str = "independent"
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self)
        check_positive(self, "n_bits", "dim", "layers", "heads", "ff_dim")
        check_one_of("init", self.init, ("independent", "torch_encoder"))
        if self.dim % 2:
            raise ValueError(f"dim must be even (bit and position halves), got {self.dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class BooleanTransformer(nn.Module):
    """x ∈ {±1}ⁿ → [``bit_embed``(x_i) ; ``pos_embedding``[i]] (d/2 each, concatenated) → post-LN
    blocks (ReLU FF) → scalar head on the last position, output (B,) (MSE to {0, 1} targets).

    For the sharpness and norm measurements: the positional parameter is ``pos_embedding`` (the
    only parameter whose name contains "pos"); ``layer_norms()`` lists the LayerNorms in the
    order they run, for blow-up hooks; ``readout_position`` is −1.

    ``output_kind`` is "logits", the rule senslab's training loop trains a scalar head with
    (BCE-with-logits, class = sign). The Hahn & Rofin experiments instead regress onto {0, 1}
    with MSE and read the class as output > 1/2: measure such a model with
    ``output_kind="scores", threshold=0.5``.
    """

    readout_position = -1
    output_kind = "logits"

    def __init__(self, config: BooleanConfig) -> None:
        super().__init__()
        self.config = c = config
        half = c.dim // 2
        self.bit_embed = nn.Embedding(2, half)
        self.pos_embedding = nn.Parameter(torch.empty(c.n_bits, half))
        self.blocks = nn.ModuleList(
            Block(c.dim, c.heads, c.ff_dim, norm="post", activation="relu", dropout=c.dropout)
            for _ in range(c.layers)
        )
        self.head = nn.Linear(c.dim, 1)
        g = torch.Generator().manual_seed(c.seed)
        init_weights(self, g, linear_std=None, embed_std=1.0)
        with torch.no_grad():
            nn.init.normal_(self.pos_embedding, 0.0, 1.0, generator=g)
            if c.init == "torch_encoder":
                self._clone_first_block(g)

    def _clone_first_block(self, g: torch.Generator) -> None:
        """PyTorch's MultiheadAttention init on block 0, then block 0 copied into the others."""
        first = self.blocks[0]
        nn.init.xavier_uniform_(first.attn.qkv.weight, generator=g)
        first.attn.qkv.bias.zero_()
        first.attn.proj.bias.zero_()
        for block in self.blocks[1:]:
            block.load_state_dict(first.state_dict())

    def default_tokens(self) -> Embedding:
        return Embedding("bit_embed")

    def layer_norms(self) -> list[tuple[str, nn.LayerNorm]]:
        """(name, module) of every LayerNorm, in forward order."""
        return [(n, m) for n, m in self.named_modules() if isinstance(m, nn.LayerNorm)]

    def forward(self, bits: Tensor) -> Tensor:
        ids = _bit_ids(bits, self.config.n_bits)
        b, n = ids.shape
        pos = self.pos_embedding[:n].unsqueeze(0).expand(b, n, -1)
        h = torch.cat([self.bit_embed(ids), pos], dim=-1)
        for block in self.blocks:
            h = block(h)
        return self.head(h[:, self.readout_position]).squeeze(-1)


# ------------------------------------ Vasudeva et al. (docs/definitions.md#attention-model)
@dataclass(frozen=True)
class AttentionModelConfig:
    """``dim``: token size d. ``train_v``: learn the decoder v (joint training) or keep it fixed
    (a buffer, never seen by an optimiser). ``init_scale``: std of W's N(0, s²) entries (0 gives
    W = 0) *(ours)*; v starts as a random unit vector either way."""

    dim: int = 16
    train_v: bool = True
    init_scale: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        check_seed(self)
        check_positive(self, "dim")
        _check_init_scale(self)


class AttentionModel(nn.Module):
    """Φ(X) = vᵀ Xᵀ softmax(X W x₁) = Σ_t a_t vᵀ x_t with a = softmax_t(x_tᵀ W x₁): attention
    from the first token, linear decoder v. Input X (B, T, d), output Φ (B,) (logistic loss on
    y ∈ {±1})."""

    output_kind = "logits"  # Φ is a logit: its sign is the label

    def __init__(self, config: AttentionModelConfig) -> None:
        super().__init__()
        self.config = c = config
        g = torch.Generator().manual_seed(c.seed)
        self.W = nn.Parameter(torch.randn(c.dim, c.dim, generator=g) * c.init_scale)
        v = torch.randn(c.dim, generator=g)
        v = v / v.norm()
        if c.train_v:
            self.v = nn.Parameter(v)
        else:
            self.register_buffer("v", v)

    def default_tokens(self) -> Sequence:
        return Sequence()

    def attention_weights(self, x: Tensor) -> Tensor:
        """softmax(X W x₁), shape (B, T); every row sums to 1."""
        _check_vectors(x, self.config.dim, self.W)
        return (x @ (self.W @ x[:, 0].unsqueeze(-1))).squeeze(-1).softmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        return (self.attention_weights(x) * (x @ self.v)).sum(dim=1)


# --------------------------------------------------------------------------- registry
# built under seeded(): the layers' own default init (which init_weights replaces) neither
# moves the caller's global random stream nor runs off the CPU under a default device
@register_model("sparse_attention", config=SparseAttentionConfig())
def sparse_attention(**overrides: Any) -> SparseAttention:
    """One-layer softmax self-attention + linear head for the sparse/frequent task
    (docs/definitions.md#sparse-frequent-task)."""
    return seeded(SparseAttention, override_config(SparseAttentionConfig(), overrides))


@register_model("modadd_transformer", config=ModAddConfig())
def modadd_transformer(**overrides: Any) -> ModAddTransformer:
    """One-layer transformer for (a + b) mod 113, the grokking experiment
    (docs/definitions.md#grokking)."""
    return seeded(ModAddTransformer, override_config(ModAddConfig(), overrides))


@register_model("parity_transformer", config=ParityConfig())
def parity_transformer(**overrides: Any) -> ParityTransformer:
    """Two-layer transformer for sparse parity on n bits (main paper A.6;
    docs/definitions.md#sparse_parity)."""
    return seeded(ParityTransformer, override_config(ParityConfig(), overrides))


@register_model("boolean_transformer", config=BooleanConfig())
def boolean_transformer(**overrides: Any) -> BooleanTransformer:
    """Hahn & Rofin's post-LN encoder for Boolean functions
    (docs/definitions.md#small-models)."""
    return seeded(BooleanTransformer, override_config(BooleanConfig(), overrides))


@register_model("attention_model", config=AttentionModelConfig())
def attention_model(**overrides: Any) -> AttentionModel:
    """Vasudeva et al.'s Φ(X) = vᵀ Xᵀ softmax(X W x₁)
    (docs/definitions.md#attention-model)."""
    return seeded(AttentionModel, override_config(AttentionModelConfig(), overrides))

