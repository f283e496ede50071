"""Dropout under torchrun (DDP, gloo, two CPU processes): every rank draws its own masks (rank 0
the single process's stream), and a resumed run continues each rank's stream."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrun import torchrun, torchrun_fit

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.rundir import RunDir, checkpoint_step

# dropout 0.1 and emb_dropout 0.1 (the model's defaults) draw from the global RNG every step
ARGS = ["model.name=vit_small", "model.overrides.patch_size=4", "model.overrides.depth=1",
        "model.overrides.dim=8", "model.overrides.heads=1", "model.overrides.dim_head=8",
        "model.overrides.mlp_dim=8", "data.name=digits", "device=cpu", "train.batch_size=32",
        "train.epochs=1", "track.num_examples=32", "track.eval_examples=64", "track.sigma=0",
        "seed=5"]

# each rank writes the global RNG state and the mask of the first training-mode dropout call
FIRST_MASK_WORKER = """
import os, sys, torch
from torch import nn
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
seen = {}
def hook(module, args, out):
    if isinstance(module, nn.Dropout) and module.training and module.p > 0 and not seen:
        seen["state"], seen["mask"] = hook.state, out == 0
def pre(module, args):
    hook.state = torch.get_rng_state()
h1 = nn.modules.module.register_module_forward_pre_hook(pre)
h2 = nn.modules.module.register_module_forward_hook(hook)
fit(apply_overrides(RunConfig(name="ddp"), sys.argv[2:]), sys.argv[1], progress=False)
torch.save(seen, os.path.join(sys.argv[1], f"first-mask-{os.environ['RANK']}.pt"))
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def first_mask_one_process(args: list[str], out: Path) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    state: list[torch.Tensor] = []

    def pre(module: nn.Module, inputs: object) -> None:
        state[:] = [torch.get_rng_state()]

    def hook(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
        if isinstance(module, nn.Dropout) and module.training and module.p > 0 and not seen:
            seen["state"], seen["mask"] = state[0], output == 0

    handles = [nn.modules.module.register_module_forward_pre_hook(pre),
               nn.modules.module.register_module_forward_hook(hook)]
    try:
        torch.set_num_threads(1)  # restored after the test (conftest)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            fit(apply_overrides(RunConfig(name="ddp"), list(args)), out, progress=False)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.heavy
def test_each_rank_draws_its_own_dropout_masks(tmp_path: Path) -> None:
    """Every rank's global RNG was seeded alike: the two halves of a batch got the same dropout
    masks (ViT on 2 ranks: the first masks identical), where one process draws independent
    masks for every example. Rank 1 now has its own stream, rank 0 keeps the single process's,
    and the checkpoint keeps both."""
    args = [*ARGS, "train.max_steps=2"]
    torchrun(FIRST_MASK_WORKER, tmp_path, 2, str(tmp_path / "ddp"), *args)
    r0 = torch.load(tmp_path / "ddp" / "first-mask-0.pt")
    r1 = torch.load(tmp_path / "ddp" / "first-mask-1.pt")
    assert r0["mask"].shape == r1["mask"].shape and r0["mask"].any()
    assert not torch.equal(r0["mask"], r1["mask"])
    assert not torch.equal(r0["state"], r1["state"])
    single = first_mask_one_process(args, tmp_path / "single")
    assert torch.equal(r0["state"], single["state"])  # rank 0: the single process's stream
    state = RunDir.load_checkpoint(RunDir(tmp_path / "ddp").checkpoints()[-1])
    rngs = state["torch_rngs"]
    assert len(rngs) == 2 and not torch.equal(rngs[0], rngs[1])
    assert torch.equal(rngs[0], state["torch_rng"])


@pytest.mark.heavy
def test_a_resumed_two_rank_run_continues_each_ranks_dropout_stream(tmp_path: Path) -> None:
    """Checkpoints kept rank 0's global RNG only, and a resume gave it to every rank. A 2-rank
    run stopped after its checkpoint at step 2 and resumed now ends on the weights of the run
    that was never stopped, bit for bit."""
    args = [*ARGS, "train.max_steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=0"]
    ref = tmp_path / "ref"
    torchrun_fit(tmp_path, ref, args)
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    (run / "summary.json").unlink()
    for p in RunDir(run).checkpoints():
        if checkpoint_step(p) > 2:
            p.unlink()
    assert [checkpoint_step(p) for p in RunDir(run).checkpoints()] == [2]
    torchrun_fit(tmp_path, run, args)
    a = RunDir.load_checkpoint(RunDir(ref).checkpoints()[-1])
    b = RunDir.load_checkpoint(RunDir(run).checkpoints()[-1])
    assert checkpoint_step(RunDir(run).checkpoints()[-1]) == 4
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
