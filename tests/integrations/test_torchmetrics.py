"""TokenSensitivityMetric: the torchmetrics form equals TokenSensitivity in one process, and two
gloo processes under a DistributedSampler meet the distributed rule (docs/integrations.md)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import pickle
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


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """gloo_worker.py's JSON: two runs of two processes, and forward's values per step."""
    out = tmp_path_factory.mktemp("gloo") / "result.json"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(HERE / "gloo_worker.py"), str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _replay_the_rule() -> tuple[list[TokenSensitivityMetric], list[tuple[float, int]]]:
    """The distributed rule, replayed in one process: rank r's batches with rank r's seed,
    repeats dropped. The two ranks' metrics, and each step's sum of rates and examples over
    both ranks."""
    w = _worker_module()
    model, data = w.model_and_data()
    seen: set[int] = set()
    parts = [TokenSensitivityMetric(Patches(2), generator=rank_seed(w.SEED, r), **w.OPTIONS)
             for r in range(2)]
    loaders = [list(w.loader(data, r, 2)) for r in range(2)]
    assert sum(len(idx) for batches in loaders for idx, _ in batches) == 8  # one repeat
    steps = []
    for step in zip(*loaders, strict=True):
        keep = []
        for idx, _ in step:
            keep.append(torch.tensor([i not in seen for i in idx.tolist()]))
            seen.update(idx.tolist())
        s1, n = 0.0, 0
        for part, (_, x), k in zip(parts, step, keep, strict=True):
            if k.any():
                part.update(model, x[k])
                s1, n = s1 + part.batch_estimate * int(k.sum()), n + int(k.sum())
        steps.append((s1, n))
    return parts, steps


@pytest.mark.heavy
def test_two_gloo_processes_meet_the_distributed_rule(gloo_run: dict):
    """World 2, 7 examples, DistributedSampler (pads to 8), deduplicated by index: every example
    once; exactly the numbers of the rule (rank 0 the seed's stream, rank 1 the derived seed) in
    both runs; within the interval of one process."""
    first, second = gloo_run["runs"]
    assert first == second  # exact reproducibility at a fixed world size

    w = _worker_module()
    model, data = w.model_and_data()
    parts, _ = _replay_the_rule()
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


@pytest.mark.heavy
def test_dist_sync_on_step_returns_the_step_value_of_all_processes(gloo_run: dict):
    """dist_sync_on_step=True: forward returns, on every rank, the value of the step's examples
    on all ranks together (as torchmetrics' own metrics do), not the rank's own batch value; the
    sampler's repeat, skipped on one rank, counts once."""
    ranks = gloo_run["on_step"]
    _, steps = _replay_the_rule()
    assert ranks[0] == ranks[1]
    assert ranks[0] == pytest.approx([s1 / n for s1, n in steps], abs=1e-12)


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
    # its own set_dtype still applies: a rank that measured nothing syncs float64 empties
    assert holder.metric.dtype == torch.float64
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


def test_state_dict_keeps_the_seen_indices():
    """persistent(True): the state dict holds the indices already measured (``seen_index``), so
    after load_state_dict (here inside a parent module) they are skipped as before the save, not
    counted again; a state dict without them (saved before they were stored) rebuilds them
    from the measured examples' indices. Updates after a load leave the loaded state dict as it
    was (torchmetrics kept its lists, and appended to them)."""
    model, x = mlp(), images(8)

    def holder() -> nn.Module:
        h = nn.Module()
        h.metric = TokenSensitivityMetric(Patches(2), sigma=1.0)
        h.metric.persistent(True)
        return h

    src = holder()
    src.metric.update(model, x[:6], index=torch.arange(6))
    sd = src.state_dict()
    for saved in (sd, {k: v for k, v in sd.items() if k != "metric.seen_index"}):
        dst = holder()
        dst.metric.update(model, x[6:], index=torch.tensor([6, 7]))  # replaced by the load
        assert dst.metric.result().num_examples == 2
        dst.load_state_dict(saved)  # strict: no unexpected key
        assert dst.metric.compute().item() == src.metric.compute().item()  # not the cached one
        dst.metric.update(model, x[4:], index=torch.arange(4, 8))  # 4, 5 seen: skipped
        assert torch.cat(dst.metric.sample_index).tolist() == list(range(8))
        assert dst.metric.result().num_examples == 8
    assert sd["metric.seen_index"].tolist() == list(range(6))
    assert len(sd["metric.sample_index"]) == 1
    fresh = TokenSensitivityMetric(Patches(2), sigma=1.0)  # not persistent: nothing saved
    fresh.update(model, x[:2], index=torch.arange(2))
    assert "seen_index" not in fresh.state_dict()


def test_merge_state_with_dist_sync_on_step_and_from_a_state_dict():
    """merge_state also with dist_sync_on_step=True (torchmetrics refuses it for its own
    forward; here only forward's value is synced, the states add up), and a state dict's
    seen_index counts as seen."""
    model, x = mlp(), images(6)
    a = TokenSensitivityMetric(Patches(2), sigma=1.0)
    a.persistent(True)
    a.update(model, x[:4], index=torch.arange(4))
    b = TokenSensitivityMetric(Patches(2), sigma=1.0, generator=3, dist_sync_on_step=True)
    b.merge_state(a.state_dict())
    b.update(model, x[2:], index=torch.arange(2, 6))  # 2, 3 merged: skipped
    assert b.result().num_examples == 6
    assert b(model, x[:1], index=[0]).isnan()  # all seen: no value, nothing added
    assert b.batch_estimate is None and b.result().num_examples == 6


def test_a_clone_continues_the_noise_stream():
    """clone() (a deepcopy, or a pickle) leaves the model behind but continues the noise stream
    where the original stands: both, updated with the same next batch, give the same numbers —
    those of one TokenSensitivity over both batches. A clone used by another process starts
    from that process's seed (not the original's stream: the two would draw the same noise).
    After reset() a clone restarts from the seed, like the original."""
    model, x = mlp(), images(12)
    opts = {"sigma": 1.0, "repeats": 2, "generator": 4}
    a = TokenSensitivityMetric(Patches(2), **opts)
    a.update(model, x[:6])
    copies = [a.clone(), copy.deepcopy(a), pickle.loads(pickle.dumps(a))]
    copies.append(copies[0].clone())  # a copy of a copy that has not measured yet
    assert all(c._engine is None for c in copies)
    a.update(model, x[6:])
    ref = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=4)
    ref.update(x[:6])
    ref.update(x[6:])
    want = ref.compute()
    assert a.result().estimate == want.estimate
    for c in copies:
        c.update(model, x[6:])
        got = c.result()
        assert got.estimate == want.estimate and torch.equal(got.per_sample, want.per_sample)
    elsewhere = a.clone()
    elsewhere._distributed = lambda: (1, 2)  # as on rank 1 of 2
    elsewhere.update(model, x[:6])
    ref = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=rank_seed(4, 1))
    ref.update(x[:6])
    assert elsewhere.result().per_sample[-6:].tolist() == ref.compute().per_sample.tolist()
    a.reset()
    again = a.clone()
    again.update(model, x[:6])
    assert again.compute().item() == token_sensitivity(model, x[:6], Patches(2), **opts).estimate
