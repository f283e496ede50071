"""A run-configuration override given alone (``--set train.epochs=10``) where a setting of the
experiment sets that field (``epochs``): the settings say the value that ran, a value the setting
refuses is refused under the run key too, and a directory trained with one override is not
resumed under another."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from senslab.experiments import get_experiment, run_experiment


@pytest.mark.parametrize(("name", "overrides", "said"), [
    ("ib_vit_mnist", ["train.epochs=10"], {"epochs": 10}),
    ("cifar10", ["track.sigma=2.0", "track.repeats=3"], {"sigma": 2.0, "repeats": 3}),
    ("mnist_binary", ["track.num_examples=50"], {"track_examples": 50}),
    ("language_sst2", ["data.options.max_len=32", "optim.lr=0.002"],
     {"max_len": 32, "lr": 0.002}),
    ("hr_random_functions", ["stop_below=0.005"], {"stop_loss": 0.005}),
])
def test_a_lone_run_override_is_the_setting_it_stands_for(name: str, overrides: list[str],
                                                          said: dict[str, object]) -> None:
    """``--set train.epochs=10`` trained 10 epochs while the settings (which after_run, the
    checks before training and the experiment's refusals read) still said the scale's 4."""
    exp = get_experiment(name)
    settings = exp.settings("cpu", overrides)
    for field, value in said.items():
        assert getattr(settings, field) == value, field
    # the same runs as the settings form of the same values
    as_settings = [f"{k}={v}" for k, v in said.items()]
    assert exp.configs("cpu", overrides) == exp.configs("cpu", as_settings)


def test_an_override_no_one_setting_sets_leaves_the_settings() -> None:
    exp = get_experiment("cifar10")
    assert exp.settings("cpu", ["optim.weight_decay=0.01"]) == exp.settings("cpu")
    # a setting given alongside the same value: taken; another value: refused, as before
    assert exp.settings("cpu", ["epochs=7", "train.epochs=7"]).epochs == 7
    with pytest.raises(ValueError, match=r"--set epochs=7: it sets train.epochs"):
        exp.check("cpu", ["epochs=7", "train.epochs=3"])


def test_a_run_key_of_a_refused_setting_value_is_refused() -> None:
    """At the paper scale (converged_loss 1e-3) ``--set stop_loss=0.01`` is refused (every run
    would stop before it counts as fitted: "not comparable"), but ``--set stop_below=0.01``, the
    same runs under the run key, was taken."""
    exp = get_experiment("hr_random_functions")
    with pytest.raises(ValueError, match=r"stop_loss=0\.01 stops each run"):
        exp.check("paper", ["stop_loss=0.01"])
    # prepare: what run_experiment refuses with before it writes anything (on the old code
    # run_experiment went on to train the paper scale)
    with pytest.raises(ValueError, match=r"^--set stop_below=0\.01: hr_random_functions sets "
                                         r"stop_below from its setting stop_loss \(stop_loss="
                                         r"None here\), so this is --set stop_loss=0\.01, which "
                                         r"is refused: stop_loss=0\.01 stops each run"):
        exp.prepare("paper", ["stop_below=0.01"])
    assert exp.settings("paper", ["stop_below=0.0005"]).stop_loss == 0.0005


def test_a_directory_of_one_override_is_not_resumed_under_another(tmp_path: Path) -> None:
    """Trained with ``train.epochs=1``: run without it (the scale's epochs) or with another
    value, it is refused naming the field; its settings form (``epochs=1``) reuses the runs."""
    fast = ["train.max_steps=2", "data.train_subset=100", "track.num_examples=8",
            "track.eval_examples=20", "seeds=1"]
    out = tmp_path / "demo"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a few flips on 8 examples
        run_experiment("demo", out, overrides=[*fast, "train.epochs=1"], log=lambda _: None)
        summaries = {p: p.read_bytes() for p in sorted(out.glob("*/summary.json"))}
        assert len(summaries) == 3
        for extra in ([], ["train.epochs=2"]):
            with pytest.raises(ValueError, match=r"holds a run with a different configuration "
                                                 r"\(differs in train.epochs\)"):
                run_experiment("demo", out, overrides=[*fast, *extra], log=lambda _: None)
        again = run_experiment("demo", out, overrides=[*fast, "epochs=1"], log=lambda _: None)
    assert again["overrides"] == [*fast, "epochs=1"]
    assert {p: p.read_bytes() for p in sorted(out.glob("*/summary.json"))} == summaries
    assert json.loads((out / "verdict.json").read_text()) == again


def test_a_setting_undone_is_named_where_the_others_alone_are_refused() -> None:
    """``converged_loss=0.001 stop_loss=none stop_below=0.5``: the refusal named
    ``stop_loss=0.01`` (the scale's, never given), from the settings without stop_loss=none,
    not the stop_below that undoes stop_loss=none."""
    exp = get_experiment("hr_random_functions")
    with pytest.raises(ValueError, match=r"^--set stop_loss=none: it sets stop_below of "
                                         r"hr_random_functions's run learned-k32-s0 to None, but "
                                         r"--set stop_below=0\.5 sets it to 0\.5 after it.*Give "
                                         r"one of the two$"):
        exp.check("cpu", ["converged_loss=0.001", "stop_loss=none", "stop_below=0.5"])
    exp.check("cpu", ["converged_loss=0.001", "stop_loss=none"])  # alone: taken
