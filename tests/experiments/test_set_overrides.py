"""``--set`` of a field an experiment sets per run is refused (audit repro53 D1).

Run-configuration overrides reach every run after :meth:`Experiment.runs` built them, so an
override of the factor the runs are compared on (the optimizer, the function, the model), of a
per-run learning rate, of the seed or of a run's name trained every run the same way under its
old label, and the verdict compared labels that no longer differed. Overrides that are the same
for every run keep reaching every run. Resolve only: nothing trains.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from senslab.experiments import get_experiment, run_experiment

COMPARED = "differs between the runs the verdict compares"
#: (experiment, override, why, the settings fields the message names, or None: none controls it)
REFUSED = [
    ("ib_joint", "optimizer=ngd", COMPARED, None),
    ("ib_fixed_v", "optimizer=sgd", COMPARED, None),
    ("ib_joint", "lr=0.5", COMPARED, "sgd_lr, sngd_lr, adam_lr"),
    ("hr_sharpness_vs_length", "function=parity", COMPARED, "functions"),
    ("demo", "model.name=mlp", COMPARED, None),
    ("demo", "model.overrides.depth=2", COMPARED, None),
    ("cifar10_sigma", "model.name=mlp", COMPARED, "models"),
    ("ib_text", "optim.lr=0.01", COMPARED, None),
    ("ib_joint", "seed=3", "the seed replicates are replicated over it", "seeds"),
    ("hr_parity_dynamics", "seed=3", "the seed replicates are replicated over it", "seeds"),
    ("ib_joint", "name=foo", "it names each run", None),
    ("ib_joint", "label=x", "it names each run", None),
]


@pytest.mark.parametrize(("name", "override", "why", "control"), REFUSED,
                         ids=[f"{n}:{o}" for n, o, _, _ in REFUSED])
def test_a_per_run_field_is_refused(name: str, override: str, why: str,
                                    control: str | None) -> None:
    exp = get_experiment(name)
    key = override.split("=")[0]
    with pytest.raises(ValueError) as err:
        exp.resolve("cpu", [override])
    text = str(err.value)
    assert text.startswith(f"--set {override}: {name} sets {key} per run (")
    assert why in text
    settings = exp.settings("cpu")
    fields = ", ".join(f for f in vars(settings))
    assert f"({name}'s settings: {fields})" in text  # every settings field, as a menu
    if control is not None:
        assert f"through the settings field{'s' if ',' in control else ''} {control} (" in text
    else:
        assert f"No settings field of {name} changes it" in text


def test_the_message_shows_the_values_the_runs_had() -> None:
    with pytest.raises(ValueError) as err:
        get_experiment("ib_joint").resolve("cpu", ["optimizer=ngd"])
    assert "(sgd-s0: sgd; sngd-s0: ngd; sps-s0: sps; adam-s0: adam)" in str(err.value)
    with pytest.raises(ValueError) as err:
        get_experiment("ib_joint").resolve("cpu", ["lr=0.5"])
    assert "(sgd-s0: 0.1; adam-s0: 0.01)" in str(err.value)


def test_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    with pytest.raises(ValueError, match="sets optimizer per run"):
        run_experiment("ib_joint", out, overrides=["steps=5", "optimizer=ngd"],
                       log=lambda _: None)
    assert not out.exists()


@pytest.mark.parametrize(("name", "overrides", "key", "value"), [
    ("ib_joint", ["steps=10", "data.dim=4", "sps_c=2"], "sps_c", 2.0),
    ("ib_joint", ["batch_size=4", "per_decade=2"], "steps", 3000),
    ("demo", ["train.epochs=1", "data.train_subset=10"], "train.epochs", 1),
    ("mnist_binary", ["optim.lr=0.05"], "optim.lr", 0.05),  # the same for every run as built
    ("hr_sharpness_vs_length", ["device=cpu", "lr=0.01"], "lr", 0.01),  # a settings field
])
def test_an_override_the_same_for_every_run_reaches_every_run(
        name: str, overrides: list[str], key: str, value: object) -> None:
    _, runs = get_experiment(name).resolve("cpu", overrides)
    got = set()
    for run in runs:
        obj = run.config
        for part in key.split("."):
            obj = getattr(obj, part)
        got.add(obj)
    assert got == {value}


def test_settings_fields_still_set_the_per_run_values() -> None:
    """The refusal names the settings fields; they do what ``--set lr`` could not."""
    _, runs = get_experiment("ib_joint").resolve("cpu", ["sgd_lr=0.5", "seeds=1"])
    lrs = {r.config.label: r.config.lr for r in runs}
    assert lrs["sgd"] == 0.5 and lrs["adam"] == 0.01


@pytest.mark.parametrize(("override", "control"), [("lr=0.5", "lr_range"),
                                                   ("weight_decay=0.9", "wd_range")])
def test_a_setting_the_runs_draw_per_run_is_refused(override: str, control: str) -> None:
    """hr_norm_vs_blowup draws each run's lr and weight_decay from lr_range / wd_range: its
    inherited ``lr`` and ``weight_decay`` settings would be recorded but change no run (D3)."""
    key = override.split("=")[0]
    with pytest.raises(ValueError) as err:
        get_experiment("hr_norm_vs_blowup").resolve("cpu", [override])
    text = str(err.value)
    assert text.startswith(f"--set {override}: hr_norm_vs_blowup sets {key} per run from other "
                           "settings (")
    assert f"would be recorded but change no run; set it through {control} (" in text
    _, runs = get_experiment("hr_norm_vs_blowup").resolve("cpu", ["lr_range=[1e-4,2e-4]"])
    assert all(1e-4 <= r.config.lr <= 2e-4 for r in runs)  # the range is what sets them


def test_a_trainer_check_refuses_before_the_directory_exists(tmp_path: Path) -> None:
    """A combination only the trainer checks (train_size < 2^n) fails before run_experiment
    creates or locks the experiment directory (D4)."""
    out = tmp_path / "exp"
    with pytest.raises(ValueError,
                       match=r"train_size=32 leaves no held-out.*2\^n = 16.*train_sizes"):
        run_experiment("hr_random_functions", out, overrides=["n=4"], log=lambda _: None)
    assert not out.exists()
