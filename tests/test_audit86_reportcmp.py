"""Audit 86 (report figures and paired comparisons): options that matched nothing ignored
without a word, sequences drawn as patch grids, comparisons of other estimands merged, and a
difference made of tie-breaks on different examples left unsaid.

* ``plot_curves(keys=...)`` drew a key no run logged as an empty panel, and ``logy`` naming a
  key of no panel made no axis logarithmic, both silently; both are now said, naming the keys.
* ``patch_grid`` took any profile over positions ``0 … g² − 1`` for an image's patch grid: a
  16-token sequence model (``Sequence`` tokens count from 0) was drawn as a 4 × 4 heatmap.
* ``CompareSensitivity.merge`` merged a comparison built with ``estimand="data"`` into one with
  ``"subset"``, reporting the subset standard errors for both.
* The pair's tie warning compared the numbers of tied examples: one tie in each model, on
  different examples, made a "significant" difference of tie-breaks alone, unsaid.
* A misspelt option of a comparison (``seed=``) was told to declare ``output_kind`` on the model.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from senslab.measure import CompareSensitivity, compare_sensitivity
from senslab.report import load_runs, make_report
from senslab.report.plots import patch_grid, plot_curves
from senslab.tokens import Sequence

TIES = "the paired difference counts flips of examples whose clean class is a tie"


def write_run(path: Path, model: str | None, positions: int = 16) -> Path:
    """A finished run of ``model`` (None: a config that names none) whose profile is over the
    positions 0 … ``positions`` − 1."""
    path.mkdir(parents=True)
    config: dict = {"name": path.name, "label": path.name, "seed": 0}
    if model is not None:
        config["model"] = {"name": model, "overrides": {}}
    (path / "config.json").write_text(json.dumps(config))
    rows = [{"step": i, "epoch": float(i), "train/loss": 1.0 / (i + 1), "sens/train": 0.1,
             "sens/train_positions": list(range(positions)),
             "sens/train_per_position": [0.01 * p for p in range(positions)]}
            for i in range(1, 4)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"label": path.name, "final": rows[-1]}))
    return path


def test_a_curve_key_no_run_logged_is_said_naming_the_logged_ones(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / "r", "mlp")])
    with pytest.warns(UserWarning, match=r"no run logged 'sens/trian' over training.*panel is "
                                         r"empty.*'train/loss', 'sens/train'") as said:
        plot_curves(runs, tmp_path / "c.png", keys=["sens/train", "sens/trian"])
    assert said[0].filename == __file__  # pointed at the caller's line
    # one key as a str is that key, not its characters
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_curves(runs, tmp_path / "one.png", keys="sens/train")
    assert (tmp_path / "one.png").exists()


def test_a_logy_key_of_no_panel_is_said(tmp_path: Path) -> None:
    runs = load_runs([write_run(tmp_path / "r", "mlp")])
    with pytest.warns(UserWarning, match=r"logy names 'train/los', which no panel of the figure "
                                         r"draws.*the panels draw 'train/loss', 'sens/train'"):
        plot_curves(runs, tmp_path / "c.png", logy={"train/los"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a key the figure draws: nothing to say
        plot_curves(runs, tmp_path / "ok.png", logy="train/loss")


@pytest.mark.parametrize("model", ["sparse_attention", "attention_model"])
def test_a_sequence_model_of_a_square_length_is_no_patch_grid(tmp_path: Path,
                                                              model: str) -> None:
    runs = load_runs([write_run(tmp_path / "seq", model)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert patch_grid(runs) is None
    page = make_report([tmp_path / "seq"], tmp_path / "out").read_text(encoding="utf-8")
    assert "Sensitivity per token position" in page and "patch grid" not in page


def test_an_image_model_is_a_patch_grid_and_an_unknown_one_is_not_guessed(
        tmp_path: Path) -> None:
    assert patch_grid(load_runs([write_run(tmp_path / "vit", "vit_small")])) == (4, 4)
    # a config naming no model (a hand-written run): the positions alone, as before
    assert patch_grid(load_runs([write_run(tmp_path / "none", None, 9)])) == (3, 3)
    # a model not registered here: not guessed, said
    unknown = load_runs([write_run(tmp_path / "plugin", "my_plugin_model")])
    with pytest.warns(UserWarning, match=r"model 'my_plugin_model' is not registered here"):
        assert patch_grid(unknown) is None
    # an image run beside a sequence run of the same length: no grid for both
    mixed = load_runs([tmp_path / "vit", write_run(tmp_path / "seq", "sparse_attention")])
    assert patch_grid(mixed) is None


def _heads() -> dict:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    return {"a": lambda z: a(z).sum(1), "b": lambda z: b(z).sum(1)}


def test_comparisons_of_other_estimands_are_not_merged() -> None:
    models = _heads()
    x = torch.randn(8, 4, 3, generator=torch.Generator().manual_seed(1))
    data = CompareSensitivity(models, Sequence(), sigma=3.0, repeats=4, generator=0,
                              estimand="data")
    subset = CompareSensitivity(models, Sequence(), sigma=3.0, repeats=4, generator=1,
                                estimand="subset")
    data.update(x[:4])
    subset.update(x[4:])
    with pytest.raises(ValueError, match=r"estimand='subset' but the other estimand='data'"):
        subset.merge(data)
    assert subset.compute().results["a"].num_examples == 4  # nothing added
    same = CompareSensitivity(models, Sequence(), sigma=3.0, repeats=4, generator=2,
                              estimand="subset")
    same.update(x[:4])
    assert subset.merge(same).compute().results["a"].num_examples == 8


def _tied_apart() -> tuple[dict, torch.Tensor]:
    """Two bias-free heads, each tied on one example of 8 (the same number), not the same:
    a 10-class head on a blank example, a 2-class head on another."""
    torch.manual_seed(0)
    x = torch.randn(8, 4, 3)
    x[0] = 0
    e1 = x[1].clone()
    ha = torch.nn.Linear(3, 10, bias=False)
    hb = torch.nn.Linear(3, 2, bias=False)
    return {"a": lambda z: ha(z).sum(1), "b": lambda z: hb(z - e1).sum(1)}, x


def test_ties_on_different_examples_are_said_of_the_difference() -> None:
    models, x = _tied_apart()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric = CompareSensitivity(models, Sequence(), sigma=1e-3, repeats=8, generator=0,
                                    estimand="subset")
        metric.update(x)
        r = metric.compute()
    said = [str(w.message) for w in caught]
    assert metric.metrics["a"].state.ties == metric.metrics["b"].state.ties == 1
    d = r.difference("a", "b")
    assert d.ci95[0] > 0  # "significant", every flip of it a tie-break
    ours = [m for m in said if m.startswith(TIES)]
    assert len(ours) == 1
    assert "2 of the 8 examples tie in one model and not the other" in ours[0]
    assert f"make {d.estimate:+.4f} of the difference" in ours[0]


def test_the_same_tied_example_in_both_models_is_not_said_of_the_difference() -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 4, 3)
    x[0] = 0
    ha, hb = torch.nn.Linear(3, 3, bias=False), torch.nn.Linear(3, 3, bias=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare_sensitivity({"a": lambda z: ha(z).sum(1), "b": lambda z: hb(z).sum(1)}, x,
                            Sequence(), sigma=1e-3, repeats=8, generator=0)
    said = [str(w.message) for w in caught]
    assert sum("the sensitivity counts flips of examples whose clean" in m for m in said) == 2
    assert not any(m.startswith(TIES) for m in said)


def test_a_misspelt_option_is_not_told_about_output_kind() -> None:
    with pytest.raises(TypeError, match=r"model 'a'.*seed=: pass generator=") as err:
        CompareSensitivity(_heads(), Sequence(), sigma=1.0, seed=0)
    assert "declare it on the model" not in str(err.value)
