"""TokenSensitivityMetric: the torchmetrics form equals TokenSensitivity in one process, and two
gloo processes under a DistributedSampler meet the distributed rule (docs/integrations.md)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric, rank_seed  # noqa: E402
from senslab.measure import TokenSensitivity, token_sensitivity  # noqa: E402
from senslab.tokens import Embedding, Patches  # noqa: E402

HERE = Path(__file__).resolve().parent


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))


def images(n: int = 13) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_metric_equals_token_sensitivity_over_batches():
    model, x = mlp(), images()
    metric = TokenSensitivityMetric(Patches(2), sigma=1.0, repeats=3, generator=7)
    metric.update(model, x[:6])
    metric.update(model, x[6:])
    got = metric.result()
    ref = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=3, generator=7)
    ref.update(x[:6])
    ref.update(x[6:])
    want = ref.compute()
    assert isinstance(metric.compute(), torch.Tensor)
    assert metric.compute().item() == want.estimate
    for name in ("estimate", "stderr", "stderr_subset", "ci95", "num_examples", "num_forward"):
        assert getattr(got, name) == getattr(want, name), name
    assert torch.equal(got.per_sample, want.per_sample)
    assert torch.equal(got.per_position, want.per_position)
    assert torch.equal(got.position_counts, want.position_counts)


def test_reset_restarts_the_noise_and_index_dedupes():
    model, x = mlp(), images(7)
    metric = TokenSensitivityMetric(Patches(2), sigma=1.0)
    metric.update(model, x)
    first = metric.result()
    metric.reset()
    metric.update(model, x[:4], index=torch.arange(4))
    metric.update(model, x[2:], index=torch.arange(2, 7))  # examples 2, 3 again: skipped
    again = metric.result()
    assert again.num_examples == 7
    assert first.estimate == float(token_sensitivity(model, x, Patches(2), sigma=1.0))
    with pytest.raises(RuntimeError, match="no examples"):
        TokenSensitivityMetric(Patches(2), sigma=1.0)._result()


def test_merge_state_after_a_compute_counts_the_merged_examples():
    """merge_state after compute()/result(): the next result holds both metrics' examples
    (torchmetrics' cached value of the earlier compute came back), and the indices either
    metric has seen are skipped after the merge."""
    model, x = mlp(), images(9)

    def pair() -> tuple[TokenSensitivityMetric, TokenSensitivityMetric]:
        a = TokenSensitivityMetric(Patches(2), sigma=1.0, repeats=2, generator=0)
        b = TokenSensitivityMetric(Patches(2), sigma=1.0, repeats=2, generator=5)
        a.update(model, x[:5], index=torch.arange(5))
        b.update(model, x[5:], index=torch.arange(5, 9))
        return a, b

    a, b = pair()
    ra, rb = a.result(), b.result()
    a.merge_state(b)
    merged = a.result()
    assert merged.num_examples == 9
    assert merged.estimate == pytest.approx((5 * ra.estimate + 4 * rb.estimate) / 9)
    assert a.compute().item() == merged.estimate
    fresh, other = pair()
    fresh.merge_state(other)
    assert fresh.result().estimate == merged.estimate
    a.update(model, x[3:7], index=torch.arange(3, 7))  # all seen by one of the two: skipped
    assert a.result().num_examples == 9


def test_forward_returns_the_batch_value_and_keeps_accumulating():
    model, x = mlp(), images(8)
    metric = TokenSensitivityMetric(Patches(4), sigma=1.0)
    a = metric(model, x[:4])
    metric(model, x[4:])
    ref = TokenSensitivity(model, Patches(4), sigma=1.0)
    ref.update(x[:4])
    assert a.item() == ref.compute().estimate
    ref.update(x[4:])
    assert metric.compute().item() == ref.compute().estimate


def test_text_profile_right_aligned_and_copy_drops_the_model():
    torch.manual_seed(0)

    class Text(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(20, 8)
            self.head = nn.Linear(8, 2)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids).mean(1))

    model = Text()
    ids = torch.randint(0, 20, (5, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[0, 4:] = False
    opts = {"sigma": 2.0, "align": "right", "repeats": 2}
    metric = TokenSensitivityMetric(Embedding("embed"), **opts)
    metric.update(model, ids[:2], mask[:2])
    metric.update(model, ids[2:], mask[2:])
    ref = TokenSensitivity(model, Embedding("embed"), **opts)
    ref.update(ids[:2], mask[:2])
    ref.update(ids[2:], mask[2:])
    got, want = metric.result(), ref.compute()
    assert torch.equal(got.positions, want.positions)
    assert torch.equal(got.per_position, want.per_position)
    clone = copy.deepcopy(metric)  # the model is not copied along
    assert clone._engine is None and clone.compute().item() == want.estimate


def test_options_are_checked_when_built():
    with pytest.raises(TypeError, match="did you mean sigma"):
        TokenSensitivityMetric(Patches(2), sigm=0.1)
    with pytest.raises(ValueError, match="positive"):
        TokenSensitivityMetric(Patches(2), sigma=-1.0)
    with pytest.raises(TypeError, match="shard"):
        TokenSensitivityMetric(Patches(2), sigma=0.1, shard=(0, 2))
    with pytest.raises(ValueError, match="one integer example index"):
        TokenSensitivityMetric(Patches(2), sigma=0.1).update(mlp(), images(3), index=[0, 1])
    assert rank_seed(5, 0) == 5 and rank_seed(5, 1) != rank_seed(5, 2)


def _worker_module():
    spec = importlib.util.spec_from_file_location("gloo_worker", HERE / "gloo_worker.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_two_gloo_processes_meet_the_distributed_rule(tmp_path: Path):
    """World 2, 7 examples, DistributedSampler (pads to 8), deduplicated by index: every example
    once; exactly the numbers of the rule (rank 0 the seed's stream, rank 1 the derived seed) in
    both runs; within the interval of one process."""
    out = tmp_path / "result.json"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(HERE / "gloo_worker.py"), str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = json.loads(out.read_text())
    assert first == second  # exact reproducibility at a fixed world size

    w = _worker_module()
    model, data = w.model_and_data()
    # the rule, replayed in one process: rank r's batches with rank r's seed, repeats dropped
    seen: set[int] = set()
    parts = [TokenSensitivityMetric(Patches(2), generator=rank_seed(w.SEED, r), **w.OPTIONS)
             for r in range(2)]
    loaders = [list(w.loader(data, r, 2)) for r in range(2)]
    assert sum(len(idx) for batches in loaders for idx, _ in batches) == 8  # one repeat
    for step in zip(*loaders, strict=True):
        keep = []
        for idx, _ in step:
            keep.append(torch.tensor([i not in seen for i in idx.tolist()]))
            seen.update(idx.tolist())
        for part, (_, x), k in zip(parts, step, keep, strict=True):
            if k.any():
                part.update(model, x[k])
    n = sum(p.n for p in parts)
    s1 = sum(p.s1 for p in parts)
    assert first["n"] == n == 7
    assert first["estimate"] == pytest.approx(float(s1 / n), abs=1e-15)
    assert first["compute"] == first["estimate"]

    one = TokenSensitivityMetric(Patches(2), generator=w.SEED, **w.OPTIONS)
    one.update(model, data.tensors[1])
    ref = one.result()
    assert first["num_forward"] == ref.num_forward  # same examples, same tokens, same draws
    bound = 1.96 * math.hypot(first["stderr_subset"], ref.stderr_subset)
    assert abs(first["estimate"] - ref.estimate) <= bound
    assert len(first["per_sample"]) == 7


def test_docs_snippet_runs(snippet, capsys):
    from torch.utils.data import DataLoader, TensorDataset

    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    x = images(6)
    loader = DataLoader(TensorDataset(torch.arange(6), x), batch_size=4)
    scope = {"model": model, "loader": loader}
    exec(snippet("torchmetrics and Lightning", 0), scope)
    r = scope["metric"].result()
    assert r.num_examples == 6
    ref = TokenSensitivity(model, Patches(4), sigma=0.5)
    ref.update(x[:4])
    ref.update(x[4:])
    assert r.estimate == ref.compute().estimate
    assert "sensitivity" in capsys.readouterr().out


def test_a_module_cast_to_bf16_leaves_the_states_in_float64():
    """A LightningModule under precision="bf16-true" is cast with .to(torch.bfloat16), which
    reaches the metric inside it: its float64 counts and sums had become bf16 (exact only up to
    256 examples: 300 were counted as 300 + rounding). They keep their dtype; .to(device) still
    moves them."""
    holder = nn.Module()
    holder.metric = TokenSensitivityMetric(Patches(4), sigma=1.0)
    holder.to(torch.bfloat16)
    metric = holder.metric
    assert metric.n.dtype == torch.float64 and metric.s1.dtype == torch.float64
    model, x = mlp(), images(300)
    for part in x.split(50):
        metric.update(model, part)
    r = metric.result()
    ref = token_sensitivity(model, x, Patches(4), sigma=1.0, generator=0)
    assert r.num_examples == 300 and r.num_forward == ref.num_forward
    assert r.estimate == pytest.approx(ref.estimate, abs=1e-12)
    holder.to("cpu", torch.float16)
    assert metric.n.dtype == torch.float64 and metric.n.item() == 300
