"""The small research models: shapes, gradients, exact formulas, parameter counts, token hooks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from senslab.models import create_model, list_models
from senslab.tokens import Embedding, Sequence

B = 4
SMALL: dict[str, dict] = {
    "sparse_attention": dict(dim=6, init_scale=0.5),
    "attention_model": dict(dim=6, init_scale=0.5),
    "modadd_transformer": dict(p=7, dim=16, heads=2, mlp_dim=32),
    "parity_transformer": dict(n_bits=8, dim=16, heads=2, mlp_dim=32),
    "boolean_transformer": dict(n_bits=8, dim=16, heads=2, ff_dim=16),
}
NAMES = list(SMALL)


def make_input(name: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cfg = SMALL[name]
    if name in ("sparse_attention", "attention_model"):  # one-hot token sequences, length 5
        return F.one_hot(torch.randint(0, cfg["dim"], (B, 5), generator=g), cfg["dim"]).float()
    if name == "modadd_transformer":
        ab = torch.randint(0, cfg["p"], (B, 2), generator=g)
        return torch.cat([ab, torch.full((B, 1), cfg["p"])], dim=1)
    bits = torch.randint(0, 2, (B, cfg["n_bits"]), generator=g)
    return 2.0 * bits - 1.0  # ±1 floats


def small(name: str, **kw) -> torch.nn.Module:
    return create_model(name, **{**SMALL[name], **kw})


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_all_registered() -> None:
    assert set(NAMES) <= set(list_models())


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_finite_gradients(name: str) -> None:
    model = small(name).train()
    out = model(make_input(name))
    expected = {"modadd_transformer": (B, 7), "parity_transformer": (B, 2)}.get(name, (B,))
    assert out.shape == expected
    out.square().sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} gets no gradient"
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} has an all-zero gradient"


@pytest.mark.parametrize("name", NAMES)
def test_default_tokens(name: str) -> None:
    tokens = small(name).default_tokens()
    expected = {
        "sparse_attention": Sequence(),
        "attention_model": Sequence(),
        "modadd_transformer": Embedding("embed"),
        "parity_transformer": Embedding("embed"),
        "boolean_transformer": Embedding("bit_embed"),
    }[name]
    assert tokens == expected


@pytest.mark.parametrize("name", NAMES)
def test_noise_reaches_the_output(name: str) -> None:
    # bind the model's own tokenization and perturb one token of every example
    model = small(name).eval()
    x = make_input(name)
    with model.default_tokens().bind(model, x) as bound:
        src, tok = torch.arange(B), torch.zeros(B, dtype=torch.long)
        noise = torch.randn(B, bound.dim, generator=torch.Generator().manual_seed(1))
        moved = bound.forward_perturbed(src, tok, noise) - bound.clean_output
        assert moved.reshape(B, -1).abs().amax(dim=1).min() > 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_unknown_override_is_an_error(name: str) -> None:
    with pytest.raises(TypeError, match="unknown option 'sede'.*'seed'"):
        create_model(name, sede=1)


@pytest.mark.parametrize("name", NAMES)
def test_seed_fixes_weights(name: str) -> None:
    a, b, c = small(name, seed=3), small(name, seed=3), small(name, seed=4)
    torch.testing.assert_close(a(make_input(name)), b(make_input(name)), rtol=0, atol=0)
    assert not torch.equal(a(make_input(name)), c(make_input(name)))


# --------------------------------------------------------------------------- sparse_attention
def test_sparse_attention_formula_and_count() -> None:
    model = small("sparse_attention")
    d = SMALL["sparse_attention"]["dim"]
    assert n_params(model) == d * d + d
    x = make_input("sparse_attention")
    a = model.attention_weights(x)
    assert a.shape == (B, 5, 5)
    torch.testing.assert_close(a.sum(-1), torch.ones(B, 5))
    # reference with explicit loops: f = mean_i Σ_j softmax_j(x_jᵀ W x_i) vᵀ x_j
    W, v = model.W.detach(), model.v.detach()
    for b in range(B):
        xs = x[b]
        rows = []
        for i in range(5):
            w = torch.softmax(torch.stack([xs[j] @ W @ xs[i] for j in range(5)]), 0)
            rows.append(sum(w[j] * (v @ xs[j]) for j in range(5)))
        torch.testing.assert_close(model(x)[b], torch.stack(rows).mean(), atol=1e-6, rtol=1e-5)
    summed = small("sparse_attention", pool="sum")
    torch.testing.assert_close(summed(x), 5 * model(x))


def test_sparse_attention_rejects_ids() -> None:
    with pytest.raises(ValueError, match="one_hot"):
        small("sparse_attention")(torch.zeros(B, 5, dtype=torch.long))


# --------------------------------------------------------------------------- attention_model
def test_attention_model_formula_and_count() -> None:
    d = SMALL["attention_model"]["dim"]
    model = small("attention_model")
    assert n_params(model) == d * d + d
    x = make_input("attention_model", seed=2)
    a = model.attention_weights(x)
    assert a.shape == (B, 5)
    torch.testing.assert_close(a.sum(-1), torch.ones(B))
    W, v = model.W.detach(), model.v.detach()
    for b in range(B):  # Φ(X) = vᵀ Xᵀ softmax(X W x₁)
        expected = v @ x[b].T @ torch.softmax(x[b] @ W @ x[b, 0], 0)
        torch.testing.assert_close(model(x)[b], expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(v.norm(), torch.tensor(1.0))


def test_attention_model_fixed_v() -> None:
    d = SMALL["attention_model"]["dim"]
    model = small("attention_model", train_v=False)
    assert n_params(model) == d * d
    assert [n for n, _ in model.named_parameters()] == ["W"]
    assert "v" in model.state_dict()  # still saved with checkpoints
    v0 = model.v.clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model(make_input("attention_model")).sum().backward()
    opt.step()
    assert torch.equal(model.v, v0)
    # W = 0 (init_scale 0) makes the attention uniform
    flat = small("attention_model", init_scale=0.0)
    torch.testing.assert_close(flat.attention_weights(make_input("attention_model")),
                               torch.full((B, 5), 0.2))


# --------------------------------------------------------------------------- modadd_transformer
def test_modadd_count_mask_and_init_norm() -> None:
    p, d, m = 7, 16, 32
    model = small("modadd_transformer")
    embed, pos = (p + 1) * d, 3 * d
    attn = d * 3 * d + 3 * d + d * d + d
    mlp = d * m + m + m * d + d
    assert n_params(model) == embed + pos + attn + mlp + d * p + p
    tokens = make_input("modadd_transformer")
    mask = model.number_mask(tokens)
    assert mask.tolist() == [[True, True, False]] * B
    with model.default_tokens().bind(model, tokens, mask=mask) as bound:
        assert torch.equal(bound.valid, mask)
    # the paper-sized model starts near the weight norm the paper code logged (123)
    full = create_model("modadd_transformer")
    norm = torch.sqrt(sum(q.square().sum() for q in full.parameters()))
    assert 115 < norm.item() < 135


def test_modadd_rejects_bad_tokens() -> None:
    model = small("modadd_transformer")
    with pytest.raises(ValueError, match="a b ="):
        model(torch.tensor([[1, 2, 3]]))  # third token is not `=` (7)
    with pytest.raises(ValueError, match=r"\(batch, 3\)"):
        model(torch.tensor([[1, 2]]))


def test_modadd_layer_norm_option() -> None:
    model = small("modadd_transformer", layer_norm=True)
    assert any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in small("modadd_transformer").modules())


# --------------------------------------------------------------------------- parity / boolean
def test_parity_bit_formats_agree() -> None:
    model = small("parity_transformer").eval()
    x = make_input("parity_transformer")
    torch.testing.assert_close(model(x), model(((x + 1) / 2).long()))
    scalar = small("parity_transformer", num_classes=1)
    assert scalar(x).shape == (B,)
    with pytest.raises(ValueError, match="-1 or \\+1"):
        model(x * 0.5)
    with pytest.raises(ValueError, match="n_bits=9"):
        model(torch.ones(B, 9))


def test_boolean_positional_parameters_and_layer_norms() -> None:
    model = small("boolean_transformer", layers=2).eval()
    assert [n for n, _ in model.named_parameters() if "pos" in n] == ["pos_embedding"]
    assert model.pos_embedding.shape == (8, 8)  # n_bits × d/2
    names = [n for n, _ in model.layer_norms()]
    assert names == ["blocks.0.ln1", "blocks.0.ln2", "blocks.1.ln1", "blocks.1.ln2"]
    # layer_norms() is in the order the forward pass runs them (blow-up hooks rely on it)
    order: list[str] = []
    handles = [
        m.register_forward_pre_hook(lambda mod, args, n=n: order.append(n))
        for n, m in model.layer_norms()
    ]
    try:
        model(make_input("boolean_transformer"))
    finally:
        for h in handles:
            h.remove()
    assert order == names


def test_boolean_reads_the_last_position() -> None:
    model = small("boolean_transformer").eval()
    x = make_input("boolean_transformer")
    flipped = x.clone()
    flipped[:, 0] *= -1  # the first bit reaches the last position through attention
    assert (model(flipped) - model(x)).abs().min() > 1e-6
    # the head sees only the final hidden state at position -1
    g = torch.Generator().manual_seed(4)

    def scramble(position: slice):
        def hook(module, args, out):
            out = out.clone()
            out[:, position] = torch.randn(out[:, position].shape, generator=g)
            return out
        return model.blocks[-1].register_forward_hook(hook)

    clean = model(x)
    handle = scramble(slice(0, -1))
    try:
        torch.testing.assert_close(model(x), clean)
    finally:
        handle.remove()
    handle = scramble(slice(-1, None))
    try:
        assert (model(x) - clean).abs().min() > 1e-6
    finally:
        handle.remove()
    with pytest.raises(ValueError, match="even"):
        create_model("boolean_transformer", dim=15)
