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
from senslab.experiments.base import seeded_name
from senslab.experiments.lowsens._comparison import SIGMA, SWEEP, comparison_verdict
from senslab.train.config import RunConfig
from senslab.train.loop import locate_data
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_COMPARABLE, SUPPORTED, WORDS

VERDICTS = set(WORDS)
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


@pytest.mark.parametrize("name", ["mnist_binary", "fashion_mnist"])
def test_three_seeds_at_both_scales_with_seed_zero_names_kept(name: str) -> None:
    exp = get_experiment(name)
    assert exp.seed_aware
    for scale in ("cpu", "paper"):
        settings, runs = exp.resolve(scale)
        labels = list(dict.fromkeys(r.config.label for r in runs))
        assert settings.seeds == 3
        assert [r.name for r in runs] == [seeded_name(m, k) for k in range(3) for m in labels]
        assert [r.config.seed for r in runs] == [k for k in range(3) for _ in labels]
        assert all(r.info == {"seed": r.config.seed} for r in runs)


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


def _check_experiment_dir(out: Path, labels: set[str], seeds: int) -> dict[str, Any]:
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] in VERDICTS and verdict["runtime_s"] > 0
    exp = json.loads((out / "experiment.json").read_text())
    assert set(exp["runs"]) == {seeded_name(m, k) for m in labels for k in range(seeds)}
    for name in exp["runs"]:
        sweep = json.loads((out / name / "sigma_sweep.json").read_text())
        assert sweep["sigmas"] == list(SWEEP)
        assert all(0 <= v["estimate"] <= 1 for v in sweep["results"].values())
        metrics = (out / name / "metrics.jsonl").read_text().splitlines()
        assert all("sens/train" in json.loads(line) for line in metrics)
    assert set(verdict["evidence"]["sigma_sweep"]) == labels
    assert set(verdict["evidence"]["winner_lowest_at"]) == {f"{s:g}" for s in SWEEP}
    if verdict["verdict"] != NOT_COMPARABLE:
        assert {p["seeds"] for p in verdict["effects"].values()} == {seeds}
    return verdict


@pytest.mark.heavy
def test_mnist_binary_end_to_end_on_idx_fixture(tmp_path: Path, idx_dataset: Any) -> None:
    root = idx_dataset(tmp_path / "mnist", 80, 20, dataset="mnist")
    over = [f"data.root={root}", "data.options.source=idx", "data.options.verify=false", *TINY]
    verdict = run_experiment("mnist_binary", tmp_path / "out", overrides=over, log=_quiet)
    _check_experiment_dir(tmp_path / "out", {"vit_small", "mlp"}, 3)
    cfg = json.loads((tmp_path / "out" / "mlp" / "config.json").read_text())
    assert cfg["data"]["options"]["digits"] == [3, 8]
    # resuming a finished experiment reuses runs and sweeps: same numbers
    again = run_experiment("mnist_binary", tmp_path / "out", overrides=over, log=_quiet)
    assert again["evidence"] == verdict["evidence"]


@pytest.mark.heavy
def test_fashion_mnist_end_to_end_on_idx_fixture(tmp_path: Path, idx_dataset: Any) -> None:
    root = idx_dataset(tmp_path / "fashion", 60, 20)
    over = [f"data.root={root}", "data.options.verify=false", "seeds=2", *TINY]
    run_experiment("fashion_mnist", tmp_path / "out", overrides=over, log=_quiet)
    _check_experiment_dir(tmp_path / "out", {"vit_small", "cnn", "mlp", "mlp_sigmoid"}, 2)


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


def _summary(label: str, acc: float, sens: float, se: float = 0.001, seed: int = 0,
             sweep: dict[str, float] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"label": label, "name": seeded_name(label, seed), "seed": seed,
                         "epochs": 3, "stopped": "target_train_acc",
                         "final": {"train/acc": acc, "sens/train": sens, "sens/train_se": se}}
    if sweep is not None:
        s["sigma_sweep"] = {k: {"estimate": v, "stderr": 0.001} for k, v in sweep.items()}
    return s


def _seeds(label: str, sens: list[float], accs: list[float] | None = None,
           sweeps: list[dict[str, float]] | None = None) -> list[dict[str, Any]]:
    """One summary per seed 0, 1, 2 ... of ``label`` (train accuracy 0.95 unless given)."""
    accs = accs or [0.95] * len(sens)
    return [_summary(label, a, v, seed=k, sweep=sweeps[k] if sweeps else None)
            for k, (v, a) in enumerate(zip(sens, accs, strict=True))]


def test_verdict_three_seeds_supported_with_sweep_judged_per_sigma() -> None:
    # mlp − vit per seed: +0.020, +0.021, +0.018 (t on 2 df: clearly above zero). The sweep: at
    # σ = 0.5 the ViT is lower on every seed, at 1 the signs are mixed, at 2 it is higher
    vit = _seeds("vit_small", [0.010, 0.012, 0.011], sweeps=[
        {"0.5": 0.05, "1": 0.10, "2": 0.30}, {"0.5": 0.06, "1": 0.12, "2": 0.31},
        {"0.5": 0.05, "1": 0.11, "2": 0.29}])
    mlp = _seeds("mlp", [0.030, 0.033, 0.029], accs=[0.96, 0.95, 0.96], sweeps=[
        {"0.5": 0.12, "1": 0.13, "2": 0.20}, {"0.5": 0.13, "1": 0.10, "2": 0.21},
        {"0.5": 0.12, "1": 0.12, "2": 0.19}])
    v = comparison_verdict(vit + mlp, "vit_small")
    assert v["verdict"] == SUPPORTED
    part = v["effects"]["mlp − vit_small"]
    assert part["effect"] == pytest.approx(0.059 / 3) and part["df"] == 2 and part["seeds"] == 3
    assert part["interval"][0] > 0 and part["se_measure"] > 0
    assert v["reason"].startswith("vit_small has the lowest sensitivity: mlp − vit_small = +0.0197")
    assert "(95%, 3 seeds) supported" in v["reason"]
    assert "mean over 3 seeds" in v["reason"]
    ev = v["evidence"]
    assert ev["vit_small"]["seeds"]["1"]["epochs"] == 3
    assert ev["mlp"]["train_acc"] == pytest.approx((0.96 + 0.95 + 0.96) / 3)
    assert ev["mlp"]["sensitivity"] == pytest.approx(0.092 / 3)
    assert set(ev["sigma_sweep"]) == {"vit_small", "mlp"} and set(ev["sigma_sweep"]["mlp"]) == {
        "0", "1", "2"}
    at = {k: j["verdict"] for k, j in ev["winner_lowest_at"].items()}
    assert at == {"0.5": SUPPORTED, "1": INCONCLUSIVE, "2": CONTRADICTED}
    assert ev["winner_lowest_at"]["1"]["parts"]["mlp − vit_small"]["detectable"] > 0


def test_verdict_mixed_signs_inconclusive_clear_reverse_contradicted() -> None:
    vit = _seeds("vit_small", [0.010, 0.030, 0.020])
    mixed = comparison_verdict(vit + _seeds("mlp", [0.020, 0.020, 0.025]), "vit_small")
    assert mixed["verdict"] == INCONCLUSIVE
    part = mixed["effects"]["mlp − vit_small"]
    assert part["interval"][0] < 0 < part["interval"][1]
    assert part["detectable"] > abs(part["effect"]) and "could detect ≥" in mixed["reason"]
    lower = comparison_verdict(vit + _seeds("mlp", [0.002, 0.021, 0.011]), "vit_small")
    assert lower["verdict"] == CONTRADICTED  # the MLP is 0.008–0.009 below on every seed


def test_verdict_several_models_are_judged_together() -> None:
    vit = _seeds("vit_small", [0.010, 0.012, 0.011])
    cnn = _seeds("cnn", [0.030, 0.033, 0.029])  # clearly above
    mlp = _seeds("mlp", [0.020, 0.005, 0.016])  # mixed
    v = comparison_verdict(vit + cnn + mlp, "vit_small")
    assert v["verdict"] == INCONCLUSIVE and v["correction"] == "Holm over 2 parts"
    assert v["effects"]["cnn − vit_small"]["verdict"] == SUPPORTED
    assert v["effects"]["mlp − vit_small"]["verdict"] == INCONCLUSIVE
    # Holm: the smaller p is tested at 0.05/2, so its interval is at the 97.5% level
    assert {round(p["level"], 4) for p in v["effects"].values()} == {0.975, 0.95}
    low = _seeds("mlp", [0.002, 0.003, 0.002])  # clearly below the ViT
    assert comparison_verdict(vit + cnn + low, "vit_small")["verdict"] == CONTRADICTED


def test_verdict_one_seed_is_measurement_only() -> None:
    v = comparison_verdict([_summary("vit_small", 0.95, 0.010), _summary("mlp", 0.96, 0.030)],
                           "vit_small")
    assert v["verdict"] == SUPPORTED and "measurement noise only" in v["reason"]
    close = comparison_verdict([_summary("vit_small", 0.95, 0.010),
                                _summary("mlp", 0.95, 0.011)], "vit_small")
    assert close["verdict"] == INCONCLUSIVE


def test_verdict_not_comparable() -> None:
    vit = _seeds("vit_small", [0.010, 0.012, 0.011])
    # the gap of the seed-mean train accuracies decides: 0.95 vs 0.80 → 0.150
    gap = comparison_verdict(vit + _seeds("mlp", [0.03] * 3, accs=[0.80] * 3), "vit_small")
    assert gap["verdict"] == NOT_COMPARABLE and "0.150" in gap["reason"]
    assert gap["evidence"]["train_acc_gap"] == pytest.approx(0.15) and gap["effects"] == {}
    # one seed 0.04 apart, the seed means 0.003 apart: comparable
    near = comparison_verdict(vit + _seeds("mlp", [0.030, 0.033, 0.029],
                                           accs=[0.99, 0.94, 0.93]), "vit_small")
    assert near["verdict"] == SUPPORTED
    assert near["evidence"]["train_acc_gap_per_seed"]["0"] == pytest.approx(0.04)
    missing = comparison_verdict(_seeds("mlp", [0.05]), "vit_small")
    assert missing["verdict"] == NOT_COMPARABLE and "need vit_small" in missing["reason"]
    untracked = _summary("mlp", 0.95, 0.05)
    del untracked["final"]["sens/train"]
    nosens = comparison_verdict([_summary("vit_small", 0.95, 0.01), untracked], "vit_small")
    assert nosens["verdict"] == NOT_COMPARABLE and "mlp: sens/train" in nosens["reason"]
    fewer = comparison_verdict(vit + _seeds("mlp", [0.03, 0.03]), "vit_small")
    assert fewer["verdict"] == NOT_COMPARABLE and "different seeds" in fewer["reason"]


def test_verdict_names_runs_that_missed_the_target() -> None:
    short = _summary("mlp", 0.96, 0.03, seed=1)
    short["stopped"] = "budget"
    runs = [_summary("vit_small", 0.95, 0.01), _summary("vit_small", 0.95, 0.01, seed=1),
            _summary("mlp", 0.96, 0.03), short]
    assert "did not reach the target: mlp-s1" in comparison_verdict(runs, "vit_small")["reason"]
