"""Scale ladders of the Hahn & Rofin and implicit-bias experiments: their specs (no training)."""

from __future__ import annotations

import pytest

from senslab.experiments import get_experiment
from senslab.experiments.base import ladder_differences

LADDERED = ("hr_parity_dynamics", "hr_norm_vs_blowup", "ib_joint", "ib_vit_mnist", "ib_text")


@pytest.mark.parametrize("name", LADDERED)
def test_ladder_starts_at_the_cpu_scale_and_ends_at_the_paper_scale(name: str) -> None:
    exp = get_experiment(name)
    ladder = exp.ladder
    assert len(ladder) >= 3  # cpu, at least one CPU rung towards the paper, paper
    names = [r.name for r in ladder]
    assert len(set(names)) == len(names)
    first, last = ladder[0], ladder[-1]
    assert (first.name, first.scale, first.overrides, first.cpu) == ("cpu", "cpu", (), True)
    assert (last.name, last.scale, last.overrides, last.cpu) == ("paper", "paper", (), False)
    assert all(r.cpu for r in ladder[:-1])
    sizes = [r.size for r in ladder]
    assert all(s > 0 for s in sizes) and sizes == sorted(sizes)
    assert all(r.note for r in ladder)


@pytest.mark.parametrize("name", LADDERED)
def test_every_rung_resolves_with_the_cpu_scale_seeds(name: str) -> None:
    exp = get_experiment(name)
    cpu_settings, cpu_runs = exp.resolve("cpu")
    paper_seeds = exp.settings("paper").seeds
    for rung in exp.ladder:
        settings, runs = exp.resolve(rung.scale, list(rung.overrides))
        assert runs
        if rung.cpu:  # the CPU rungs keep the CPU scale's seeds (and the rung's runs)
            assert settings.seeds == cpu_settings.seeds
        else:  # the paper rung is the paper scale: never fewer seeds than the CPU scale
            assert settings.seeds == paper_seeds >= cpu_settings.seeds
    # the first rung is the CPU scale unchanged: the same runs, the same configurations
    _, first = exp.resolve("cpu", list(exp.ladder[0].overrides))
    assert [(r.name, r.config) for r in first] == [(r.name, r.config) for r in cpu_runs]


@pytest.mark.parametrize("name", LADDERED)
def test_paper_arch_rungs_list_exactly_their_differences(name: str) -> None:
    exp = get_experiment(name)
    for rung in exp.ladder:
        if rung.paper_arch:
            assert rung.cpu and rung.differs
            assert all(reason for _, reason in rung.differs)
            assert set(ladder_differences(exp, rung)) == {k for k, _ in rung.differs}
        else:
            assert not rung.differs
    assert ladder_differences(exp, exp.ladder[-1]) == {}  # the paper rung is the paper scale


def _rung(name: str, rung: str) -> list:
    exp = get_experiment(name)
    r = next(r for r in exp.ladder if r.name == rung)
    return exp.resolve(r.scale, list(r.overrides))[1]


def test_hr_parity_dynamics_rungs_train_longer_then_wider() -> None:
    cpu, longer, wide = (_rung("hr_parity_dynamics", r) for r in ("cpu", "longer", "wide"))
    assert [r.name for r in cpu] == [r.name for r in longer] == [r.name for r in wide]
    assert {r.config.steps for r in cpu} == {3000}
    assert {r.config.steps for r in longer} == {r.config.steps for r in wide} == {9000}
    assert {r.config.dim for r in longer} == {32} and {r.config.dim for r in wide} == {128}
    for a, b in zip(cpu, wide, strict=True):  # nothing else changes: same task, batch, evaluations
        for key in ("n", "batch", "lr", "weight_decay", "eval_every", "eval_size", "sharp_draws",
                    "init", "seed"):
            assert getattr(a.config, key) == getattr(b.config, key), key


def test_hr_parity_dynamics_sizes_are_parameter_counts() -> None:
    from senslab.models import create_model

    exp = get_experiment("hr_parity_dynamics")
    for rung in exp.ladder:
        c = exp.resolve(rung.scale, list(rung.overrides))[1][0].config
        model = create_model("boolean_transformer", n_bits=c.n, dim=c.dim, ff_dim=c.dim,
                             layers=c.layers, heads=c.heads, init=c.init)
        assert rung.size == sum(p.numel() for p in model.parameters()), rung.name


def test_hr_norm_vs_blowup_larger_sweep_extends_the_cpu_sweep() -> None:
    cpu, sweep, longer = (_rung("hr_norm_vs_blowup", r) for r in ("cpu", "sweep", "longer"))
    assert (len(cpu), len(sweep), len(longer)) == (12, 96, 96)
    # the first 12 points are the CPU scale's: the same names, functions, n, lr, wd and seeds
    assert [(r.name, r.config) for r in sweep[:12]] == [(r.name, r.config) for r in cpu]
    assert {r.config.steps for r in sweep} == {1200} and {r.config.steps for r in longer} == {2400}
    assert [r.name for r in sweep] == [r.name for r in longer]


@pytest.mark.parametrize(("name", "field", "values"), [
    ("ib_joint", "steps", {"cpu": 3000, "longer": 10_000, "paper-steps": 20_000,
                           "paper": 20_000}),
])
def test_ib_joint_rungs_only_train_longer(name: str, field: str, values: dict) -> None:
    cpu = _rung(name, "cpu")
    for rung, steps in values.items():
        runs = _rung(name, rung)
        assert {getattr(r.config, field) for r in runs} == {steps}
        if rung != "paper":  # same runs; apart from the steps, the same configurations
            assert [r.name for r in runs] == [r.name for r in cpu]
            for a, b in zip(cpu, runs, strict=True):
                assert a.config.data == b.config.data and a.config.lr == b.config.lr


@pytest.mark.parametrize(("name", "steps_per_epoch", "epochs"), [
    ("ib_vit_mnist", 50, {"cpu": 4, "longer": 20}),  # 5,000 images, batch 100
    ("ib_text", 63, {"cpu": 10, "longer": 50}),  # 2,000 snippets, batch 32
])
def test_loss_races_train_the_same_subset_longer(name: str, steps_per_epoch: int,
                                                 epochs: dict) -> None:
    exp = get_experiment(name)
    cpu = _rung(name, "cpu")
    for rung in exp.ladder[:-1]:
        runs = _rung(name, rung.name)
        assert {r.config.train.epochs for r in runs} == {epochs[rung.name]}
        assert rung.size == epochs[rung.name] * steps_per_epoch  # size: training steps per run
        assert [r.name for r in runs] == [r.name for r in cpu]
        for a, b in zip(cpu, runs, strict=True):  # the same model, subset and optimiser
            assert a.config.model == b.config.model and a.config.optim == b.config.optim
            assert a.config.data == b.config.data and a.config.track == b.config.track


@pytest.mark.parametrize("name", LADDERED)
def test_cpu_and_paper_scales_are_unchanged_by_the_ladder(name: str) -> None:
    """The ladders are data on top of the scales: key fields of both scales as before."""
    exp = get_experiment(name)
    expected = {
        "hr_parity_dynamics": {"cpu": ("steps", 3000, "dim", 32, "n", 8, 3),
                               "paper": ("steps", 20_000, "dim", 128, "n", 25, 101)},
        "hr_norm_vs_blowup": {"cpu": ("steps", 1200, "dim", 32, "batch", 256, 12),
                              "paper": ("steps", 10_000, "dim", 128, "batch", 1024, 2000)},
        "ib_joint": {"cpu": ("steps", 3000, "batch_size", 8, "lr", 0.1, 12),
                     "paper": ("steps", 20_000, "batch_size", 8, "lr", 0.1, 20)},
    }
    if name in expected:
        for scale, (k1, v1, k2, v2, k3, v3, count) in expected[name].items():
            configs = exp.configs(scale)
            assert len(configs) == count
            c = configs[0]
            assert (getattr(c, k1), getattr(c, k2), getattr(c, k3)) == (v1, v2, v3)
    else:
        for scale, epochs, count in (("cpu", 4 if name == "ib_vit_mnist" else 10, 12),
                                     ("paper", 20 if name == "ib_vit_mnist" else 10, 12)):
            configs = exp.configs(scale)
            assert len(configs) == count
            assert {c.train.epochs for c in configs} == {epochs}
