"""A measurement's warning in a training loop is said once per run, not at every evaluation:
Boolean sensitivity sampled from few strings warns that its standard error rests on few or no
changes, and a message with other numbers is another message to Python's filters."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from senslab._stack import said_once
from senslab.measure import boolean_sensitivity
from senslab.train.loops.sparse_parity import SparseParityRun, train_sparse_parity


def _causes(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message).split(":", 1)[0] for w in caught
            if "the standard error rests on" in str(w.message)]


def test_said_once_says_each_cause_once_and_others_still() -> None:
    said: set[str] = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(3):  # a constant: no flip ever changes it
            with said_once(said):
                boolean_sensitivity(lambda x: torch.ones(len(x)), 12, method="sample",
                                    num_samples=50, generator=seed)
        with said_once(said):  # AND of 4 bits: a few strings change (5/16), a cause of its own
            boolean_sensitivity(lambda x: (x[:, :4] > 0).all(1).float() * 2 - 1, 12,
                                method="sample", num_samples=20, generator=0)
    assert _causes(caught) == ["the standard error rests on no change",
                               "the standard error rests on few changes"]


def test_a_sparse_parity_run_warns_once_per_cause(tmp_path: Path) -> None:
    cfg = SparseParityRun(n_bits=12, k=2, epochs=3, test_size=32, bool_samples=4,
                          train_size=32, width=8, heads=2, layers=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_sparse_parity(cfg, tmp_path / "run", progress=False)
    causes = _causes(caught)
    assert causes  # 4 strings of an untrained model: the warning is due
    assert len(causes) == len(set(causes))  # 4 evaluations, each cause said once
