"""Audit 84, adaptive stopping's memory: with ``target_stderr=`` and a huge ``max_forward`` the
copies kept round after round grew until torch's raw out-of-memory error; the rounds now end
where another would not fit in the free memory, measured and said (the estimate of the rounds
done, as where ``max_forward`` ends them)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, tokenwise
from senslab.tokens import Sequence


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(8 * 4, 16), nn.Tanh(), nn.Linear(16, 3)).eval()


def _metric(max_forward: int) -> TokenSensitivity:
    return TokenSensitivity(_mlp(), Sequence(), sigma=0.3, repeats=4, generator=0,
                            precision="float32", target_stderr=1e-9, max_forward=max_forward)


def test_rounds_end_where_the_next_would_not_fit_in_memory(monkeypatch) -> None:
    # a machine whose free memory holds the plan of about 200 copies (16 tokens x 4 repeats =
    # 64 a round): filling gigabytes for real is no test, so the free memory reading is made
    # small (the first round fits, as _refuse_huge_plan checks). Before: 31 rounds, 1,984
    # copies, all kept at once (on a real machine: torch's "can't allocate memory")
    x = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(tokenwise, "free_memory", lambda device: 200 * tokenwise.PLAN_BYTES)
    monkeypatch.setattr(tokenwise, "PLAN_FLOOR", 0)
    metric = _metric(2000)
    with pytest.warns(RuntimeWarning, match=r"target_stderr=1e-09 was not reached: a batch's "
                                            r"rounds ended after 5 \(320 perturbed copies, 322 "
                                            r"forwards.*GiB free on cpu.*max_forward=322 or less"):
        metric.update(x)
    assert metric.state.copies == 320 and metric.state.n == 2  # measured, not lost
    first = float(metric.state.s1), float(metric.state.s2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # said once per metric
        metric.update(x)
    assert metric.state.copies == 640
    # the rounds a max_forward of the same size allows: the same estimate, without a warning
    capped = _metric(322)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        capped.update(x)
    assert capped.state.copies == 320
    assert (float(capped.state.s1), float(capped.state.s2)) == first


def test_rounds_that_fit_are_not_cut(monkeypatch) -> None:
    # the same run with room for every round: max_forward ends it (31 rounds), no warning
    x = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(tokenwise, "free_memory", lambda device: 10**6 * tokenwise.PLAN_BYTES)
    monkeypatch.setattr(tokenwise, "PLAN_FLOOR", 0)
    metric = _metric(2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        metric.update(x)
    assert metric.state.copies == 31 * 64


@pytest.mark.parametrize("over", [1, 0])
def test_cli_threads_above_the_cpus_are_said_once(over: int,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # before: --threads 512 on 2 CPUs was taken without a word (only 4 x CPUs is refused)
    import os

    from senslab.cli import main

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    before = torch.get_num_threads()
    try:
        assert main(["list", "datasets", "--threads", str(cpus + over)]) == 0
    finally:
        torch.set_num_threads(before)
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("senslab: warning: --threads")]
    if over:
        assert said == [f"senslab: warning: --threads {cpus + 1} is more than the {cpus} CPU"
                        f"{'s' if cpus != 1 else ''} this process may use: the threads take "
                        f"turns on them and wait on each other, so the command runs slower than "
                        f"with --threads "
                        f"{cpus} or fewer; on a shared machine give the cores no other job uses"]
    else:
        assert said == []
