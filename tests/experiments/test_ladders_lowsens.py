"""The scale ladders of the vision and language comparisons (issue 17, item 4): data only, checked
without training. For every laddered experiment: the first rung is the CPU scale unchanged, the
rungs are ordered by size, every rung resolves with the CPU scale's seed count, the last rung is
the paper scale on a GPU, and a rung that trains the paper's own architecture lists exactly the
run-configuration fields in which it still differs from the paper scale, each with a reason.
Also: ``language_sst2`` (SST-2 standing in for QQP) is registered, its two scales are what its
docstring says, and a tiny end-to-end run on an SST-2-format fixture writes a verdict."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from senslab.experiments import get_experiment, list_experiments, run_experiment
from senslab.experiments.base import Rung, ladder_differences
from senslab.experiments.lowsens.language import MODELS, PAPER_EPOCHS, VARIANCE
from senslab.experiments.lowsens.sharpness import reuse_candidates
from senslab.verdicts import WORDS


@pytest.fixture(autouse=True, scope="module")
def mnist_checked_once() -> Iterator[None]:
    """demo's runs look for MNIST (loading its test set) every time they are resolved: once is
    enough here."""
    from senslab.experiments import demo

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo, "mnist_available", functools.lru_cache(demo.mnist_available))
        yield


#: the experiments of this file (mnist_binary's ladder is the worked example, checked the same way)
LADDERED = ("mnist_binary", "demo", "fashion_mnist", "robustness", "sharpness", "language_mrpc",
            "language_rotten_tomatoes", "language_sst2")
#: those whose ladder has a rung with the paper's own architecture (a "full" ladder)
FULL = ("mnist_binary", "language_sst2")


@pytest.mark.parametrize("name", LADDERED)
def test_ladder_starts_at_the_cpu_scale_and_ends_at_the_paper_scale(name: str) -> None:
    exp = get_experiment(name)
    ladder = exp.ladder
    assert len(ladder) >= 3, "cpu, at least one more CPU rung, the paper scale"
    assert all(isinstance(r, Rung) for r in ladder)
    names = [r.name for r in ladder]
    assert len(set(names)) == len(names)
    first, last = ladder[0], ladder[-1]
    assert (first.name, first.scale, first.overrides, first.cpu) == ("cpu", "cpu", (), True)
    assert (last.name, last.scale, last.overrides, last.cpu) == ("paper", "paper", (), False)
    assert ladder_differences(exp, last) == {}  # the paper rung is the paper scale
    assert [r.cpu for r in ladder[:-1]] == [True] * (len(ladder) - 1)
    assert sum(r.cpu for r in ladder) >= 2
    sizes = [r.size for r in ladder]
    assert all(s > 0 for s in sizes) and sizes == sorted(sizes), sizes
    assert all(r.note for r in ladder)


@pytest.mark.parametrize("name", LADDERED)
def test_every_rung_resolves_with_the_cpu_scales_seeds(name: str) -> None:
    exp = get_experiment(name)
    seeds = exp.settings("cpu").seeds
    assert seeds >= 3
    cpu_runs = [r.name for r in exp.resolve("cpu")[1]]
    for rung in exp.ladder:
        settings, runs = exp.resolve(rung.scale, list(rung.overrides))
        assert settings.seeds == seeds, rung.name
        assert runs and {r.info.get("seed") for r in runs} == set(range(seeds)), rung.name
        if rung.cpu:  # a CPU rung trains the CPU scale's runs, with other settings
            assert [r.name for r in runs] == cpu_runs, rung.name
        assert rung.command(name, f"runs/ladder/{name}/{rung.name}").startswith(
            f"senslab run {name} --scale {rung.scale}")
    # the cpu rung is the CPU scale itself: its runs' configurations are the CPU scale's
    assert exp.configs("cpu", list(exp.ladder[0].overrides)) == exp.configs("cpu")


@pytest.mark.parametrize("name", LADDERED)
def test_paper_arch_rungs_list_every_difference_from_the_paper_scale(name: str) -> None:
    exp = get_experiment(name)
    top = [r for r in exp.ladder if r.paper_arch]
    if name in FULL:
        assert len(top) == 1 and top[0].cpu
        assert top[0] is max((r for r in exp.ladder if r.cpu), key=lambda r: r.size)
    else:
        assert not top
    for rung in top:
        keys = [k for k, _ in rung.differs]
        assert len(set(keys)) == len(keys)
        assert set(ladder_differences(exp, rung)) == set(keys)
        assert all(reason.strip() for _, reason in rung.differs)
        # the paper's own models: no model field differs
        assert not any(k.startswith("model.") or k == "runs" for k in keys)
    for rung in exp.ladder:
        if not rung.paper_arch:
            assert not rung.differs


def test_sharpness_rungs_pair_with_robustness_rungs() -> None:
    rob, sharp = get_experiment("robustness"), get_experiment("sharpness")
    assert [(r.name, r.scale, r.overrides) for r in sharp.ladder] == [
        (r.name, r.scale, r.overrides) for r in rob.ladder]
    for rung in sharp.ladder:  # each sharpness run is the same-named robustness run
        mine = {r.name: r.config for r in sharp.resolve(rung.scale, list(rung.overrides))[1]}
        theirs = {r.name: r.config for r in rob.resolve(rung.scale, list(rung.overrides))[1]}
        assert set(mine) <= set(theirs)
        assert all(mine[k] == theirs[k] for k in mine), rung.name
    # a ladder rung L/sharpness/<rung>/<run> looks in L/robustness/<rung>/<run>
    path = Path("runs/ladder/sharpness/plateau/vit_small-noise")
    assert reuse_candidates(path) == (
        Path("runs/ladder/sharpness/robustness/vit_small-noise"),
        Path("runs/ladder/robustness/plateau/vit_small-noise"))
    assert reuse_candidates(Path("runs/sharpness/vit_small"))[0] == Path(
        "runs/robustness/vit_small")


def test_the_rungs_change_what_their_docstrings_say() -> None:
    """Spot checks of the resolved run configurations of each CPU rung above ``cpu``."""
    def by_name(name: str, rung: str) -> dict[str, object]:
        exp = get_experiment(name)
        r = next(r for r in exp.ladder if r.name == rung)
        return {run.name: run.config for run in exp.resolve(r.scale, list(r.overrides))[1]}

    demo = by_name("demo", "full-data")
    assert all(c.data.train_subset is None and c.train.target_train_acc == 0.97
               for c in demo.values())
    assert demo["vit_small"].model.overrides["depth"] == 4  # the small models
    fm = by_name("fashion_mnist", "full-data")
    assert all(c.data.train_subset is None and c.train.target_train_acc == 0.85
               and c.train.epochs == 12 for c in fm.values())
    assert fm["vit_small"].model.overrides["depth"] == 2
    for name in ("robustness", "sharpness"):
        longer, plateau = by_name(name, "longer"), by_name(name, "plateau")
        assert all(c.train.epochs == 40 and c.train.target_train_acc == 0.85
                   and c.data.train_subset == 3000 for c in longer.values())
        assert all(c.train.epochs == 60 and c.train.target_train_acc == 0.9
                   for c in plateau.values())
    for name in ("language_mrpc", "language_rotten_tomatoes", "language_sst2"):
        wide = by_name(name, "wide")
        assert all(c.model.overrides == {"layers": 4, "dim": 128, "heads": 4, "dropout": 0.1}
                   for c in wide.values())
        cpu = by_name(name, "cpu")
        assert all(wide[k].data.train_subset == cpu[k].data.train_subset
                   and wide[k].optim.lr == cpu[k].optim.lr for k in cpu)
    top = by_name("language_sst2", "paper-arch")
    paper = {r.name: r.config for r in get_experiment("language_sst2").resolve("paper")[1]}
    assert all(c.model.overrides == paper[k].model.overrides for k, c in top.items())
    assert all(c.train.target_train_acc == 0.97 and c.train.epochs == 8
               and c.optim.lr == 3e-4 for c in top.values())


# --------------------------------------------------------------------------- language_sst2

def test_sst2_is_registered_with_both_scales() -> None:
    assert "language_sst2" in list_experiments()
    exp = get_experiment("language_sst2")
    assert exp.claim and exp.paper and exp.cpu_scale_note and exp.seed_aware
    assert "sst2" in exp.requires.lower()
    paper = exp.configs("paper")
    assert [c.model.name for c in paper] == list(MODELS) * 3
    assert [c.seed for c in paper] == [0] * 4 + [1] * 4 + [2] * 4
    for c in paper:
        assert c.data.name == "sst2" and c.data.train_subset is None
        assert c.model.overrides == {"layers": 4, "dim": 256, "heads": 8, "dropout": 0.1}
        assert (c.optim.name, c.optim.lr, c.optim.weight_decay) == ("adamw", 1e-4, 1e-4)
        assert c.train.batch_size == 32 and c.data.options["max_len"] == 128
        assert c.train.epochs == PAPER_EPOCHS["sst2"] and c.train.target_train_acc is None
        assert (c.track.num_examples, c.track.repeats) == (1000, 3)
        assert math.isclose(c.track.sigma ** 2, VARIANCE) and c.track.val
    cpu = exp.configs("cpu")
    assert [c.seed for c in cpu] == [0] * 4 + [1] * 4 + [2] * 4
    for c in cpu:
        assert c.data.name == "sst2" and c.data.train_subset == 3000
        assert c.model.overrides == {"layers": 2, "dim": 64, "heads": 4, "dropout": 0.1}
        assert c.optim.lr == 1e-3 and c.data.options["max_len"] == 64
        assert c.train.target_train_acc == 0.97 and c.train.epochs == 10


_WORDS = "a fine film the plot was dull great acting boring script loved it hated every minute"


def write_sst2_fixture(root: Path, n_train: int = 24, n_dev: int = 8) -> None:
    """GLUE-format SST-2 files (``sentence<TAB>label`` with a header)."""
    words = _WORDS.split()
    root.mkdir(parents=True)
    for file, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        rows = [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(3 + i % 6))
                + f"\t{i % 2}" for i in range(n)]
        (root / file).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")


TINY = ["layers=1", "dim=16", "heads=2", "max_len=24", "epochs=1", "seeds=2", "train_subset=20",
        "track_examples=6", "data.options.vocab_size=300"]


@pytest.mark.heavy
def test_sst2_tiny_end_to_end_on_a_fixture(tmp_path: Path) -> None:
    data = tmp_path / "sst2"
    write_sst2_fixture(data)
    out = tmp_path / "exp"
    verdict = run_experiment("language_sst2", out, overrides=[f"data.root={data}", *TINY],
                             progress=False, log=lambda _: None)
    on_disk = json.loads((out / "verdict.json").read_text())
    assert on_disk["verdict"] == verdict["verdict"] in WORDS
    exp = json.loads((out / "experiment.json").read_text())
    assert exp["name"] == "language_sst2" and len(exp["runs"]) == 8
    cfg = json.loads((out / "roberta-s1" / "config.json").read_text())
    assert cfg["data"]["name"] == "sst2" and cfg["seed"] == 1
    assert cfg["data"]["root"] == str(data)
    summary = json.loads((out / "lstm" / "summary.json").read_text())
    assert 0.0 <= summary["final"]["sens_end/train"] <= 1.0
