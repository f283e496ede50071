"""The per-position profile over one patch grid, and the reuse path named where it is at fault.

1. ``per_position[k]`` is patch k counted row-major over the image's grid. A metric fed 28×28
   images (a 4×4 grid of 7×7 patches) and then 35×35 ones (5×5) had added the two profiles
   up silently: position 4 is the second row's first patch on one grid and the first row's
   last patch on the other. So had 28×28 and 14×56 images (16 tokens each, 4×4 and 2×8). A
   later batch, a merge and an all_reduce over another grid are now refused. Text and
   sequence positions mean the same at every length: batches of other widths (and the
   padding-aware batching's cut per chunk) still add up, position by position.
2. A zoo model whose reuse path (``forward_local``, ``forward_suffix``) is wrong failed the
   zero-noise check with an error that blamed the model: "its forward is random", "an
   example's output depends on the other examples in its batch", with the reuse path named
   last ("Or the model's local_cache/forward_local disagrees…"). The copies are now evaluated
   again by full forwards, and where those pass, the error names the reuse path and the
   tokens that turn it off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrun import torchrun

from senslab.measure import TokenSensitivity
from senslab.models import create_model
from senslab.models.text import LSTMClassifier
from senslab.models.vision import CNN
from senslab.tokens import Embedding, Patches, Sequence

# a few tests measure models that rarely flip at these σ: what they check is not the estimate
pytestmark = pytest.mark.filterwarnings("ignore:the standard error rests on:RuntimeWarning")


def _images(seed: int, h: int, w: int, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _any_size() -> nn.Module:
    """A small convolutional network that takes images of any size (adaptive pooling)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(32, 4)).eval()


def _metric(model: nn.Module, **kw) -> TokenSensitivity:
    return TokenSensitivity(model, Patches(7), **{"sigma": 1.0, "generator": 0,
                                                  "precision": "float32", **kw})


# ------------------------------------------------------------------ 1. one grid per profile

@pytest.mark.parametrize("later, grid, tokens", [((35, 35), "5×5", 25), ((14, 56), "2×8", 16)])
def test_a_batch_on_another_grid_is_refused_naming_both_grids_and_the_fix(later, grid, tokens):
    model = _any_size()
    m = _metric(model)
    m.update(_images(1, 28, 28))
    before = m.compute()
    with pytest.raises(ValueError) as err:
        m.update(_images(2, *later))
    text = str(err.value)
    assert "4×4 grid of 7×7 patches (28×28 images, 16 tokens)" in text
    assert f"{grid} grid of 7×7 patches ({later[0]}×{later[1]} images, {tokens} tokens)" in text
    assert "metric of its own" in text and "resize the images to 28×28" in text
    after = m.compute()  # the refused batch added nothing
    assert after.num_examples == before.num_examples == 2
    assert torch.equal(after.position_counts, before.position_counts)
    m.update(_images(3, 28, 28))  # the metric's own grid is still measured
    assert m.compute().num_examples == 4
    assert len(m.compute().per_position) == 16


def test_each_image_size_measures_in_a_metric_of_its_own_and_whole_input_noise_takes_any():
    model = _any_size()
    small, large = _metric(model), _metric(model)
    small.update(_images(1, 28, 28))
    large.update(_images(2, 35, 35))
    assert len(small.compute().per_position) == 16
    assert len(large.compute().per_position) == 25
    whole = _metric(model, mode="whole")  # no profile: any size adds to the estimate
    whole.update(_images(1, 28, 28))
    whole.update(_images(2, 35, 35))
    r = whole.compute()
    assert r.num_examples == 4 and len(r.per_position) == 0


def test_reset_forgets_the_grid():
    m = _metric(_any_size())
    m.update(_images(1, 28, 28))
    m.reset()
    m.update(_images(2, 35, 35))
    assert len(m.compute().per_position) == 25


def test_merging_profiles_of_two_grids_is_refused_and_an_empty_metric_takes_the_grid():
    model = _any_size()
    a, b = _metric(model), _metric(model, generator=1)
    a.update(_images(1, 28, 28))
    b.update(_images(2, 35, 35))
    with pytest.raises(ValueError, match=r"cannot merge: .*4×4 grid.*the other metric's is "
                                         r"over a 5×5 grid"):
        a.merge(b)
    assert a.compute().num_examples == 2  # nothing merged
    empty = _metric(model, generator=2)
    empty.merge(a)  # takes a's grid with its profile
    with pytest.raises(ValueError, match=r"4×4 grid.*this batch is over a 5×5 grid"):
        empty.update(_images(3, 35, 35))
    assert empty.compute().num_examples == 2


def test_a_zoo_model_measures_several_batches_of_its_own_size_into_one_profile():
    model = create_model("cnn", image_size=28, in_channels=3, channels=(4, 8), hidden=16).eval()
    m = TokenSensitivity(model, Patches(7), sigma=1.0, generator=0, precision="float32")
    m.update(_images(1, 28, 28))
    m.update(_images(2, 28, 28, n=3))
    r = m.compute()
    assert r.num_examples == 5
    assert torch.equal(r.position_counts, torch.full((16,), 5.0, dtype=torch.float64))


_RANKS = r'''
import json, os, sys
import torch, torch.distributed as dist
from torch import nn
from senslab.measure import TokenSensitivity
from senslab.tokens import Patches

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                      nn.Flatten(), nn.Linear(32, 4)).eval()
side = 28 if rank == 0 else 35
m = TokenSensitivity(model, Patches(7), sigma=1.0, generator=rank, precision="float32")
m.update(torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(rank)))
try:
    m.all_reduce()
    said = None
except ValueError as err:
    said = str(err)
with open(sys.argv[1] + f".{rank}", "w") as f:
    json.dump({"error": said, "n": m.compute().num_examples}, f)
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


@pytest.mark.heavy
def test_all_reduce_refuses_ranks_whose_profiles_are_over_other_grids(tmp_path: Path):
    """Two gloo processes, one on 28×28 images and one on 35×35: every rank refuses alike,
    naming both grids, and keeps its own state."""
    out = tmp_path / "said"
    torchrun(_RANKS, tmp_path, 2, str(out), timeout=240)
    for rank in (0, 1):
        got = json.loads(Path(f"{out}.{rank}").read_text())
        assert got["n"] == 2
        assert got["error"] is not None and "cannot all_reduce" in got["error"]
        assert "4×4 grid of 7×7 patches (28×28 images" in got["error"]
        assert "5×5 grid of 7×7 patches (35×35 images" in got["error"]


class _ReadsOneToken(nn.Module):
    """One logit: the first entry of one token's vector — the first token of a sequence, or,
    with ``last``, an embedded sequence's last real token (by its attention mask). Its flips
    come from that token alone, so the profile must show them at its position only."""

    output_kind = "logits"

    def __init__(self, last: bool) -> None:
        super().__init__()
        self.last = last
        self.embed = nn.Embedding(12, 4)
        with torch.no_grad():  # small token vectors: σ = 3 flips the sign about half the time
            self.embed.weight.copy_(0.1 * torch.randn(12, 4,
                                                      generator=torch.Generator().manual_seed(5)))

    def forward(self, x: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                input_ids: torch.Tensor | None = None):
        if not self.last:
            return x[:, 0, 0]
        e = self.embed(input_ids)
        at = attention_mask.long().sum(1) - 1
        return e[torch.arange(len(e)), at, 0]


def _padded(lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    width = max(lengths)
    ids = torch.randint(1, 12, (len(lengths), width), generator=torch.Generator().manual_seed(seed))
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return {"input_ids": ids.masked_fill(~mask, 0), "attention_mask": mask.long()}


def test_text_batches_of_other_widths_line_up_at_their_last_real_token():
    """Right-aligned embedding positions across two batches of widths 5 and 8, each cut per
    chunk to its copies' lengths (trim_padding): position −1 is every example's last real
    token, the only one the model reads, so it alone flips."""
    model = _ReadsOneToken(last=True).eval()
    m = TokenSensitivity(model, Embedding("embed"), sigma=3.0, repeats=4, generator=0,
                         precision="float32", chunk_size=3)
    lengths = [[3, 5], [8, 2, 4]]
    for seed, ls in enumerate(lengths):
        m.update(_padded(ls, seed))
    r = m.compute()
    assert r.positions.tolist() == list(range(-8, 0))
    every = [k for ls in lengths for k in ls]
    want = [4.0 * sum(k >= d for k in every) for d in range(8, 0, -1)]
    assert r.position_counts.tolist() == want
    assert float(r.per_position[-1]) > 0.2
    assert torch.equal(r.per_position[:-1], torch.zeros(7, dtype=torch.float64))


def test_sequence_batches_of_other_lengths_line_up_at_their_first_token():
    model = _ReadsOneToken(last=False).eval()
    m = TokenSensitivity(model, Sequence(), sigma=3.0, repeats=4, generator=0,
                         precision="float32")
    g = torch.Generator().manual_seed(7)
    m.update(0.1 * torch.randn(2, 3, 4, generator=g))
    m.update(0.1 * torch.randn(3, 6, 4, generator=g))
    r = m.compute()
    assert r.position_counts.tolist() == [20.0] * 3 + [12.0] * 3
    assert float(r.per_position[0]) > 0.2
    assert torch.equal(r.per_position[1:], torch.zeros(5, dtype=torch.float64))


# ------------------------------------------------------- 2. the reuse path named as the cause

def _cnn(cls: type[CNN]) -> CNN:
    base = create_model("cnn", channels=(4, 8), hidden=16)
    model = cls(base.config)
    model.load_state_dict(base.state_dict())
    return model.eval()


class _ShiftedLocal(CNN):
    """forward_local off by a constant: a copy through it is never its full forward."""

    def forward_local(self, *args):
        return super().forward_local(*args) + 0.5


class _RandomLocal(CNN):
    """forward_local that adds seeded noise of its own at every call."""

    def forward_local(self, *args):
        out = super().forward_local(*args)
        if not hasattr(self, "gen"):
            self.gen = torch.Generator().manual_seed(11)
        return out + 0.5 * torch.randn(out.shape, generator=self.gen)


class _ChunkScaledLocal(CNN):
    """forward_local whose logits grow with the number of copies in its call: right for one
    copy alone, wrong in a chunk."""

    def forward_local(self, cache, rows, *args):
        return super().forward_local(cache, rows, *args) * (1 + 0.2 * (len(rows) - 1))


class _CountingForward(CNN):
    """A forward that keeps a call counter (its own fault); forward_local is the zoo's."""

    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        return super().forward(x) + 0.1 * self.calls


_X = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("cls, what", [
    (_ShiftedLocal, "another output than its clean forward"),
    (_RandomLocal, "another output at each of two evaluations"),
    (_ChunkScaledLocal, "evaluated together than in two halves"),
])
def test_a_wrong_local_reuse_path_is_named_first_with_the_switch_that_turns_it_off(cls, what):
    model = _cnn(cls)
    with pytest.raises(RuntimeError) as err:
        TokenSensitivity(model, Patches(4), sigma=0.5, generator=0,
                         precision="float32").update(_X)
    text = str(err.value)
    assert text.startswith(f"evaluated through {cls.__name__}'s local_cache/forward_local "
                           "(local reuse")
    assert what in text
    assert "the reuse path is at fault, not the model's forward" in text
    assert "pass Patches(4, reuse_local=False) as the tokens" in text
    assert "depends on the other examples" not in text and "is random" not in text
    # the advice works: full forwards measure the same model
    m = TokenSensitivity(model, Patches(4, reuse_local=False), sigma=0.5, generator=0,
                         precision="float32")
    m.update(_X)
    assert m.compute().num_examples == 3


def test_a_wrong_prefix_reuse_path_is_named_with_the_embedding_switch():
    class ShiftedSuffix(LSTMClassifier):
        def forward_suffix(self, *args):
            return super().forward_suffix(*args) + 0.5

    base = create_model("lstm", vocab_size=12, dim=8, layers=1, max_len=16)
    model = ShiftedSuffix(base.config)
    model.load_state_dict(base.state_dict())
    model.eval()
    batch = _padded([4, 6], seed=3)
    batch["input_ids"] = batch["input_ids"].clamp(min=2).masked_fill(
        batch["attention_mask"] == 0, base.config.pad_id)
    with pytest.raises(RuntimeError) as err:
        TokenSensitivity(model, Embedding("embed_ln"), sigma=0.5, generator=0,
                         precision="float32").update(batch)
    text = str(err.value)
    assert text.startswith("evaluated through ShiftedSuffix's prefix_cache/forward_suffix "
                           "(prefix reuse")
    assert "Embedding(..., reuse_prefix=False)" in text
    m = TokenSensitivity(model, Embedding("embed_ln", reuse_prefix=False), sigma=0.5,
                         generator=0, precision="float32")
    m.update(batch)
    assert m.compute().num_examples == 2


def test_a_model_whose_own_forward_is_at_fault_is_still_blamed_with_reuse_on():
    """Full forwards fail as well: the model's own cause (its state) is reported, and the
    reuse path is not blamed."""
    model = _cnn(_CountingForward)
    with pytest.raises(RuntimeError) as err:
        TokenSensitivity(model, Patches(4), sigma=0.5, generator=0,
                         precision="float32").update(_X)
    text = str(err.value)
    assert "reuse path is at fault" not in text
    assert "a call counter" in text
