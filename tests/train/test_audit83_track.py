"""The sens/* a run logs are an independent measurement of the same weights: TokenSensitivity of
each checkpoint, on the seeded subset drawn once for the run (training split: seed + 1, test
split: seed + 2), with the run's noise seed and decision rule, gives the logged values and
standard errors exactly, at every evaluation."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from senslab._seeds import noise_seed
from senslab.measure import TokenSensitivity
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import build_model, fit, load_data
from senslab.train.rundir import RunDir, checkpoint_step
from senslab.train.track import decision_rule

ARGS = ["model.name=mlp", "data.name=digits", "model.overrides.widths=[16]", "device=cpu",
        "train.batch_size=128", "train.epochs=1", "track.num_examples=40", "track.val=true",
        "track.repeats=3", "track.sigma=0.3", "track.eval_examples=64", "track.unit=step",
        "track.every=4", "train.checkpoint_every=4", "train.keep_checkpoints=0", "seed=3"]


def test_logged_sensitivity_equals_an_independent_measurement_of_each_checkpoint(tmp_path: Path):
    cfg = apply_overrides(RunConfig(name="t"), ARGS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # few flips on 40 examples
        fit(cfg, tmp_path / "run", progress=False)
    rd = RunDir(tmp_path / "run")
    logged = {r["step"]: r for r in rd.metrics()}
    train, test = load_data(cfg)
    model = build_model(cfg, train).eval()
    subsets = {"train": train.first(40, generator=torch.Generator().manual_seed(cfg.seed + 1)),
               "val": test.first(40, generator=torch.Generator().manual_seed(cfg.seed + 2))}
    checked = []
    for path in rd.checkpoints():
        step = checkpoint_step(path)
        if step not in logged:
            continue
        model.load_state_dict(RunDir.load_checkpoint(path)["model"])
        for split, data in subsets.items():
            kind, threshold = decision_rule(cfg, model, data, torch.device("cpu"))
            metric = TokenSensitivity(model, sigma=0.3, repeats=3, output_kind=kind,
                                      threshold=threshold, generator=noise_seed(cfg.seed))
            metric.update(data.batch(slice(0, None))[0])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                r = metric.compute()
            assert logged[step][f"sens/{split}"] == r.estimate
            assert logged[step][f"sens/{split}_se"] == r.stderr
        checked.append(step)
    assert len(checked) >= 2  # several evaluations: the subset and noise are the same at each
    assert len({logged[s]["sens/train"] for s in checked}) > 1  # and the weights are not
