"""One override path for every experiment: the same bad key, the same bad value and the same bad
scale fail with the same message for experiments of different papers and loops, before any
directory is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senslab.cli import parser
from senslab.experiments import get_experiment, list_experiments, run_experiment
from senslab.experiments.base import SCALES, Settings

ROOT = Path(__file__).resolve().parents[2]

#: experiment → (a misspelt key, the key it should suggest, an int key, a float key > 0);
#: lowsens with fit and with its own loop, Hahn & Rofin, implicit bias
CASES = {
    "mnist_binary": ("train.epochz", "train.epochs", "train.epochs", "optim.lr"),
    "grokking": ("epochz", "epochs", "epochs", "lr"),
    "hr_parity_dynamics": ("stepz", "steps", "steps", "lr"),
    "ib_fixed_v": ("stepz", "steps", "steps", "gd_lr"),
}


def _fails(tmp_path: Path, name: str, error: type[Exception], match: str,
           overrides: list[str], scale: str = "cpu") -> None:
    out = tmp_path / name
    with pytest.raises(error, match=match):
        run_experiment(name, out, scale=scale, overrides=overrides, log=lambda _: None)
    assert not out.exists(), f"{name} wrote {out} before refusing its overrides"


@pytest.mark.parametrize("name", CASES)
def test_unknown_key_names_the_closest(tmp_path: Path, name: str) -> None:
    typo, meant, _, _ = CASES[name]
    _fails(tmp_path, name, KeyError,
           rf"unknown config key '{typo}'\. Did you mean '{meant}'\? Valid keys: .*{meant}",
           [f"{typo}=3"])


@pytest.mark.parametrize("name", CASES)
def test_wrong_type_names_the_type(tmp_path: Path, name: str) -> None:
    _, _, int_key, _ = CASES[name]
    _fails(tmp_path, name, TypeError, rf"^{int_key} must be int, got 'many'$",
           [f"{int_key}=many"])
    _fails(tmp_path, name, TypeError, rf"^{int_key} must be int, got 0\.5$", [f"{int_key}=0.5"])


@pytest.mark.parametrize("name", CASES)
def test_out_of_range_names_the_range(tmp_path: Path, name: str) -> None:
    _, _, int_key, float_key = CASES[name]
    _fails(tmp_path, name, ValueError, rf"^{int_key} must be ≥ 1, got 0$", [f"{int_key}=0"])
    _fails(tmp_path, name, ValueError, rf"^{float_key} must be > 0, got -1(\.0)?$",
           [f"{float_key}=-1"])


@pytest.mark.parametrize("name", CASES)
def test_not_an_assignment(tmp_path: Path, name: str) -> None:
    _fails(tmp_path, name, ValueError, r"must look like key=value, e\.g\. \S+=", ["steps"])


@pytest.mark.parametrize("name", CASES)
def test_unknown_scale_lists_the_scales(tmp_path: Path, name: str) -> None:
    _fails(tmp_path, name, ValueError, r"unknown scale 'gpu'; use one of cpu, paper", [],
           scale="gpu")


@pytest.mark.parametrize("name", list_experiments())
def test_every_experiment_resolves_at_every_scale(name: str) -> None:
    exp = get_experiment(name)
    if exp.scales:
        assert set(exp.scales) == set(SCALES)
    for scale in SCALES:
        exp.check(scale, [])
    with pytest.raises(ValueError, match="use one of cpu, paper"):
        exp.check("gpu", [])


def test_cpu_is_the_default_scale_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    assert SCALES[0] == "cpu"
    assert parser().parse_args(["run", "demo"]).scale == "cpu"
    for scale in SCALES:  # the CLI's choices are SCALES, and the ladder over them
        assert parser().parse_args(["run", "demo", "--scale", scale]).scale == scale
    with pytest.raises(SystemExit):
        parser().parse_args(["run", "demo", "--scale", "gpu"])
    assert f"--scale {{{','.join((*SCALES, 'ladder'))}}}" in capsys.readouterr().err


def test_text_setting_takes_the_text_as_written() -> None:
    # a str field keeps a value that parses to something else, as typed: only=0 is "0"
    st = get_experiment("sparse_parity").settings("cpu", ["only=0,3"])
    assert st.only == "0,3"
    assert get_experiment("sparse_parity").settings("cpu", ["only=0"]).only == "0"
    assert get_experiment("imagenet").settings("cpu", ["root=/data/train"]).root == "/data/train"


def test_settings_are_copies() -> None:
    exp = get_experiment("ib_joint")
    changed = exp.settings("cpu", ["steps=7", "data.dim=4"])
    assert (changed.steps, changed.data) == (7, {"dim": 4})
    assert exp.settings("cpu").steps != 7 and exp.settings("cpu").data == {}


@pytest.mark.parametrize("path", sorted((ROOT / "reproduction").glob("*.json")),
                         ids=lambda p: p.stem)
def test_recorded_overrides_still_parse(path: Path) -> None:
    record = json.loads(path.read_text())
    if record.get("name", path.stem) not in list_experiments():
        pytest.skip("experiment no longer registered")
    get_experiment(record.get("name", path.stem)).check(record.get("scale", "cpu"),
                                                        record.get("overrides") or [])


@pytest.mark.parametrize("name", list_experiments())
def test_seeds_and_scales_are_axes(name: str) -> None:
    """Every experiment has settings for every scale, derived from the common Settings, and
    ``seeds`` adds seed replicates (new run names) without touching the others."""
    exp = get_experiment(name)
    assert set(exp.scales) == set(SCALES)
    for scale in SCALES:
        settings, runs = exp.resolve(scale, [])
        assert isinstance(settings, Settings) and runs
        more = exp.resolve(scale, [f"seeds={settings.seeds + 1}"])[1]
        names, more_names = [r.name for r in runs], [r.name for r in more]
        assert len(set(more_names)) == len(more_names) > len(names)
        assert set(names) <= set(more_names), "adding a seed renamed the existing runs"


def test_a_run_config_key_reaches_every_run_and_a_settings_key_the_settings() -> None:
    exp = get_experiment("mnist_binary")
    settings, runs = exp.resolve("cpu", ["train.epochs=2", "seeds=2"])
    assert settings.seeds == 2 and len(runs) >= 4
    assert {r.config.train.epochs for r in runs} == {2}
    assert sorted({r.config.seed for r in runs}) == [0, 1]


def test_a_one_run_per_model_verdict_is_not_read_from_one_of_several_seeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every registered experiment judges all its seeds. An experiment whose verdict compares
    one run per model (``seed_aware = False``, here demo made so) still trains both replicates
    with ``seeds=2``, and its verdict says it was not computed over seeds instead of judging
    whichever seed came last."""
    assert all(get_experiment(n).seed_aware for n in list_experiments())
    monkeypatch.setattr(type(get_experiment("demo")), "seed_aware", False)
    fast = ["train.epochs=1", "train.max_steps=2", "data.train_subset=100",
            "track.num_examples=8", "track.eval_examples=20"]
    verdict = run_experiment("demo", tmp_path, overrides=fast + ["seeds=2"],
                             log=lambda _: None)
    assert verdict["verdict"] == "not comparable"
    assert verdict["reason"].startswith("2 seeds per run: demo's verdict compares one run per")
    runs = json.loads((tmp_path / "experiment.json").read_text())["runs"]
    assert sorted(runs) == ["cnn", "cnn-s1", "mlp", "mlp-s1", "vit_small", "vit_small-s1"]
    assert all((tmp_path / r / "summary.json").exists() for r in runs)
