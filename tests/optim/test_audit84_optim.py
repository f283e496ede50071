"""Audit 84 (optim): torch's LR schedulers on SPS / Polyak (a raw ``KeyError: 'lr'`` before: the
step now has an ``lr`` factor, 1 by default, that the schedule scales), and parameters sharded
across ranks (FSDP flat parameters, DTensors: each rank normalised by its own shard's norm, or a
raw torch error) refused with the fix."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from senslab.optim import NGD, SPS, Polyak


def _quadratic(seed: int = 0):
    torch.manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))
    target = torch.randn(6, dtype=torch.float64)

    def make_closure(opt):
        def closure():
            opt.zero_grad()
            loss = ((w - target) ** 2).sum()
            loss.backward()
            return loss
        return closure
    return w, make_closure


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)`")
@pytest.mark.parametrize("cls", [SPS, Polyak])
@pytest.mark.parametrize("make_sched", [
    lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
    lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.5 ** e),
    lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.5),
], ids=["StepLR", "LambdaLR", "ExponentialLR"])
def test_lr_schedulers_scale_the_polyak_step(cls, make_sched):
    """Before: KeyError: 'lr' at the scheduler's construction. Now each step is lr·η_t, lr
    following the schedule (1, 1/2, 1/4), on the same parameters and gradient as a run without."""
    w, make_closure = _quadratic()
    start = w.detach().clone()
    plain = cls([w])
    plain.step(make_closure(plain))
    reference = plain.last_step_size
    moved_plain = w.detach().clone()

    for k, factor in enumerate([1.0, 0.5, 0.25]):
        w.data.copy_(start)
        opt = cls([w])
        sched = make_sched(opt)
        for _ in range(k):
            sched.step()
        assert opt.param_groups[0]["lr"] == factor
        opt.step(make_closure(opt))
        assert opt.last_step_size == reference * factor
        if factor == 1.0:  # the default keeps today's step bit for bit
            assert torch.equal(w, moved_plain)
        assert torch.allclose(start - w, factor * (start - moved_plain), rtol=1e-12, atol=0)


def test_sps_lr_multiplies_the_capped_step_and_cosine_and_onecycle_run():
    w, make_closure = _quadratic(1)
    opt = SPS([w], c=0.5, eta_max=1e-3)  # capped: the Polyak quotient is far above 1e-3
    opt.step(make_closure(opt))
    assert opt.last_step_size == 1e-3
    opt.param_groups[0]["lr"] = 0.5
    opt.step(make_closure(opt))
    assert opt.last_step_size == 0.5e-3

    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    sizes = []
    for _ in range(4):
        opt.step(make_closure(opt))
        sizes.append(opt.last_step_size)
        sched.step()
    assert sizes[0] == pytest.approx(0.5e-3) and sizes[1] < sizes[0] and sizes[3] < sizes[2]
    opt.step(make_closure(opt))  # the schedule ends at lr = 0: no step
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-18)

    one = SPS([w], eta_max=1e-3)
    cyc = torch.optim.lr_scheduler.OneCycleLR(one, max_lr=1.0, total_steps=5,
                                              cycle_momentum=False)
    for _ in range(5):
        one.step(make_closure(one))
        cyc.step()
    assert torch.isfinite(w).all()


def test_sps_lr_is_checked_and_kept_by_state_dict_and_old_checkpoints_read_as_lr_1():
    w, make_closure = _quadratic(2)
    with pytest.raises(ValueError, match="lr must be a positive number"):
        SPS([w], lr=-1.0)
    with pytest.raises(ValueError, match="lr must be a positive number"):
        SPS([w], lr=float("nan"))
    opt = SPS([w], lr=0.25)
    opt.param_groups[0]["lr"] = -0.1  # e.g. a hand-edited schedule
    with pytest.raises(ValueError, match="param group 0: lr must be a positive number"):
        opt.step(make_closure(opt))
    opt.param_groups[0]["lr"] = 0.25
    opt.step(make_closure(opt))

    saved = copy.deepcopy(opt.state_dict())
    other = SPS([torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))], lr=1.0)
    other.load_state_dict(saved)
    assert other.param_groups[0]["lr"] == 0.25

    old = copy.deepcopy(saved)  # a checkpoint from before SPS had lr
    del old["param_groups"][0]["lr"]
    resumed = SPS([torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))], lr=0.5)
    resumed.load_state_dict(old)
    assert resumed.param_groups[0]["lr"] == 1.0

    with pytest.raises(ValueError, match="momentum"):  # other options are still refused
        SPS([{"params": [w], "momentum": 0.9}])


def test_ngd_schedulers_still_scale_the_step_length():
    torch.manual_seed(3)
    w = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    opt = NGD([w], lr=0.2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for lr in (0.2, 0.1):
        before = w.detach().clone()
        w.grad = torch.randn(5, dtype=torch.float64)
        opt.step()
        assert torch.linalg.vector_norm(w - before).item() == pytest.approx(lr, rel=1e-12)
        sched.step()


@pytest.fixture
def gloo_world_of_one(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already running")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("cls", [NGD, SPS])
def test_fsdp_flat_parameters_are_refused(gloo_world_of_one, cls, use_orig_params):
    """On two ranks FSDP's shards gave each rank its own shard's norm (0.43 and 1.62 for a
    global 1.68: different steps on each rank, without a word). Now refused, naming DDP."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = FSDP(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)),
                 use_orig_params=use_orig_params, device_id=torch.device("cpu"))
    kwargs = {"lr": 0.1} if cls is NGD else {}
    with pytest.raises(ValueError, match="FSDP flat parameter.*DistributedDataParallel"):
        cls(model.parameters(), **kwargs)


def test_dtensor_parameters_are_refused(gloo_world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    w = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh, [Shard(0)]))
    plain = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="DTensor.*DistributedDataParallel"):
        NGD([w], lr=0.1)
    opt = Polyak([plain])
    with pytest.raises(ValueError, match="DTensor"):
        opt.add_param_group({"params": [w]})
    assert len(opt.param_groups) == 1  # the refused group is not kept


def test_sps_under_several_ranks_says_the_loss_must_be_averaged():
    """On 2 gloo ranks under DistributedDataParallel, each rank's own minibatch loss gave each
    its own η_t: the replicas were 0.89 apart after 3 steps, without a word. Now a loss returned
    with its graph is said once; a detached (all-reduced) one is not."""
    dist = pytest.importorskip("torch.distributed")
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already running")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    try:
        w, make_closure = _quadratic(4)
        opt = SPS([w], eta_max=1.0)
        with pytest.warns(RuntimeWarning, match="2 ranks.*averaged over the ranks"):
            opt.step(make_closure(opt))
        opt.step(make_closure(opt))  # said once

        quiet = SPS([w], eta_max=1.0)
        inner = make_closure(quiet)

        def averaged():
            return inner().detach()  # as after dist.all_reduce of a detached copy
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            quiet.step(averaged)
    finally:
        dist.destroy_process_group()
