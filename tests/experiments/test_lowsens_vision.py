"""The MNIST-binary and Fashion-MNIST experiments: registration, the settings of both scales,
tiny end-to-end runs on idx-gz fixture files written here, verdicts on hand-made summaries, and
the missing-data error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from senslab.cli import main
from senslab.data import DataUnavailableError
from senslab.experiments import get_experiment, list_experiments, run_experiment
from senslab.experiments.lowsens._comparison import SIGMA, SWEEP, comparison_verdict
from senslab.train.config import RunConfig
from senslab.train.loop import locate_data

VERDICTS = {"holds", "does not hold", "not comparable"}
IDX_NAMES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _quiet(_: str) -> None:
    pass


def _opts(cfgs: list[RunConfig]) -> dict[str, RunConfig]:
    return {c.label: c for c in cfgs}


# --------------------------------------------------------------------------- settings


def test_registered_with_documentation() -> None:
    assert {"mnist_binary", "fashion_mnist"} <= set(list_experiments())
    for name in ("mnist_binary", "fashion_mnist"):
        exp = get_experiment(name)
        assert exp.paper and exp.claim and exp.cpu_scale_note
    assert "--set data.root=DIR" in get_experiment("fashion_mnist").requires


def test_mnist_binary_settings_both_scales() -> None:
    exp = get_experiment("mnist_binary")
    for scale in ("cpu", "paper"):
        runs = _opts(exp.configs(scale))
        assert set(runs) == {"vit_small", "mlp"}
        for cfg in runs.values():
            assert (cfg.optim.name, cfg.optim.lr, cfg.train.batch_size) == ("sgd", 0.01, 50)
            assert cfg.data.name == "mnist" and len(cfg.data.options["digits"]) == 2
            assert cfg.track.sigma == SIGMA == 0.1 and cfg.track.every == 1
            assert cfg.train.target_train_acc is not None
        assert runs["vit_small"].model.overrides["patch_size"] == 7
        mlp = runs["mlp"].model.overrides
        assert len(mlp["widths"]) == 1 and mlp["activation"] == "leaky_relu"
        assert mlp["sens_patch"] == 7
    paper = _opts(exp.configs("paper"))
    assert paper["vit_small"].model.overrides == {"patch_size": 7}  # paper-code ViT-small
    assert paper["mlp"].data.train_subset is None and paper["mlp"].train.epochs == 50
    assert _opts(exp.configs("cpu"))["vit_small"].model.overrides["depth"] < 8
    with pytest.raises(ValueError, match="scale"):
        exp.configs("gpu")


def test_fashion_mnist_settings_both_scales() -> None:
    exp = get_experiment("fashion_mnist")
    want_lr = {"vit_small": 0.1, "cnn": 0.005, "mlp": 0.1, "mlp_sigmoid": 0.5}
    for scale in ("cpu", "paper"):
        runs = _opts(exp.configs(scale))
        assert {k: c.optim.lr for k, c in runs.items()} == want_lr
        for label, cfg in runs.items():
            assert cfg.model.name == label and cfg.data.name == "fashion_mnist"
            assert (cfg.optim.name, cfg.train.batch_size, cfg.track.sigma) == ("sgd", 100, 0.1)
        assert runs["vit_small"].model.overrides["patch_size"] == 4
        assert all(runs[k].model.overrides["sens_patch"] == 4 for k in ("cnn", "mlp",
                                                                        "mlp_sigmoid"))
    paper = _opts(exp.configs("paper"))
    assert paper["vit_small"].model.overrides == {"patch_size": 4}
    assert paper["cnn"].model.overrides == {"sens_patch": 4}
    assert all(c.data.train_subset is None and c.train.epochs == 50 for c in paper.values())
    assert all(c.data.train_subset == 5000 for c in exp.configs("cpu"))


# --------------------------------------------------------------------------- end to end

TINY = ["train.epochs=1", "track.num_examples=6", "track.repeats=1", "train.eval_batch_size=64"]


def _check_experiment_dir(out: Path, labels: set[str]) -> dict[str, Any]:
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] in VERDICTS and verdict["runtime_s"] > 0
    exp = json.loads((out / "experiment.json").read_text())
    assert set(exp["runs"]) == labels
    for name in exp["runs"]:
        sweep = json.loads((out / name / "sigma_sweep.json").read_text())
        assert sweep["sigmas"] == list(SWEEP)
        assert all(0 <= v["estimate"] <= 1 for v in sweep["results"].values())
        metrics = (out / name / "metrics.jsonl").read_text().splitlines()
        assert all("sens/train" in json.loads(line) for line in metrics)
    assert set(verdict["evidence"]["sigma_sweep"]) == labels
    return verdict


def test_mnist_binary_end_to_end_on_idx_fixture(tmp_path: Path, idx_dataset: Any) -> None:
    root = idx_dataset(tmp_path / "mnist", 80, 20, dataset="mnist")
    over = [f"data.root={root}", "data.options.source=idx", "data.options.verify=false", *TINY]
    verdict = run_experiment("mnist_binary", tmp_path / "out", overrides=over, log=_quiet)
    _check_experiment_dir(tmp_path / "out", {"vit_small", "mlp"})
    cfg = json.loads((tmp_path / "out" / "mlp" / "config.json").read_text())
    assert cfg["data"]["options"]["digits"] == [3, 8]
    # resuming a finished experiment reuses runs and sweeps: same numbers
    again = run_experiment("mnist_binary", tmp_path / "out", overrides=over, log=_quiet)
    assert again["evidence"] == verdict["evidence"]


def test_fashion_mnist_end_to_end_on_idx_fixture(tmp_path: Path, idx_dataset: Any) -> None:
    root = idx_dataset(tmp_path / "fashion", 60, 20)
    over = [f"data.root={root}", "data.options.verify=false", *TINY]
    run_experiment("fashion_mnist", tmp_path / "out", overrides=over, log=_quiet)
    _check_experiment_dir(tmp_path / "out", {"vit_small", "cnn", "mlp", "mlp_sigmoid"})


# --------------------------------------------------------------------------- data location


def test_missing_fashion_data_error_says_where_to_put_it(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = get_experiment("fashion_mnist").configs("cpu")[0]
    cfg.data.root = str(tmp_path / "nowhere")
    with pytest.raises(DataUnavailableError) as err:
        locate_data(cfg)
    msg = str(err.value)
    assert "--set data.root=DIR" in msg and str(tmp_path / "nowhere") in msg
    assert all(name in msg for name in IDX_NAMES)
    # without a root: every place looked in, every fix
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "data"))
    cfg.data.root = None
    with pytest.raises(DataUnavailableError) as err:
        locate_data(cfg)
    msg = str(err.value)
    assert str(tmp_path / "data" / "fashion_mnist") in msg and "SENSLAB_DATA=DIR" in msg
    assert "--set data.root=DIR" in msg and "--set data.download=true" in msg
    out = tmp_path / "out"
    code = main(["run", "fashion_mnist", "--out", str(out),
                 "--set", f"data.root={tmp_path / 'nowhere'}"])
    assert code == 2
    assert "--set data.root=DIR" in capsys.readouterr().err
    assert not (out / "vit_small").exists()  # stopped before any training


def test_fashion_data_found_through_senslab_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                idx_dataset: Any) -> None:
    """The experiment finds its data by the data package's rule (never relative to the working
    directory), records the folder in the config, and an explicit root still wins."""
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    idx_dataset(tmp_path / "shared" / "data" / "fashion_mnist", 10, 10)
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "data"))
    cfg = get_experiment("fashion_mnist").configs("cpu")[0]
    assert cfg.data.root is None  # runs() are data: where the files are is decided at run time
    with pytest.raises(DataUnavailableError):  # ../shared beside the cwd is not looked at
        locate_data(cfg)
    own = idx_dataset(tmp_path / "data" / "fashion_mnist", 10, 10)
    locate_data(cfg)
    assert cfg.data.root == str(own.resolve())
    mine = idx_dataset(tmp_path / "mine", 10, 10)
    cfg = get_experiment("fashion_mnist").configs("cpu")[0]
    cfg.data.root = str(mine)
    locate_data(cfg)
    assert cfg.data.root == str(mine)


# --------------------------------------------------------------------------- verdicts


def _summary(label: str, acc: float, sens: float, se: float = 0.001,
             sweep: dict[str, float] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"label": label, "name": label, "epochs": 3,
                         "stopped": "target_train_acc",
                         "final": {"train/acc": acc, "sens/train": sens, "sens/train_se": se}}
    if sweep is not None:
        s["sigma_sweep"] = {k: {"estimate": v, "stderr": 0.01} for k, v in sweep.items()}
    return s


def test_verdict_outcomes_on_hand_made_summaries() -> None:
    holds = comparison_verdict([  # sweep s.e. 0.01 each: 2 s.e. of a difference = 0.028
        _summary("vit_small", 0.95, 0.010, sweep={"0.5": 0.05, "1": 0.10, "2": 0.20}),
        _summary("mlp", 0.96, 0.030, sweep={"0.5": 0.12, "1": 0.08, "2": 0.21}),
    ], "vit_small")
    assert holds["verdict"] == "holds"
    assert holds["evidence"]["winner_below_by_2se_at"] == {"0.5": True, "1": False, "2": False}
    assert holds["evidence"]["vit_small"]["epochs"] == 3

    close = comparison_verdict([_summary("vit_small", 0.95, 0.010),
                                _summary("mlp", 0.95, 0.011)], "vit_small")
    assert close["verdict"] == "does not hold"  # below, but not by 2 s.e.
    higher = comparison_verdict([_summary("vit_small", 0.95, 0.05),
                                 _summary("cnn", 0.95, 0.01), _summary("mlp", 0.95, 0.09)],
                                "vit_small")
    assert higher["verdict"] == "does not hold" and "cnn" in higher["reason"]

    gap = comparison_verdict([_summary("vit_small", 0.80, 0.01), _summary("mlp", 0.95, 0.05)],
                             "vit_small")
    assert gap["verdict"] == "not comparable" and "0.150" in gap["reason"]
    missing = comparison_verdict([_summary("mlp", 0.95, 0.05)], "vit_small")
    assert missing["verdict"] == "not comparable"
    untracked = _summary("mlp", 0.95, 0.05)
    del untracked["final"]["sens/train"]
    nosens = comparison_verdict([_summary("vit_small", 0.95, 0.01), untracked], "vit_small")
    assert nosens["verdict"] == "not comparable"

    short = _summary("mlp", 0.96, 0.03)
    short["stopped"] = "budget"
    note = comparison_verdict([_summary("vit_small", 0.95, 0.01), short], "vit_small")
    assert "did not reach the target: mlp" in note["reason"]
