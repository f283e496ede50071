"""Audit of the language experiments (main paper §6 / A.4): overrides the end-of-training
numbers did not follow (``track.sigma``, a whole ``data.options``/``model.overrides`` dict
dropping a settings field), the decision rule of those numbers, the re-measurement of runs
whose untrained models shared inits, and NaN recency rates read as a flat profile."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.experiments import get_experiment
from senslab.experiments.lowsens._language_verdict import language_verdict
from senslab.experiments.lowsens.language import finish_run, init_seeds
from senslab.train.loop import fit
from senslab.train.rundir import RunDir
from senslab.verdicts import NOT_COMPARABLE, SUPPORTED

_WORDS = ("the company said its shares rose sharply on monday after a strong quarter while "
          "analysts expected lower profits").split()


def _mrpc(root: Path) -> Path:
    """A GLUE-format MRPC folder of 20 training and 8 validation pairs (seeded)."""
    root.mkdir()
    gen = torch.Generator().manual_seed(0)

    def sentence() -> str:
        n = int(torch.randint(4, 9, (1,), generator=gen))
        return " ".join(_WORDS[i] for i in torch.randint(len(_WORDS), (n,), generator=gen))

    for name, n in (("train.tsv", 20), ("dev.tsv", 8)):
        rows = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(n):
            a = sentence()
            rows.append(f"{i % 2}\t{1000 + i}\t{2000 + i}\t{a}\t{a if i % 2 else sentence()}")
        (root / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


TINY = ["model.overrides={'layers': 1, 'dim': 16, 'heads': 2, 'dropout': 0.0}", "train.epochs=1",
        "data.options={'max_len': 28, 'vocab_size': 300}"]


# --------------------------------------------------------------------------- overrides


def test_track_sigma_other_than_the_verdicts_is_refused(tmp_path: Path) -> None:
    """track.sigma moved only the tracked curves: the verdict's numbers stayed at σ² = 15 (a
    tiny LSTM: sens/train 0.018 at σ = 0.5 beside sens_end/train 0.064 at σ² = 15)."""
    exp = get_experiment("language_mrpc")
    exp.resolve("cpu", [])  # the experiment's own σ = √15 passes
    with pytest.raises(ValueError, match=r"track\.sigma=0\.5.*σ² = 15.*senslab measure"):
        exp.resolve("cpu", ["track.sigma=0.5"])
    cfg = exp.configs("cpu")[0]
    cfg.track.sigma = 1.0
    with pytest.raises(ValueError, match=r"track\.sigma=1 in .*σ² = 15"):
        finish_run(cfg, tmp_path / "run", {"final": {}})


def test_a_whole_dict_override_may_not_drop_or_contradict_a_setting() -> None:
    exp = get_experiment("language_mrpc")
    # a dict without max_len: the CPU scale's 64 reached no run (the loader's 128 trained)
    with pytest.raises(ValueError, match=r"has no 'max_len'.*max_len=64.*data\.options\.KEY"):
        exp.resolve("cpu", ["data.options={'vocab_size': 300}"])
    # layers=3 recorded, the model's default 4 × 256 trained
    with pytest.raises(ValueError, match=r"has no 'layers'.*layers=3"):
        exp.resolve("cpu", ["layers=3", "model.overrides={'dropout': 0.0}"])
    # both given, disagreeing: the runs train 1 layer, the settings record 3
    with pytest.raises(ValueError, match=r"--set layers=3 and model\.overrides with layers 1"):
        exp.resolve("cpu", ["layers=3", *TINY])
    # the dict's own values (settings not set) and single entries are taken
    runs = exp.resolve("cpu", TINY)[1]
    assert runs[0].config.model.overrides["layers"] == 1
    runs = exp.resolve("cpu", ["data.options.vocab_size=300", "max_len=32"])[1]
    assert runs[0].config.data.options == {"max_len": 32, "vocab_size": 300}


# --------------------------------------------------------------------------- finish_run


def _lstm(tmp_path: Path, extra: list[str], name: str = "lstm") -> tuple[Any, Any, Any]:
    data = _mrpc(tmp_path / "mrpc")
    exp = get_experiment("language_mrpc")
    settings, runs = exp.resolve("cpu", [*TINY, f"data.root={data}", *extra])
    return exp, settings, next(r for r in runs if r.name == name)


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
def test_end_numbers_read_the_class_as_the_run_does(tmp_path: Path) -> None:
    """train.loss=mse on one output column: train/acc and sens/* read class = output > 0.5, the
    end-of-training numbers read its sign (tracked 0.0 vs sens_end 0.014 on one tiny LSTM).
    With every training example tracked, the final model's sens/train and sens_end/train are
    one measurement (same examples, noise seed and draws) and must agree."""
    _, _, run = _lstm(tmp_path, [
        "model.overrides={'layers': 1, 'dim': 16, 'heads': 2, 'dropout': 0.0, 'num_classes': 1}",
        "train.loss=mse", "track.num_examples=20"])
    path = tmp_path / run.name
    summary = fit(run.config, path, progress=False)
    new = finish_run(run.config, path, summary)
    f = new["final"]
    assert new["language"]["end_examples"] == 20  # the whole training split, as tracked
    assert f["sens_end/train"] == f["sens/train"]
    assert f["sens_end/val"] == f["sens/val"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
def test_runs_measured_with_shared_inits_are_measured_again(tmp_path: Path) -> None:
    """The verdict calls the at-init claim not comparable for runs whose replicates shared
    untrained inits and says to measure again; running the experiment again had returned their
    summaries as they were (``after_run`` stopped at any ``init_seeds``)."""
    exp, settings, run = _lstm(tmp_path, ["track.num_examples=6", "seeds=2"], "lstm-s1")
    path = tmp_path / run.name
    first = exp.after_run(run, path, fit(run.config, path, progress=False), settings,
                          lambda _: None)
    old = json.loads((path / "summary.json").read_text())
    old["language"]["init_seeds"]["seeds"] = [1, 2, 3, 4, 5]  # the scheme before 2026-11-30
    RunDir(path).write_json("summary.json", old)
    said: list[str] = []
    again = exp.after_run(run, path, RunDir(path).read_json("summary.json"), settings,
                          said.append)
    assert said and again["language"]["init_seeds"]["seeds"] == init_seeds(1) == [
        1, 10004, 10005, 10006, 10007]
    assert json.loads((path / "summary.json").read_text())["language"]["init_seeds"][
        "seeds"] == init_seeds(1)
    # the trained model's numbers were kept, not measured again
    for key in ("sens_end/train", "sens_alt/val", "recency/diff", "sens_first/train"):
        assert again["final"][key] == first["final"][key]
    # measured with the current inits: returned as is, nothing measured
    said.clear()
    assert exp.after_run(run, path, again, settings, said.append) is again and not said


# --------------------------------------------------------------------------- verdict


def _summary(label: str, seed: int, sens: float, late: float, early: float) -> dict[str, Any]:
    j = (0.0, 0.004, -0.003)[seed]
    final = {"train/acc": 0.97, "test/acc": 0.7, "sens_end/train": sens + j,
             "sens_end/train_se": 0.002, "sens_end/val": sens + j, "sens_end/val_se": 0.002,
             "sens_alt/train": sens / 2, "sens_alt/train_se": 0.002,
             "sens_init/train": sens / 2 + j, "sens_init/train_se": 0.002,
             "recency/late": late + j, "recency/early": early + j / 2,
             "recency/diff": late + j / 2 - early,
             "recency/diff_se": 0.005}
    return {"label": label, "seed": seed, "final": final}


def _runs(encoder_late: float, encoder_early: float) -> list[dict[str, Any]]:
    return [_summary(m, k, sens, late, early) for k in range(3)
            for m, sens, late, early in (("lstm", 0.10, 0.25, 0.05),
                                         ("roberta", 0.03, encoder_late, encoder_early),
                                         ("roberta_relu", 0.02, encoder_late, encoder_early),
                                         ("gpt2", 0.05, 0.10, 0.03))]


def test_nan_recency_rates_are_not_a_flat_profile() -> None:
    """An encoder whose late and early flip rates are NaN had a late/early ratio of 1 (read as
    "no flips in either window"), so GPT-2's recency claim was supported against it."""
    ok = language_verdict(_runs(0.03, 0.03))["evidence"]["claims"]
    assert ok["gpt2_recency"]["verdict"] == SUPPORTED
    claims = language_verdict(_runs(math.nan, math.nan))["evidence"]["claims"]
    for name in ("lstm_recency", "gpt2_recency"):
        assert claims[name]["verdict"] == NOT_COMPARABLE
        assert "roberta/seed 0" in claims[name]["detail"]
        assert "not finite" in claims[name]["detail"]
    # a NaN early rate beside a real late one is no "ratio inf" either
    runs = _runs(0.03, 0.03)
    runs[1]["final"]["recency/early"] = math.nan
    runs[1]["final"]["recency/diff"] = math.nan
    assert "roberta/seed 0" in language_verdict(runs)["evidence"]["claims"]["lstm_recency"][
        "detail"]
