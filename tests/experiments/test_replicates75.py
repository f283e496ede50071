"""Audit of session 75: ``--set data.seed=K`` on ib_fixed_v (W₀ = 0, full-batch steps: its seed
replicates differ only in their data) gave every replicate the same data, so each optimiser's
seeds trained one run twice and the verdict read "the seeds tied, more seeds are needed". Now
refused before anything is written; with one seed, or on ib_joint (random initialisation), the
data seed may be fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from senslab.experiments import get_experiment, run_experiment

TINY = ["steps=20", "data.num_samples=8", "data.seq_len=4", "data.dim=8"]


def test_one_data_seed_for_every_replicate_of_fixed_v_is_refused(tmp_path: Path):
    out = tmp_path / "fv"
    with pytest.raises(ValueError, match=r"--set data.seed=5: ib_fixed_v's seed replicates "
                                         r"differ only in data.seed .*W₀ = 0.*or run seeds=1"):
        run_experiment("ib_fixed_v", out, overrides=[*TINY, "seeds=2", "data.seed=5"],
                       log=lambda _: None)
    assert not out.exists()  # refused before anything is written


def test_the_data_seed_may_be_fixed_where_replicates_differ_otherwise():
    one = get_experiment("ib_fixed_v").resolve("cpu", [*TINY, "seeds=1", "data.seed=5"])[1]
    assert {r.config.data.seed for r in one} == {5}
    default = get_experiment("ib_fixed_v").resolve("cpu", [*TINY, "seeds=2"])[1]
    assert sorted({r.config.data.seed for r in default}) == [0, 1]
    joint = get_experiment("ib_joint").resolve(
        "cpu", ["steps=20", "data.num_samples=32", "seeds=2", "data.seed=5"])[1]
    assert {r.config.data.seed for r in joint} == {5}
    assert len({r.config.seed for r in joint}) == 2  # initialised apart
