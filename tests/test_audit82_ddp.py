"""Under torchrun: a paired comparison all-reduced whole (every model's state and every paired
difference's), and a training run resumed on another number of ranks drawing each rank's own
regularizer noise."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrun import torchrun

from senslab.measure import CompareSensitivity
from senslab.tokens import Patches


def models() -> tuple[dict[str, nn.Module], torch.Tensor]:
    """Two models that differ a little, and 12 examples (the same here as in the ranks)."""
    torch.manual_seed(0)
    a = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
    b = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))
    with torch.no_grad():
        b[1].weight.mul_(1.3)
    x = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    return {"a": a, "b": b}, x


COMPARE = r'''
import json, os, sys
import torch, torch.distributed as dist
from torch import nn
from senslab.measure import CompareSensitivity
from senslab.tokens import Patches
''' + inspect.getsource(models) + r'''
def said(r):
    d = r.difference("a", "b")
    return {"est": d.estimate, "se": d.stderr, "se_subset": d.stderr_subset,
            "d": sorted(d.per_sample.tolist()), "n": [r.results[k].num_examples for k in "ab"],
            "sa": r.results["a"].estimate, "sb": r.results["b"].estimate}

dist.init_process_group("gloo")
rank = dist.get_rank()
ms, x = models()
mine = x[6 * rank: 6 * rank + 6]  # each rank its own batches, with its own seed
cmp = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=7 + rank)
cmp.update(mine[:3])
interim = said(cmp.all_reduce().compute())
twice = said(cmp.all_reduce().compute())  # the ranks' own states again, not the totals
cmp.update(mine[3:])  # adds to this rank's own states
final = said(cmp.all_reduce().compute())
again = said(cmp.all_reduce().compute())
out = {"interim": interim, "twice": twice, "final": final, "again": again}
# each model's metric all-reduced alone: the paired states stay this rank's, refused
by_hand = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=7 + rank)
by_hand.update(mine)
for m in by_hand.metrics.values():
    m.all_reduce()
try:
    by_hand.compute()
except ValueError as err:
    out["by_hand"] = str(err)
out["by_hand_then_whole"] = said(by_hand.all_reduce().compute())
# the models named in another order on rank 1: refused on every rank, nothing summed
order = dict(ms) if rank == 0 else {"b": ms["b"], "a": ms["a"]}
other = CompareSensitivity(order, Patches(2), sigma=1.0, repeats=3, generator=7 + rank)
other.update(mine[:2])
try:
    other.all_reduce()
except ValueError as err:
    out["order"] = str(err)
out["order_n"] = other.metrics["a"].state.n
# an update refused by the second model once the first had measured the batch: the first
# had swapped its total for its own state, and kept it
def picky(z):
    if picky.refuse:
        raise ValueError("refused")
    return ms["b"](z)
picky.refuse = False
failed = CompareSensitivity({"a": ms["a"], "b": picky}, Patches(2), sigma=1.0, repeats=3,
                            generator=7 + rank)
failed.update(mine[:3])
failed.all_reduce()
picky.refuse = True
try:
    failed.update(mine[3:])
except ValueError as err:
    out["failed"] = str(err)
out["failed_n"] = said(failed.compute())["n"]
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # past the interpreter's teardown, where gloo now and then aborts a rank
'''


def one_process(cuts: list[int]) -> dict:
    """Both ranks' comparisons (each its seed, its batches cut at ``cuts``) merged: one process
    that measured every rank's batches."""
    ms, x = models()
    parts = []
    for rank in range(2):
        mine = x[6 * rank: 6 * rank + 6]
        c = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=7 + rank)
        for lo, hi in zip([0, *cuts], [*cuts, 6], strict=True):
            c.update(mine[lo:hi])
        parts.append(c)
    r = parts[0].merge(parts[1]).compute()
    d = r.difference("a", "b")
    return {"est": d.estimate, "se": d.stderr, "se_subset": d.stderr_subset,
            "d": sorted(d.per_sample.tolist()), "n": [r.results[k].num_examples for k in "ab"],
            "sa": r.results["a"].estimate, "sb": r.results["b"].estimate}


def same(got: dict, ref: dict) -> None:
    assert got["n"] == ref["n"]
    for key in ("est", "se", "se_subset", "sa", "sb"):
        assert got[key] == pytest.approx(ref[key], abs=1e-12), key
    assert got["d"] == pytest.approx(ref["d"], abs=1e-12)


@pytest.mark.heavy  # two real processes
def test_an_all_reduced_comparison_equals_one_process(tmp_path: Path) -> None:
    """CompareSensitivity had no all_reduce: each model's metric all-reduced by hand gave the
    models' totals, but the paired states stayed one rank's (2 ranks of 6 examples: a − b
    -0.0069 ± 0.1153, the paired standard error of 6 examples, for the 12's ± 0.0675). Now
    the comparison's all_reduce sums every state, as one process measuring both ranks' batches
    does; interim reductions count nothing twice, a metric reduced alone is refused, and an
    update that one model refuses after all_reduce leaves every model's total in place."""
    out = tmp_path / "out.json"
    torchrun(COMPARE, tmp_path, 2, str(out))
    got = json.loads(out.read_text())
    final = one_process([3])
    same(got["final"], final)
    same(got["again"], final)
    assert got["final"]["n"] == [12, 12] and got["final"]["se"] > 0
    assert got["interim"] == got["twice"] and got["interim"]["n"] == [6, 6]
    assert "all_reduce() (or merge()) on the comparison" in got["by_hand"]
    same(got["by_hand_then_whole"], one_process([]))
    assert "in the same order" in got["order"] and got["order_n"] == 2
    assert got["failed"] == "model 'b': refused" and got["failed_n"] == [6, 6]


def test_all_reduce_keeps_own_states_and_merge_refuses_a_total(tmp_path: Path) -> None:
    """A one-process group: all_reduce twice changes nothing, an update after it adds to the
    process's own states (the models' and the paired ones alike), and a comparison holding a
    total is refused by merge either way round."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ms, x = models()
        cmp = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=7)
        cmp.update(x[:3])
        first = cmp.all_reduce().compute().difference("a", "b")
        second = cmp.all_reduce().compute().difference("a", "b")
        assert first.stderr == second.stderr and len(second.per_sample) == 3
        cmp.update(x[3:6])
        r = cmp.all_reduce().compute()
        assert [m.num_examples for m in r.results.values()] == [6, 6]
        assert len(r.difference("a", "b").per_sample) == 6
        ref = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=7)
        ref.update(x[:3])
        ref.update(x[3:6])
        d, e = r.difference("a", "b"), ref.compute().difference("a", "b")
        assert d.stderr == pytest.approx(e.stderr, abs=1e-12) and d.estimate == e.estimate
        fresh = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=8)
        fresh.update(x[6:8])
        with pytest.raises(ValueError, match="this comparison holds the total of an all_reduce"):
            cmp.merge(fresh)
        with pytest.raises(ValueError, match="other comparison holds the total of an all_r"):
            fresh.merge(cmp)
        assert fresh.compute().results["a"].num_examples == 2  # refused before anything added
    finally:
        dist.destroy_process_group()


def test_a_model_metric_reduced_alone_is_refused_by_compute() -> None:
    """Without a process group: a model's metric merged alone leaves the paired states behind;
    compute refuses instead of pairing one set of examples' errors with another's estimates."""
    ms, x = models()
    one = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=7)
    two = CompareSensitivity(ms, Patches(2), sigma=1.0, repeats=3, generator=8)
    one.update(x[:3])
    two.update(x[3:6])
    for name in one.metrics:
        one.metrics[name].merge(two.metrics[name])
    with pytest.raises(ValueError, match=r"'a': 6, 'b': 6\) than the paired differences \(3\)"):
        one.compute()


# -- a training run resumed on another number of ranks ------------------------------------------

ARGS = ["model.name=mlp", "data.name=digits", "model.overrides.widths=[16]",
        "model.overrides.sens_patch=2", "train.regularizer=patch_mse", "train.batch_size=16",
        "train.epochs=1", "track.num_examples=16", "track.eval_examples=32", "track.sigma=0",
        "device=cpu", "train.checkpoint_every=2", "train.keep_checkpoints=0", "seed=3",
        "train.max_steps=4"]

# fit on every rank, each rank's warnings written beside the run directory
FIT_SAYING = """
import json, os, sys, warnings
from pathlib import Path
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fit(apply_overrides(RunConfig(name="ddp"), sys.argv[2:]), sys.argv[1], progress=False)
said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)
        and "ranks now running" in str(w.message)]
out = Path(sys.argv[1]).parent / f"said-{os.environ['RANK']}.json"
out.write_text(json.dumps(said))
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


@pytest.mark.heavy  # two real processes
def test_a_resume_on_more_ranks_gives_each_rank_its_own_regularizer_noise(
        tmp_path: Path) -> None:
    """A checkpoint written by one process holds one regularizer stream (``reg_rng``); resumed on
    2 ranks, every rank was given it, so both drew the same patches and noise from then on (their
    streams still equal at the next checkpoint) and nothing was said. Now rank 0 takes it, rank 1
    keeps its own fresh stream, and rank 0 warns that the resume is not the uninterrupted run's."""
    from senslab.train.config import RunConfig, apply_overrides
    from senslab.train.loop import fit
    from senslab.train.rundir import RunDir, checkpoint_step

    one = tmp_path / "one"
    torch.set_num_threads(1)  # restored after the test (conftest)
    fit(apply_overrides(RunConfig(name="ddp"), ARGS), one, progress=False)
    run = tmp_path / "run"  # stopped after its checkpoint at step 2
    shutil.copytree(one, run)
    (run / "summary.json").unlink()
    for p in RunDir(run).checkpoints():
        if checkpoint_step(p) > 2:
            p.unlink()
    assert "reg_rngs" not in RunDir.load_checkpoint(RunDir(run).checkpoints()[-1])
    torchrun(FIT_SAYING, tmp_path, 2, str(run), *ARGS)
    last = RunDir(run).checkpoints()[-1]
    assert checkpoint_step(last) == 4
    regs = RunDir.load_checkpoint(last)["reg_rngs"]
    assert len(regs) == 2 and not torch.equal(regs[0], regs[1])
    said = [json.loads((tmp_path / f"said-{r}.json").read_text()) for r in range(2)]
    assert said[1] == []  # rank 0 says it, once
    resumed = [w for w in said[0] if "regularizer" in w]
    assert len(resumed) == 1 and "not the uninterrupted run's" in resumed[0]


def test_a_resume_on_more_ranks_keeps_the_fresh_streams_of_ranks_above_0() -> None:
    """The resume's streams, rank by rank, from a checkpoint of one process (no ``reg_rngs``,
    no ``torch_rngs``): rank 0 takes the checkpoint's and warns once, naming both; rank 1
    keeps the regularizer stream seeded for it (it had been given rank 0's) and says nothing."""
    import warnings

    from senslab.train.loop import _restore_rngs

    saved = torch.get_rng_state()
    try:
        state = {"torch_rng": torch.Generator().manual_seed(1).get_state(),
                 "reg_rng": torch.Generator().manual_seed(2).get_state()}
        for rank in (0, 1):
            own = torch.Generator().manual_seed(100 + rank)
            fresh = own.get_state()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _restore_rngs(state, own, rank, 2)
            said = [str(w.message) for w in caught]
            if rank == 0:
                assert torch.equal(own.get_state(), state["reg_rng"])
                assert len(said) == 1 and "1 regularizer noise stream(s)" in said[0]
                assert "dropout and regularizer noise draws are not the uninterrupted" in said[0]
            else:
                assert torch.equal(own.get_state(), fresh) and said == []
    finally:
        torch.set_rng_state(saved)


def test_one_process_resuming_a_checkpoint_of_two_ranks_says_so() -> None:
    """A checkpoint written by 2 ranks (``torch_rngs``/``reg_rngs`` of 2) resumed in one process
    continues on rank 0's streams — rank 1's rows then draw other masks and noise — with a
    warning naming the ranks that wrote it; a one-process checkpoint resumes without a word."""
    import warnings

    from senslab.train.loop import _restore_rngs

    saved = torch.get_rng_state()
    try:
        streams = [torch.Generator().manual_seed(s).get_state() for s in (1, 2, 3, 4)]
        state = {"torch_rng": streams[0], "reg_rng": streams[2],
                 "torch_rngs": streams[:2], "reg_rngs": streams[2:]}
        for kept, expect in ((state, 1), ({"torch_rng": streams[0], "reg_rng": streams[2]}, 0)):
            own = torch.Generator().manual_seed(100)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _restore_rngs(kept, own, 0, 1)
            said = [str(w.message) for w in caught]
            assert torch.equal(own.get_state(), streams[2])  # rank 0's stream, as before
            assert len(said) == expect
            if expect:
                assert "written by 2 ranks" in said[0] and "--nproc_per_node=2" in said[0]
    finally:
        torch.set_rng_state(saved)
