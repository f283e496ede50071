"""The paper-scale settings of the four Hahn & Rofin experiments, pinned to the authors' code
(lacoco-lab/sensitivity-hardness; the audit with file:line references is docs/fidelity.md).

Every audited field is read from ``resolve("paper", [])`` or from the model the ``boolean``
trainer builds, so a drift fails here. Deliberate differences are asserted as what senslab does,
with the reason in a comment.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from senslab.experiments import get_experiment
from senslab.experiments.hahn_rofin.norm_vs_blowup import sweep
from senslab.measure.sharpness import layernorm_blowup, parameter_norm
from senslab.models import create_model
from senslab.models.text import Block
from senslab.train.loops import boolean
from senslab.train.loops.boolean import BooleanRunConfig
from senslab.train.trainers import train_run

EXPERIMENTS = ("hr_sharpness_vs_length", "hr_norm_vs_blowup", "hr_parity_dynamics",
               "hr_random_functions")


def paper(name: str) -> tuple[Any, list[Any]]:
    return get_experiment(name).resolve("paper", [])


def trainer_model(cfg: BooleanRunConfig) -> nn.Module:
    """The model exactly as the boolean trainer builds it for ``cfg``."""
    return create_model("boolean_transformer", n_bits=cfg.n, dim=cfg.dim, ff_dim=cfg.dim,
                        layers=cfg.layers, heads=cfg.heads, init=cfg.init, seed=cfg.seed)


# ---------------------------------------------------------------- shared setup (conf/train_config)
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_paper_run_has_the_authors_model_and_optimiser(name: str) -> None:
    _, runs = paper(name)
    assert runs
    for run in runs:
        c = run.config
        assert run.trainer == "boolean"
        # model: hidden_dim 128, num_layers 2, num_attn_heads 2, dropout 0 (FF = hidden_dim)
        assert (c.dim, c.layers, c.heads) == (128, 2, 2)
        assert c.init == "torch_encoder"
        # training: batch 1024 fresh strings (subset runs: 1024 drawn with replacement)
        assert c.batch == 1024
        if c.train_size is not None:
            assert c.subset_batch == 1024
        else:
            assert c.subset_batch is None
        # the authors' figures keep runs with evaluation loss < 0.001 (and acc > 0.99 in train())
        assert c.converged_loss == 1e-3
        # ours: one fixed evaluation batch of the authors' batch size, not 1,000 fresh batches
        assert c.eval_size == 1024
        if name != "hr_norm_vs_blowup":  # the sweep draws lr and wd
            assert c.lr == 3e-4
            assert c.weight_decay == 0.1


def test_paper_steps_draws_and_cadence_per_experiment() -> None:
    expected = {  # (steps, sharpness draws, eval_every)
        "hr_sharpness_vs_length": (10_000, 10, 500),  # n_repeats 10; eval_every ours (curves)
        "hr_norm_vs_blowup": (10_000, 10, 500),
        "hr_parity_dynamics": (20_000, 500, 100),  # dynamic_metrics_1: 20k steps, 500, every 100
        "hr_random_functions": (10_000, 100, 100),  # train sharpness with 100 repeats
    }
    for name, (steps, draws, every) in expected.items():
        s, runs = paper(name)
        assert (s.steps, s.sharp_draws, s.eval_every) == (steps, draws, every), name
        assert {(r.config.steps, r.config.sharp_draws) for r in runs} == {(steps, draws)}


def test_measurement_constants_follow_the_authors() -> None:
    assert boolean.SIGMA == 0.02  # hessian_norm_proxy.epsilon
    assert boolean.SHARPNESS_SCALE == 4.0  # multiply_by_4 in the plotting code
    assert boolean.CONVERGED_ACC == 0.99  # has_converged = eval_accuracy > 0.99


# --------------------------------------------------------------------------- the model (model.py)
def _authors_encoder(model: nn.Module, d: int, heads: int, layers: int) -> nn.Module:
    """PyTorch's post-LN TransformerEncoder (the authors' module) carrying senslab's weights."""
    layer = nn.TransformerEncoderLayer(d_model=d, nhead=heads, dim_feedforward=d, dropout=0.0,
                                       activation="relu", batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
    with torch.no_grad():
        for ours, theirs in zip(model.blocks, enc.layers, strict=True):
            theirs.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
            theirs.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
            theirs.self_attn.out_proj.weight.copy_(ours.attn.proj.weight)
            theirs.self_attn.out_proj.bias.copy_(ours.attn.proj.bias)
            for a, b in ((theirs.linear1, ours.mlp[0]), (theirs.linear2, ours.mlp[2]),
                         (theirs.norm1, ours.ln1), (theirs.norm2, ours.ln2)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
    return enc


def test_model_computes_the_authors_encoder() -> None:
    """Bit ⊕ position embeddings (d/2 each, concatenated), post-LN encoder layers with ReLU FF of
    width d, scalar head at the last position: the same function as PyTorch's encoder."""
    _, runs = paper("hr_parity_dynamics")
    cfg = runs[0].config
    model = trainer_model(cfg).train()
    d = cfg.dim
    assert model.bit_embed.weight.shape == (2, d // 2)
    assert model.pos_embedding.shape == (cfg.n, d // 2)  # positional table of max_len = n rows
    assert isinstance(model.head, nn.Linear) and (model.head.in_features,
                                                   model.head.out_features) == (d, 1)
    assert model.readout_position == -1
    for block in model.blocks:
        assert isinstance(block, Block) and block.norm == "post"
        assert isinstance(block.mlp[1], nn.ReLU) and block.mlp[0].out_features == d
        assert block.attn.heads == 2 and block.drop.p == 0.0
        assert block.ln1.eps == block.ln2.eps == 1e-5
    enc = _authors_encoder(model, d, cfg.heads, cfg.layers).train()
    # same parameter count as the authors' TorchModel (embeddings and head added)
    theirs = sum(p.numel() for p in enc.parameters()) + 2 * d // 2 + cfg.n * d // 2 + d + 1
    assert sum(p.numel() for p in model.parameters()) == theirs
    bits = torch.randint(0, 2, (16, cfg.n), generator=torch.Generator().manual_seed(1))
    h = torch.cat([model.bit_embed(bits), model.pos_embedding.expand(16, -1, -1)], dim=-1)
    expected = model.head(enc(h))[:, -1, 0]
    torch.testing.assert_close(model(bits), expected, rtol=1e-4, atol=1e-5)


def test_torch_encoder_init_is_the_authors() -> None:
    """nn.TransformerEncoder clones one initialised layer; MultiheadAttention: Xavier-uniform
    in_proj, zero in_proj and out_proj biases; Linear layers U(±1/√fan_in); embeddings N(0, 1)."""
    cfg = paper("hr_sharpness_vs_length")[1][0].config
    model = trainer_model(BooleanRunConfig(**{**vars(cfg), "n": 30}))
    d = cfg.dim
    first, second = model.blocks
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    qkv = first.attn.qkv.weight
    bound = math.sqrt(6 / (d + 3 * d))
    assert qkv.abs().max() <= bound and qkv.std().item() == pytest.approx(bound / 3**0.5, rel=0.02)
    assert first.attn.qkv.bias.eq(0).all() and first.attn.proj.bias.eq(0).all()
    lin = 1 / math.sqrt(d)
    assert first.mlp[0].bias.abs().max() <= lin and first.mlp[0].bias.abs().max() > lin / 2
    assert model.bit_embed.weight.std().item() == pytest.approx(1.0, abs=0.2)
    assert model.pos_embedding.std().item() == pytest.approx(1.0, abs=0.05)
    # the CPU scale keeps senslab's own init: independent blocks, U(±1/√d) q/k/v biases
    cpu = get_experiment("hr_sharpness_vs_length").resolve("cpu", [])[1][0].config
    assert cpu.init == "independent"
    small = trainer_model(cpu)
    assert not torch.equal(small.blocks[0].attn.qkv.weight, small.blocks[1].attn.qkv.weight)
    assert small.blocks[0].attn.qkv.bias.abs().max() > 0


# ------------------------------------------------------------ measurements (measurements.py)
def test_parameter_norm_and_sharpness_leave_out_only_the_positions() -> None:
    model = trainer_model(paper("hr_parity_dynamics")[1][0].config)
    total = sum(p.detach().double().square().sum() for n, p in model.named_parameters()
                if n != "pos_embedding")
    assert parameter_norm(model) == pytest.approx(math.sqrt(total.item()), rel=1e-12)
    assert [n for n, _ in model.named_parameters() if "pos" in n] == ["pos_embedding"]


def test_blowup_is_the_product_of_max_inverse_divisors_last_layer_at_readout() -> None:
    """Aggregation as the authors' ``blowup_encoder_maxs_prod``: per LayerNorm max over positions,
    the last layer at the read-out position, product over LayerNorms, per string. Deliberate
    difference: senslab divides by the LayerNorm's own √(biased var + ε), the authors by the
    unbiased std without ε (≈ 0.4% lower per LayerNorm at d = 128, and unbounded as var → 0)."""
    model = trainer_model(paper("hr_parity_dynamics")[1][0].config).eval()
    bits = torch.randint(0, 2, (8, 25), generator=torch.Generator().manual_seed(2))
    inputs: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_pre_hook(
        lambda _m, a, name=name: inputs.__setitem__(name, a[0].detach().double()))
        for name, m in model.layer_norms()]
    try:
        with torch.no_grad():
            model(bits)
    finally:
        for h in handles:
            h.remove()
    ours = torch.ones(8, dtype=torch.float64)
    for name, h in inputs.items():
        inv = (h.var(dim=-1, unbiased=False) + 1e-5).rsqrt()
        ours *= inv[:, -1] if name.startswith("blocks.1.") else inv.amax(dim=1)
    torch.testing.assert_close(layernorm_blowup(model, bits), ours)
    authors = torch.ones(8, dtype=torch.float64)
    for name, h in inputs.items():
        inv = 1 / h.std(dim=-1)
        authors *= inv[:, -1] if name.startswith("blocks.1.") else inv.amax(dim=1)
    assert not torch.allclose(authors, ours, rtol=1e-4)  # the documented difference is real


# ----------------------------------------------------------------------------- the four sweeps
def test_sharpness_vs_length_grid() -> None:
    s, runs = paper("hr_sharpness_vs_length")  # length_scaling_1: grid n 4..30, seeds 0..9
    assert s.n_values == tuple(range(4, 31)) and s.seeds == 10
    assert s.functions == ("parity", "majority", "first", "mean")
    assert len(runs) == 27 * 10 * 4
    assert {r.config.n for r in runs} == set(range(4, 31))
    assert {r.config.seed for r in runs} == set(range(10))


def test_norm_vs_blowup_sweep_is_the_authors_random_sweep() -> None:
    # weight_norm_blowup_tradeoff_1 + _2: 1,000 runs of MAJORITY/FIRST/MEAN and 1,000 of PARITY,
    # n uniform in 4..25, lr uniform in [1e-4, 5e-4], wd uniform in [0, 0.4]
    s, runs = paper("hr_norm_vs_blowup")
    assert (s.runs, s.log_uniform) == (2000, False)
    assert s.n_values == tuple(range(4, 26))
    assert s.lr_range == (1e-4, 5e-4) and s.wd_range == (0.0, 0.4)
    plan = sweep(s)
    counts = Counter(p["function"] for p in plan)
    # ours: functions are cycled (an exact mix) where wandb draws them
    assert counts == {"parity": 1000, "majority": 334, "first": 333, "mean": 333}
    assert {p["n"] for p in plan} == set(range(4, 26))
    lrs = torch.tensor([p["lr"] for p in plan])
    wds = torch.tensor([p["weight_decay"] for p in plan])
    assert 1e-4 <= lrs.min() and lrs.max() <= 5e-4 and 0 <= wds.min() and wds.max() <= 0.4
    # uniform, not log-uniform: the means sit at the middle of the ranges
    assert lrs.mean().item() == pytest.approx(3e-4, rel=0.03)
    assert wds.mean().item() == pytest.approx(0.2, rel=0.05)
    assert [(r.config.lr, r.config.weight_decay) for r in runs] == [
        (p["lr"], p["weight_decay"]) for p in plan]


def test_norm_vs_blowup_cpu_sweep_is_still_log_uniform() -> None:
    s = get_experiment("hr_norm_vs_blowup").resolve("cpu", [])[0]
    assert s.log_uniform
    g = torch.Generator().manual_seed(s.sweep_seed)
    g_n = int(torch.randint(len(s.n_values), (), generator=g))
    u = torch.rand((), generator=g).item()
    lr = math.exp(math.log(s.lr_range[0]) + u * (math.log(s.lr_range[1]) - math.log(s.lr_range[0])))
    first = sweep(s)[0]
    assert (first["n"], first["lr"]) == (s.n_values[g_n], lr)
    with pytest.raises(ValueError, match="log_uniform"):
        sweep(type(s)(wd_range=(0.0, 0.4)))


def test_parity_dynamics_is_the_authors_dynamic_sweep_at_wd_0_1() -> None:
    s, runs = paper("hr_parity_dynamics")  # dynamic_metrics_1: n 25, seeds 0..100
    assert (s.n, s.seeds, s.weight_decay, s.t0_on) == (25, 101, 0.1, "eval")
    assert {r.config.function for r in runs} == {"parity"} and len(runs) == 101
    cpu = get_experiment("hr_parity_dynamics").resolve("cpu", [])[0]
    assert cpu.t0_on == "train"  # the CPU scale keeps its per-step t0


def test_random_functions_first_step() -> None:
    s, runs = paper("hr_random_functions")  # generalization_first_step_*: n 10, k, 10 x 10 seeds
    assert (s.n, s.train_sizes, s.seeds, s.stop_loss) == (10, (128, 256, 512), 100, None)
    assert all(r.config.stop_below is None for r in runs)  # the authors train all 10,000 steps
    assert Counter(r.config.completion for r in runs) == {"learned": 300, "random": 300}


def test_converged_adds_the_loss_bound_only_when_set() -> None:
    record = {"test/acc": 1.0, "test/loss": 0.005, "train/acc": 0.5, "train/loss": 0.0001}
    fresh = BooleanRunConfig(function="parity", n=4)
    assert boolean.converged(record, fresh)  # CPU rule: accuracy alone
    assert not boolean.converged(record, BooleanRunConfig(function="parity", n=4,
                                                          converged_loss=1e-3))
    subset = BooleanRunConfig(function="random", n=4, train_size=6, converged_loss=1e-3)
    assert not boolean.converged(record, subset)  # training accuracy 0.5
    assert boolean.converged({**record, "train/acc": 1.0}, subset)


def test_subset_batch_draws_with_replacement(tmp_path: Path) -> None:
    cfg = BooleanRunConfig(function="random", n=4, train_size=6, dim=8, steps=12, eval_every=6,
                           sharp_draws=2, lr=3e-3, subset_batch=16, device="cpu")
    drawn = train_run("boolean", cfg, tmp_path / "drawn", log=lambda _: None)
    full = train_run("boolean", BooleanRunConfig(**{**vars(cfg), "subset_batch": None}),
                     tmp_path / "full", log=lambda _: None)
    assert drawn["config"]["subset_batch"] == 16
    assert drawn["final"]["train/loss"] != full["final"]["train/loss"]  # other batches
