"""``--set`` overrides of the Hahn & Rofin experiments that were recorded in every run's config
but trained something else than the runs' names and the claim say (refused before anything is
written), or nothing else at all (refused for a run-configuration field, warned for a shared
setting the runs do not use). Resolve only, but for two tiny runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from senslab.experiments import get_experiment, run_experiment

TINY = ["dim=8", "steps=6", "eval_every=3", "sharp_draws=2"]

#: (experiment, overrides, the refused key, a phrase of the reason)
FIXED = [
    # PARITY's dynamics: MAJORITY trained under the runs' names and labels "parity"
    ("hr_parity_dynamics", ["function=majority"], "function", "PARITY's training dynamics"),
    # the random-function claim: a PARITY table's subsets under the same verdict
    ("hr_random_functions", ["function=parity"], "function", "uniformly random functions"),
    # fresh-sampling claims trained on a fixed subset of the cube
    ("hr_parity_dynamics", ["train_size=8"], "train_size", "fresh strings every step"),
    ("hr_sharpness_vs_length", ["train_size=2"], "train_size", "fresh strings every step"),
    # runs named -k32 trained on 64 strings, the evidence saying k = 32
    ("hr_random_functions", ["train_sizes=[32]", "train_size=64"], "train_size",
     "through train_sizes"),
    # recorded, changes nothing: fresh sampling has no table seed
    ("hr_sharpness_vs_length", ["function_seed=3"], "function_seed", "change no run"),
    ("hr_norm_vs_blowup", ["completion=random"], "completion", "change no run"),
    ("hr_random_functions", ["seeds=1", "function_seed=3"], "function_seed", "through seeds"),
    # one sweep point or one function: the base's per-run refusal sees no difference
    ("hr_norm_vs_blowup", ["runs=1", "function=mean"], "function", "through functions"),
    ("hr_sharpness_vs_length", ["functions=['parity']", "n_values=[4]", "n=5"], "n",
     "through n_values"),
]


@pytest.mark.parametrize(("name", "overrides", "key", "why"), FIXED,
                         ids=[f"{n}:{o[-1]}" for n, o, _, _ in FIXED])
def test_a_run_field_the_experiment_fixes_is_refused(name: str, overrides: list[str], key: str,
                                                     why: str) -> None:
    with pytest.raises(ValueError) as err:
        get_experiment(name).resolve("cpu", overrides)
    text = str(err.value)
    assert text.startswith(f"--set {overrides[-1]}: {name} sets {key} ")
    assert why in text and f"({name}'s settings: " in text


UNUSED = [
    ("hr_random_functions", "batch=7", "set subset_batch"),
    ("hr_random_functions", "eval_size=7", "measured on the k training strings"),
    ("hr_sharpness_vs_length", "subset_batch=7", "set batch"),
    ("hr_parity_dynamics", "subset_batch=7", "set batch"),
    ("hr_norm_vs_blowup", "subset_batch=7", "set batch"),
]


@pytest.mark.parametrize(("name", "override", "why"), UNUSED,
                         ids=[f"{n}:{o}" for n, o, _ in UNUSED])
def test_a_setting_the_runs_do_not_use_is_warned(name: str, override: str, why: str) -> None:
    key = override.split("=")[0]
    with pytest.warns(UserWarning) as caught:
        get_experiment(name).resolve("cpu", [override])
    texts = [str(w.message) for w in caught]
    assert any(t.startswith(f"--set {override}: {name} does not use {key}: ") and why in t
               and "changes no number" in t for t in texts), texts


@pytest.mark.parametrize("override", ["lr=0.1", "weight_decay=0.2"])
def test_one_sweep_point_warns_of_lr_and_weight_decay(override: str) -> None:
    """With one sweep point every run has the same drawn lr, so the base class's refusal of a
    setting the runs set per run sees no difference; the drawn value was trained, the override
    only recorded."""
    key = override.split("=")[0]
    with pytest.warns(UserWarning, match=f"does not use {key}: each run's {key} is drawn"):
        get_experiment("hr_norm_vs_blowup").resolve("cpu", ["runs=1", override])


def test_the_warned_batch_changes_no_number(tmp_path: Path) -> None:
    """Why ``batch`` is warned of in hr_random_functions: subset training ignores it, so a run
    recorded with batch=7 has every metric of the one with the default batch."""
    base = TINY + ["n=6", "train_sizes=[16]", "seeds=1", "stop_loss=0.0"]

    def metrics(out: Path) -> list[dict[str, float]]:
        lines = (out / "learned-k16-s0" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]

    run_experiment("hr_random_functions", tmp_path / "a", overrides=base, log=lambda _: None)
    with pytest.warns(UserWarning, match="does not use batch"):
        run_experiment("hr_random_functions", tmp_path / "b", overrides=[*base, "batch=7"],
                       log=lambda _: None)
    cfg = json.loads((tmp_path / "b" / "learned-k16-s0" / "config.json").read_text())
    assert cfg["batch"] == 7  # recorded ...
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")  # ... but trained the same
    assert [r["step"] for r in metrics(tmp_path / "a")] == [3, 6]


def test_a_refused_run_field_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "dyn"
    with pytest.raises(ValueError, match="sets function itself"):
        run_experiment("hr_parity_dynamics", out, overrides=[*TINY, "n=3", "function=first"],
                       log=lambda _: None)
    assert not out.exists()


def test_overrides_that_reach_the_runs_still_do() -> None:
    """The same value as the runs have, and the fields the runs use, pass."""
    _, runs = get_experiment("hr_parity_dynamics").resolve("cpu", ["function=parity", "batch=64"])
    assert {(r.config.function, r.config.batch) for r in runs} == {("parity", 64)}
    _, runs = get_experiment("hr_random_functions").resolve(
        "cpu", ["subset_batch=64", "stop_below=0.1", "train_sizes=[32]", "train_size=32"])
    assert {(r.config.subset_batch, r.config.stop_below, r.config.train_size)
            for r in runs} == {(64, 0.1, 32)}
    _, runs = get_experiment("hr_sharpness_vs_length").resolve("cpu", ["lr=0.01",
                                                                        "stop_below=0.5"])
    assert {(r.config.lr, r.config.stop_below) for r in runs} == {(0.01, 0.5)}
