"""Combining TokenSensitivity states (merge, all_reduce) gives the numbers of one state that saw
everything, or refuses with the reason: the per-position profile weighs every token alike whatever
draws each metric made, and all_reduce checks that the ranks' states add up to one measurement."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.tokens import Patches, Sequence


# Two groups of examples told apart by token 0's first entry (10 or −10) on integer-valued
# inputs: a group-A example flips whenever any entry leaves the integer grid (every perturbed
# copy: σ-noise lands off the grid), a group-B example never (a margin of 10⁶). So every token
# of A flips at rate 1 and every token of B at rate 0, whatever the draws: a profile that
# weighs every token of every example alike reads 1/2 at each position for equal groups.
def grouped(x: torch.Tensor) -> torch.Tensor:
    group_a = x[:, 0, 0] > 5
    off = (x - x.round()).abs().sum((1, 2))
    return torch.where(group_a, 0.5 - 1e3 * off, torch.full_like(off, 1e6))[:, None]


def grouped_inputs(n_a: int, n_b: int, t: int = 4) -> torch.Tensor:
    x = torch.randint(-3, 4, (n_a + n_b, t, 2), generator=torch.Generator().manual_seed(5))
    x = x.float()
    x[:n_a, 0, 0], x[n_a:, 0, 0] = 10.0, -10.0
    return x


OPTS = dict(output_kind="logits", precision="float32")
# group B never flips: its metric's own result says so, as it should
pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests on no flip")


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))


def images(n: int) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(1))


# -- merge -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("first, second", [
    (dict(repeats=1), dict(repeats=8)),
    (dict(repeats=6), dict(repeats=2, antithetic=True)),
    (dict(repeats=4), dict(allocation="uniform")),
    (dict(allocation="uniform"), dict(repeats=3)),
])
def test_merged_profile_weighs_every_token_alike_whatever_the_draws(first, second):
    """A (flips at every token) measured with one set of draws, B (never flips) with another:
    per position 4 examples at rate 1 and 4 at rate 0, so 1/2, as the estimate says. Counted
    copy by copy, repeats=1 merged with repeats=8 read 0.111 (1/9) at every position."""
    x = grouped_inputs(4, 4)
    a = TokenSensitivity(grouped, Sequence(), sigma=1.0, generator=0, **first, **OPTS)
    b = TokenSensitivity(grouped, Sequence(), sigma=1.0, generator=1, **second, **OPTS)
    a.update(x[:4])
    b.update(x[4:])
    assert a.compute().per_position.tolist() == [1.0] * 4  # the construction holds
    assert b.compute().per_position.tolist() == [0.0] * 4
    r = a.merge(b).compute()
    assert r.estimate == 0.5
    assert r.per_position.tolist() == [0.5] * 4
    # counts in the receiving metric's copies per token: 8 examples × its draws per token
    unit = 1 if "allocation" in first else first["repeats"]
    assert r.position_counts.tolist() == [8.0 * unit] * 4


def test_merged_right_aligned_profile_of_other_repeats_matches_one_metric():
    """Right-aligned text of several lengths: a metric of repeats=2 merged with one of
    repeats=6 reads, per position, the per-token mean of both halves weighted by the examples
    present there, the weights a single metric gives them."""
    x = grouped_inputs(3, 3, t=5)
    lengths = torch.tensor([5, 3, 2, 4, 5, 1])
    mask = torch.arange(5)[None] < lengths[:, None]
    a = TokenSensitivity(grouped, Sequence(), sigma=1.0, repeats=2, generator=0, align="right",
                         **OPTS)
    b = TokenSensitivity(grouped, Sequence(), sigma=1.0, repeats=6, generator=1, align="right",
                         **OPTS)
    a.update(x[:3], mask[:3])
    b.update(x[3:], mask[3:])
    r = a.merge(b).compute()
    # position −k: the A examples (rate 1) and B examples (rate 0) with at least k tokens
    n_a = torch.stack([(lengths[:3] >= k).sum() for k in range(5, 0, -1)]).double()
    n_b = torch.stack([(lengths[3:] >= k).sum() for k in range(5, 0, -1)]).double()
    assert torch.equal(r.per_position, n_a / (n_a + n_b))
    assert torch.equal(r.position_counts, 2 * (n_a + n_b))


def test_merged_shards_equal_one_metric_in_every_number():
    """Shards of the same batches merged by hand: estimate, both standard errors, profile and
    counts are those of one metric that measured everything (per_sample in merge order)."""
    model, x = small_cnn(), images(11)
    opts = dict(sigma=1.0, repeats=3, generator=7, chunk_size=10, precision="float32")
    one = TokenSensitivity(model, Patches(2), **opts)
    one.update(x[:5])
    one.update(x[5:])
    ref = one.compute()
    parts = []
    for rank in range(2):
        m = TokenSensitivity(model, Patches(2), shard=(rank, 2), **opts)
        m.update(x[:5])
        m.update(x[5:])
        parts.append(m)
    r = parts[0].merge(parts[1]).compute()
    assert (r.num_examples, r.num_forward) == (ref.num_examples, ref.num_forward)
    assert r.estimate == pytest.approx(ref.estimate, abs=1e-12)
    assert r.stderr == pytest.approx(ref.stderr, abs=1e-12)
    assert r.stderr_subset == pytest.approx(ref.stderr_subset, abs=1e-12)
    assert torch.allclose(r.per_position, ref.per_position, atol=1e-12)
    assert torch.equal(r.position_counts, ref.position_counts)
    assert sorted(r.per_sample.tolist()) == sorted(ref.per_sample.tolist())


# -- all_reduce over two gloo processes --------------------------------------------------------

WORKER = r'''
import json, os, sys, warnings
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from senslab.measure import TokenSensitivity
from senslab.tokens import Patches, Sequence
''' + inspect.getsource(grouped) + inspect.getsource(grouped_inputs) + r'''
OPTS = dict(output_kind="logits", precision="float32")


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))


def attempt(run):
    try:
        return {"ok": run()}
    except ValueError as err:
        return {"error": str(err)}


def summary(r):
    return {"n": r.num_examples, "estimate": r.estimate, "stderr": r.stderr,
            "stderr_subset": r.stderr_subset, "per_sample": r.per_sample.tolist(),
            "per_position": r.per_position.tolist(),
            "position_counts": r.position_counts.tolist(), "num_forward": r.num_forward}


def worker(rank, world, init, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model = small_cnn()
    x = torch.randn(9, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    got = {}

    def sharded(updates, shard=(rank, world), **kw):
        m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=7,
                             chunk_size=16, shard=shard, precision="float32", **kw)
        for lo, hi in updates:
            m.update(x[lo:hi])
        return m

    # a rank that skipped a batch: rank 0 measured two batches, rank 1 one
    got["skipped"] = attempt(lambda: summary(
        sharded([(0, 4), (4, 9)] if rank == 0 else [(0, 4)]).all_reduce().compute()))
    # both ranks told shard=(0, 2): shard 0 twice, shard 1 never
    got["same_shard"] = attempt(lambda: summary(sharded([(0, 4)], shard=(0, 2))
                                                .all_reduce().compute()))
    # another sigma on rank 1
    got["sigma"] = attempt(lambda: _sigma(model, x, rank))
    # unsharded ranks with their own data in batches of other sizes
    def own():
        m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=3 + rank,
                             precision="float32")
        for lo, hi in ([(0, 2)] if rank == 0 else [(2, 5), (5, 6)]):
            m.update(x[lo:hi])
        mine = summary(m.compute())
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            total = summary(m.all_reduce().compute())
        return {"own": mine, "total": total, "said": [str(w.message) for w in said]}
    got["own_data"] = attempt(own)
    # both ranks measured the same examples with the same seed, without shard=
    def twice():
        m = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=3,
                             precision="float32")
        m.update(x[:4])
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            n = m.all_reduce().compute().num_examples
            m.all_reduce()  # said once per metric
        return {"n": n, "said": [str(w.message) for w in said]}
    got["twice"] = attempt(twice)
    # a rank of repeats=1 on examples that always flip, one of repeats=8 on examples that never
    def draws():
        g = grouped_inputs(3, 3)
        m = TokenSensitivity(grouped, Sequence(), sigma=1.0, repeats=1 + 7 * rank,
                             generator=rank, **OPTS)
        m.update(g[:3] if rank == 0 else g[3:])
        return summary(m.all_reduce().compute())
    got["draws"] = attempt(draws)
    # the shards of the same batches: the one-process numbers
    got["equal"] = attempt(lambda: summary(sharded([(0, 4), (4, 9)]).all_reduce().compute()))
    everything = [None] * world
    dist.all_gather_object(everything, got)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(everything, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # past the interpreter's teardown, where gloo now and then aborts a rank


def _sigma(model, x, rank):
    m = TokenSensitivity(model, Patches(2), sigma=1.0 + rank, generator=7, precision="float32")
    m.update(x[:2])
    return summary(m.all_reduce().compute())


if __name__ == "__main__":
    target = sys.argv[1]
    init = "file://" + os.path.join(os.path.dirname(os.path.abspath(target)), "rendezvous")
    torch.set_num_threads(1)
    mp.start_processes(worker, args=(2, init, target), nprocs=2, join=True, start_method="fork")
'''


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Both ranks' outcome of every scenario of :data:`WORKER` (two forked gloo processes)."""
    tmp = tmp_path_factory.mktemp("reduce")
    script, out = tmp / "worker.py", tmp / "out.json"
    script.write_text(WORKER)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def refused(ranks: list[dict], case: str) -> str:
    """The message both ranks refused ``case`` with (the same on each: none waits)."""
    messages = [r[case].get("error") for r in ranks]
    assert messages[0] is not None and messages[0] == messages[1], [r[case] for r in ranks]
    return messages[0]


def test_all_reduce_refuses_ranks_that_made_different_numbers_of_updates(ranks):
    """Had failed with Python's bare "zip() argument 2 is shorter than argument 1"."""
    msg = refused(ranks, "skipped")
    assert "rank 0: 2, rank 1: 1" in msg and "update()" in msg


def test_all_reduce_refuses_two_ranks_with_one_shard(ranks):
    """Both ranks on shard (0, 2) had summed to shard 0's examples twice, without a word."""
    msg = refused(ranks, "same_shard")
    assert "[(0, 2), (0, 2)]" in msg and "shard=(dist.get_rank()" in msg


def test_all_reduce_refuses_ranks_of_another_sigma(ranks):
    """merge refuses another σ; all_reduce had summed σ = 1 and σ = 2 into one number."""
    msg = refused(ranks, "sigma")
    assert "sigma 1.0" in msg and "sigma 2.0" in msg


def test_all_reduce_of_unsharded_ranks_with_batches_of_other_sizes(ranks):
    """Rank 0 measured 2 examples in one update, rank 1 4 in two: the total is their sums,
    per_sample rank 0's then rank 1's (had failed with "attempt to assign sequence of size 2
    to extended slice of size 3")."""
    outcome = [r["own_data"]["ok"] for r in ranks]
    own0, own1 = outcome[0]["own"], outcome[1]["own"]
    total = outcome[0]["total"]
    assert outcome[1]["total"] == total
    assert total["n"] == own0["n"] + own1["n"] == 6
    assert total["per_sample"] == own0["per_sample"] + own1["per_sample"]
    mean = (own0["estimate"] * 2 + own1["estimate"] * 4) / 6
    assert total["estimate"] == pytest.approx(mean, abs=1e-12)
    assert total["num_forward"] == own0["num_forward"] + own1["num_forward"]
    rates = torch.tensor(total["per_sample"], dtype=torch.float64)
    assert total["stderr"] == pytest.approx((rates.std() / 6 ** 0.5).item(), rel=1e-6)


def test_all_reduce_profile_weighs_ranks_of_other_repeats_alike(ranks):
    """repeats=1 on examples that always flip, repeats=8 on examples that never: per position
    3 examples at 1 and 3 at 0 (had read 1/9, for an estimate of 1/2)."""
    total = ranks[0]["draws"]["ok"]
    assert ranks[1]["draws"]["ok"] == total
    assert total["estimate"] == 0.5
    assert total["per_position"] == [0.5] * 4
    assert total["position_counts"] == [6.0] * 4  # in rank 0's unit: one copy per token


def test_all_reduce_of_shards_equals_one_process(ranks):
    model, x = small_cnn(), torch.randn(9, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    one = TokenSensitivity(model, Patches(2), sigma=1.0, repeats=2, generator=7, chunk_size=16,
                           precision="float32")
    one.update(x[:4])
    one.update(x[4:])
    ref = one.compute()
    for rank in ranks:
        got = rank["equal"]["ok"]
        assert got["n"] == 9 and got["num_forward"] == ref.num_forward
        assert got["per_sample"] == ref.per_sample.tolist()
        assert got["estimate"] == pytest.approx(ref.estimate, abs=1e-12)
        assert got["stderr"] == pytest.approx(ref.stderr, abs=1e-12)
        assert got["stderr_subset"] == pytest.approx(ref.stderr_subset, abs=1e-12)
        assert got["per_position"] == pytest.approx(ref.per_position.tolist(), abs=1e-12)
        assert got["position_counts"] == ref.position_counts.tolist()


def test_all_reduce_warns_of_two_ranks_with_the_same_examples(ranks):
    """Unsharded ranks that measured the same 4 examples under the same seed: the total counts
    8 examples (a standard error too small by √2), said once; ranks of their own examples and
    seeds are not warned of."""
    for rank in ranks:
        got = rank["twice"]["ok"]
        assert got["n"] == 8
        same = [m for m in got["said"] if "same per-example rates" in m]
        assert len(same) == 1 and "ranks 0 and 1" in same[0] and "shard=" in same[0]
        assert not any("same per-example" in m for m in rank["own_data"]["ok"]["said"])
