"""Per-position profiles over one patch grid, across processes and in the torchmetrics wrapper.

1. ``TokenSensitivity.all_reduce`` compared each rank's grid with rank 0's only: where rank 0
   had measured no patches, a rank on 28×28 images and one on 35×35 ones were summed into one
   profile without a word. Every rank's grid is now compared with every other's, and every rank
   refuses with the same error.
2. ``TokenSensitivityMetric`` keeps a profile of its own (``pos_id``, ``pos_sum``, ``pos_cnt``
   states), which ``merge_state``, torchmetrics' sync across processes and an engine built for
   another model added up over two grids; a loaded state dict left the engine on the grid the
   metric had measured before the load, refusing the loaded states' own image size and taking
   another. The grid is now a state (``pos_grid``: synced, merged and saved with the profile),
   and each of these is refused with the engine's message.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrun import torchrun

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

# the small nets rarely flip at this σ: what is checked here is not the estimate
pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests on:RuntimeWarning")

GRID_28 = "4×4 grid of 7×7 patches (28×28 images, 16 tokens)"
GRID_35 = "5×5 grid of 7×7 patches (35×35 images, 25 tokens)"
GRID_14_56 = "2×8 grid of 7×7 patches (14×56 images, 16 tokens)"


def _images(seed: int, h: int, w: int, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _any_size(seed: int = 0) -> nn.Module:
    """A small convolutional network that takes images of any size (adaptive pooling)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(32, 4)).eval()


def _metric(generator: int = 0, **kw) -> TokenSensitivityMetric:
    return TokenSensitivityMetric(Patches(7), generator=generator,
                                  **{"sigma": 1.0, "precision": "float32", **kw})


# ------------------------------------------------------------------ (a) merge_state

@pytest.mark.parametrize("other, grid", [((35, 35), GRID_35), ((14, 56), GRID_14_56)])
def test_merging_a_metric_over_another_grid_is_refused_naming_both(other, grid):
    """14×56 images make 16 tokens too: their positions lined up with 28×28 ones, silently."""
    model = _any_size()
    a, b = _metric(0), _metric(1)
    a.update(model, _images(1, 28, 28))
    b.update(model, _images(2, *other))
    with pytest.raises(ValueError) as err:
        a.merge_state(b)
    text = str(err.value)
    assert text.startswith("cannot merge: this metric's per-position profile")
    assert GRID_28 in text and f"the other metric's is over a {grid}" in text
    assert "metric of its own" in text
    r = a.result()  # nothing was merged
    assert r.num_examples == 2 and len(r.per_position) == 16
    assert torch.equal(r.position_counts, torch.full((16,), 2.0, dtype=torch.float64))


def test_merging_a_state_dict_over_another_grid_is_refused_and_one_over_the_same_is_merged():
    model = _any_size()
    a, b, c = _metric(0), _metric(1), _metric(2)
    for m in (a, b, c):
        m.persistent(True)
    a.update(model, _images(1, 28, 28))
    b.update(model, _images(2, 35, 35))
    c.update(model, _images(3, 28, 28))
    with pytest.raises(ValueError, match=r"cannot merge: .*4×4 grid.*the state dict's is over "
                                         r"a 5×5 grid"):
        a.merge_state(b.state_dict())
    a.merge_state(c.state_dict())
    r = a.result()
    assert r.num_examples == 4
    assert torch.equal(r.position_counts, torch.full((16,), 4.0, dtype=torch.float64))


def test_a_metric_that_merged_a_grid_refuses_a_batch_of_another_size():
    model = _any_size()
    a, empty = _metric(0), _metric(1)
    a.update(model, _images(1, 28, 28))
    empty.merge_state(a)  # no grid of its own yet: takes a's with its profile
    with pytest.raises(ValueError, match=r"this metric's per-position profile .*4×4 grid.*"
                                         r"this batch is over a 5×5 grid"):
        empty.update(model, _images(2, 35, 35))
    assert empty.result().num_examples == 2  # the refused batch added nothing
    empty.update(model, _images(3, 28, 28))
    assert len(empty.result().per_position) == 16


def test_a_batch_of_another_size_for_another_model_is_refused():
    """A new model builds a new engine, which had started on no grid."""
    a = _metric(0)
    a.update(_any_size(0), _images(1, 28, 28))
    with pytest.raises(ValueError, match=r"4×4 grid.*this batch is over a 5×5 grid"):
        a.update(_any_size(1), _images(2, 35, 35))
    a.update(_any_size(1), _images(3, 28, 28))
    r = a.result()
    assert r.num_examples == 4 and len(r.per_position) == 16


# ------------------------------------------------------------------ (c) reset

def test_after_reset_another_image_size_is_measured():
    model = _any_size()
    m = _metric(0)
    m.update(model, _images(1, 28, 28))
    m.reset()
    m.update(model, _images(2, 35, 35))
    r = m.result()
    assert r.num_examples == 2 and len(r.per_position) == 25
    copied = copy.deepcopy(m)  # a copy keeps the grid with the profile
    with pytest.raises(ValueError, match=r"5×5 grid.*this batch is over a 4×4 grid"):
        copied.update(model, _images(3, 28, 28))


def test_whole_input_noise_records_no_grid_and_takes_any_size():
    model = _any_size()
    a, b = _metric(0, mode="whole"), _metric(1, mode="whole")
    a.update(model, _images(1, 28, 28))
    a.update(model, _images(2, 35, 35))
    b.update(model, _images(3, 14, 56))
    a.merge_state(b)
    assert a.pos_grid == [] and a.result().num_examples == 6


# ------------------------------------------------------------------ (d) the state dict

def test_loaded_states_bring_their_grid_and_replace_the_metrics_own():
    model = _any_size()
    src, dst = _metric(0), _metric(1)
    src.persistent(True)
    src.update(model, _images(1, 28, 28))
    dst.update(model, _images(2, 35, 35))
    saved = src.state_dict()
    assert saved["pos_grid"][0].tolist() == [4.0, 4.0, 7.0]
    dst.load_state_dict(saved)
    # the loaded profile is over 28×28 images: a 35×35 batch (dst's own size before) is refused
    with pytest.raises(ValueError, match=r"4×4 grid.*this batch is over a 5×5 grid"):
        dst.update(model, _images(3, 35, 35))
    dst.update(model, _images(4, 28, 28))  # … and the loaded size is measured
    r = dst.result()
    assert r.num_examples == 4
    assert torch.equal(r.position_counts, torch.full((16,), 4.0, dtype=torch.float64))


def test_a_state_dict_without_a_grid_still_merges_and_loads():
    """Saved by an older senslab: no ``pos_grid``. torchmetrics' merge had refused the dict
    for the missing state; the grid is unknown, so nothing is checked against it."""
    model = _any_size()
    src, into, loaded = _metric(0), _metric(1), _metric(2)
    src.persistent(True)
    src.update(model, _images(1, 28, 28))
    older = {k: v for k, v in src.state_dict().items() if k != "pos_grid"}
    into.update(model, _images(2, 28, 28))
    into.merge_state(older)
    assert into.result().num_examples == 4
    loaded.update(model, _images(3, 35, 35))
    loaded.load_state_dict(dict(older))
    assert loaded.pos_grid == []  # not the 5×5 grid it measured before the load
    assert loaded.result().num_examples == 2


def test_a_damaged_grid_in_a_state_dict_is_refused():
    model = _any_size()
    src, dst = _metric(0), _metric(1)
    src.persistent(True)
    src.update(model, _images(1, 28, 28))
    saved = src.state_dict()
    saved["pos_grid"] = [torch.tensor([4.0, 4.0], dtype=torch.float64)]
    with pytest.raises(ValueError, match=r"'pos_grid' state \(\[4.0, 4.0\]\) is not a list of "
                                         r"\(rows, columns, patch size\) grids: it is damaged"):
        dst.load_state_dict(saved)
    assert float(dst.n) == 0


# ------------------------------------------------------------------ (b), 1. several processes

_RANKS = r'''
import json, os, sys, warnings
import torch, torch.distributed as dist
from torch import nn
from senslab.integrations.torchmetrics import TokenSensitivityMetric
from senslab.measure import TokenSensitivity
from senslab.tokens import Patches

warnings.filterwarnings("ignore")
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                      nn.Flatten(), nn.Linear(32, 4)).eval()
OPTS = {"sigma": 1.0, "precision": "float32"}


def images(side):
    return torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(rank))


def attempt(fn):
    try:
        return fn(), None
    except ValueError as err:
        return None, str(err)


out = {}
# rank 0 measures nothing; ranks 1 and 2 measure 28×28 and 35×35 images (then both 28×28)
for name, sides in (("mixed", {1: 28, 2: 35}), ("same", {1: 28, 2: 28})):
    m = TokenSensitivity(model, Patches(7), generator=rank, **OPTS)
    if rank in sides:
        m.update(images(sides[rank]))
    got, said = attempt(lambda: m.all_reduce().compute())
    out[f"all_reduce {name}"] = {
        "error": said, "n": None if got is None else got.num_examples,
        "positions": None if got is None else len(got.per_position),
        "own": m.compute().num_examples if m.state.n else 0}
    metric = TokenSensitivityMetric(Patches(7), generator=0, **OPTS)
    if rank in sides:
        metric.update(model, images(sides[rank]))
    got, said = attempt(metric.result)
    out[f"sync {name}"] = {
        "error": said, "n": None if got is None else got.num_examples,
        "positions": None if got is None else len(got.per_position),
        "synced": metric._is_synced, "own": int(metric.n)}
# whole-input noise records no grid: no process has one, and any sizes sync
whole = TokenSensitivityMetric(Patches(7), generator=0, mode="whole", **OPTS)
if rank:
    whole.update(model, images({1: 28, 2: 35}[rank]))
got, said = attempt(whole.result)
out["sync whole"] = {"error": said, "n": None if got is None else got.num_examples}
with open(sys.argv[1] + f".{rank}", "w") as f:
    json.dump(out, f)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> list[dict]:
    """Three gloo processes (``torch.distributed.run``), each one's results as JSON."""
    tmp = tmp_path_factory.mktemp("ranks")
    out = tmp / "got"
    torchrun(_RANKS, tmp, 3, str(out))
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(3)]


@pytest.mark.heavy
def test_all_reduce_refuses_two_other_ranks_on_two_grids_where_rank_0_has_none(three_ranks):
    said = {got["all_reduce mixed"]["error"] for got in three_ranks}
    assert len(said) == 1  # the same error on every rank
    text = said.pop()
    assert text is not None and text.startswith("cannot all_reduce: rank 1's per-position")
    assert GRID_28 in text and f"rank 2's is over a {GRID_35}" in text
    assert [got["all_reduce mixed"]["own"] for got in three_ranks] == [0, 2, 2]  # kept


@pytest.mark.heavy
def test_all_reduce_of_ranks_on_one_grid_and_a_rank_with_none_adds_up(three_ranks):
    for got in three_ranks:
        assert got["all_reduce same"] == {"error": None, "n": 4, "positions": 16, "own": 4}


@pytest.mark.heavy
def test_torchmetrics_sync_of_processes_on_two_grids_is_refused_on_every_process(three_ranks):
    said = {got["sync mixed"]["error"] for got in three_ranks}
    assert len(said) == 1
    text = said.pop()
    assert text is not None
    assert text.startswith("cannot sync the metric's states across processes: rank 1's")
    assert GRID_28 in text and f"rank 2's is over a {GRID_35}" in text
    for rank, got in enumerate(three_ranks):  # left unsynced, each with its own states
        assert got["sync mixed"]["synced"] is False
        assert got["sync mixed"]["own"] == (0 if rank == 0 else 2)


@pytest.mark.heavy
def test_torchmetrics_sync_of_processes_on_one_grid_adds_up(three_ranks):
    for got in three_ranks:
        assert got["sync same"]["error"] is None
        assert got["sync same"]["n"] == 4 and got["sync same"]["positions"] == 16


@pytest.mark.heavy
def test_torchmetrics_sync_of_whole_input_noise_takes_any_sizes(three_ranks):
    for got in three_ranks:
        assert got["sync whole"] == {"error": None, "n": 4}


def test_a_compute_stopped_part_way_leaves_the_metric_unsynced():
    """torchmetrics restored a process's own states after ``compute`` only where it returned: a
    Ctrl-C (or any error) inside it left the metric synced, and the next ``compute`` failed with
    "already been synced". Here in a real process group of one (gloo)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        metric = _metric()
        metric.update(_any_size(), _images(1, 28, 28))
        own = {k: [t.clone() for t in v] if isinstance(v, list) else v.clone()
               for k, v in metric.metric_state.items()}
        value = float(metric.compute())
        metric._computed = None  # compute again (torchmetrics caches the value)

        def interrupted() -> None:
            raise KeyboardInterrupt

        metric._result = interrupted  # a Ctrl-C half-way through compute
        with pytest.raises(KeyboardInterrupt):
            metric.compute()
        del metric._result
        assert not metric._is_synced
        for k, v in metric.metric_state.items():  # this process's own, not the gathered
            torch.testing.assert_close(v, own[k], rtol=0, atol=0, equal_nan=True, msg=k)
        assert float(metric.compute()) == value
    finally:
        dist.destroy_process_group()
