"""The implicit-bias experiments' paper scale, as audited against the paper text in
docs/fidelity.md: a change to any of these values fails here until the audit is updated."""

from __future__ import annotations

import pytest

from senslab.experiments import get_experiment

#: run label → (optimizer, lr, eta_max) of the paper's real-data runs
VIT = {"sgd": ("sgd", 0.1, None), "sngd": ("sngd", 0.001, 0.01), "sps": ("sps", None, 0.01),
       "adam": ("adam", 0.001, None)}
TEXT = {"sgd": ("sgd", 1e-3, None), "sngd": ("sngd", 0.01, 0.1), "sps": ("sps", None, 0.1),
        "adam": ("adam", 2e-5, None)}


@pytest.mark.parametrize(("name", "table", "batch"), [("ib_vit_mnist", VIT, 100),
                                                      ("ib_text", TEXT, 32)])
def test_real_data_runs_use_the_papers_optimisers(name: str, table: dict, batch: int) -> None:
    _, runs = get_experiment(name).resolve("paper", [])
    got = {r.config.label: r.config for r in runs}
    assert set(got) == set(table)
    for label, (optim, lr, eta_max) in table.items():
        cfg = got[label]
        assert cfg.optim.name == optim and cfg.optim.eta_max == eta_max
        if lr is not None:  # SPS sets its own step size
            assert cfg.optim.lr == lr
        assert cfg.train.batch_size == batch and cfg.optim.weight_decay == 0.0
        assert cfg.optim.momentum == 0.0 and cfg.optim.schedule == "constant"


def test_vit_mnist_has_the_papers_vit() -> None:
    _, runs = get_experiment("ib_vit_mnist").resolve("paper", [])
    for r in runs:
        assert r.config.model.name == "vit_small"
        assert r.config.model.overrides == {"patch_size": 4, "depth": 2, "heads": 8,
                                            "mlp_dim": 128}
        assert r.config.data.name == "mnist" and r.config.data.train_subset is None


@pytest.mark.parametrize(("name", "heads", "optimizers"), [
    ("ib_fixed_v", {"fixed"}, {"sgd", "ngd", "polyak"}),
    ("ib_joint", {"joint"}, {"sgd", "ngd", "sps", "adam"}),
])
def test_synthetic_runs_train_the_papers_model_with_its_optimisers(
        name: str, heads: set[str], optimizers: set[str]) -> None:
    settings, runs = get_experiment(name).resolve("paper", [])
    assert {r.config.head for r in runs} == heads
    assert {r.config.optimizer for r in runs} == optimizers
    assert {r.config.sps_c for r in runs} == {0.5}
    assert len(runs) == len(optimizers) * settings.seeds and settings.seeds == 5
