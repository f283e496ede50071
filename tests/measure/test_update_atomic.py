"""TokenSensitivity's state: an update that raises adds nothing and changes nothing."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.tokens import Embedding, Sequence


def linear() -> nn.Module:
    torch.manual_seed(0)  # test-only: model init
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 2))


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 4, 3, generator=torch.Generator().manual_seed(seed))


def test_an_update_raising_after_its_batch_was_measured_adds_nothing():
    """With warnings raised as errors (a test suite's ``filterwarnings = error``), the 10th
    update with target_stderr raises the stopping-bias warning after measuring its batch: that
    batch must not be in the state (the caller saw the update fail, and a retry would count it
    twice); the state is the nine batches before it, exactly."""
    x = tokens(20)
    options = dict(sigma=1.0, generator=0, precision="float32", target_stderr=0.5)
    m = TokenSensitivity(linear(), Sequence(), **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(9):
            m.update(x[2 * i: 2 * i + 2])
        with pytest.raises(UserWarning, match="target_stderr stops each update"):
            m.update(x[18:])
    ref = TokenSensitivity(linear(), Sequence(), **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(9):
            ref.update(x[2 * i: 2 * i + 2])
        got, want = m.compute(), ref.compute()
    assert got.num_examples == 18 and len(got.per_sample) == 18
    assert got.estimate == want.estimate and got.num_forward == want.num_forward
    assert torch.equal(got.per_sample, want.per_sample)
    assert torch.equal(got.position_counts, want.position_counts)


class ReadsItsPaddingAndItsBatch(nn.Module):
    """Sums every position's vector (the padding's too: cutting it changes the output) and
    subtracts the batch mean (a copy's output depends on its batch: refused)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: model init
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.head(self.embedding(input_ids).sum(1))
        return out - out.mean(0)


def test_a_refused_update_does_not_count_an_untrimmed_batch():
    """``untrimmed_batches`` counts batches measured at full width; a batch refused after the
    padding check (here: outputs that depend on the batch) was not measured."""
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0], [7, 0, 0, 0]])
    m = TokenSensitivity(ReadsItsPaddingAndItsBatch(), Embedding("embedding"), sigma=1.0,
                         generator=0, precision="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning that the model reads its padding
        with pytest.raises(RuntimeError, match="depends on the other examples"):
            m.update({"input_ids": ids, "attention_mask": ids != 0})
    assert m.untrimmed_batches == 0
    with pytest.raises(RuntimeError, match="no examples measured yet"):
        m.compute()


@pytest.mark.filterwarnings("ignore:the standard error rests")
def test_a_refused_update_after_all_reduce_keeps_the_total(tmp_path: Path):
    """After all_reduce the metric holds the processes' total; an update that is refused must
    leave it holding that total. It used to put this process's own state in its place, so
    compute() then read this rank's examples alone (2 ranks, 13 examples: 7, and another
    estimate), without a word. One process: the total still refuses a merge."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        x = tokens(6)
        m = TokenSensitivity(linear(), Sequence(), sigma=1.0, generator=0, precision="float32")
        m.update(x)
        total = m.all_reduce().compute()
        mask = torch.ones(6, 4, dtype=torch.bool)
        mask[2] = False  # an example without a real token: refused
        with pytest.raises(ValueError, match="no real token"):
            m.update(x, mask)
        after = m.compute()
        assert after.num_examples == total.num_examples == 6
        assert after.estimate == total.estimate
        other = TokenSensitivity(linear(), Sequence(), sigma=1.0, generator=1,
                                 precision="float32")
        other.update(tokens(3, seed=1))
        with pytest.raises(ValueError, match="all_reduce"):
            m.merge(other)  # still the total, which a merge would count again
        m.update(x)  # a good batch after the refusal adds to this process's own state
        assert m.all_reduce().compute().num_examples == 12
    finally:
        dist.destroy_process_group()
