"""Smoke runs of the small-model low-sensitivity experiments at tiny sizes, and their verdicts on
hand-made summaries of several runs (one per outcome: supported, contradicted, inconclusive with
the smallest detectable effect, not comparable)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment, list_experiments
from senslab.experiments.lowsens.synthetic import sparse_frequent_verdict
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_COMPARABLE, SUPPORTED, WORDS


def _quiet(_: str) -> None:
    pass


def _check_run_dirs(out: Path, keys: set[str]) -> list[dict[str, Any]]:
    """Every run listed in experiment.json has config/env/metrics/summary with ``keys``."""
    exp = json.loads((out / "experiment.json").read_text())
    records = []
    for name in exp["runs"]:
        run = out / name
        for f in ("config.json", "env.json", "metrics.jsonl", "summary.json"):
            assert (run / f).exists(), f"{name}/{f} missing"
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert lines, f"{name} logged nothing"
        for rec in lines:
            assert {"step", "epoch", "time"} <= rec.keys()
            assert keys <= rec.keys(), f"{name} lacks {keys - rec.keys()}"
        steps = [r["step"] for r in lines]
        assert steps == sorted(steps)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["name"] == name and summary["label"]
        assert json.loads((run / "config.json").read_text())["seed"] == 0
        records.append(summary)
    return records


def test_registered() -> None:
    names = set(list_experiments())
    assert {"synthetic_sparse_frequent", "grokking", "sparse_parity"} <= names
    assert get_experiment("synthetic_sparse_frequent").cpu_scale_note


def test_runs_are_data_for_their_trainer_with_seed_replicates() -> None:
    """Each experiment's runs name their trainer and carry the settings; ``seeds`` adds
    replicates at seed + k (names unchanged for k = 0), ``only`` still selects by name/index."""
    runs = get_experiment("synthetic_sparse_frequent").resolve(
        "cpu", ["only=case2-s1", "seeds=2", "epochs=7", "lr=0.25"])[1]
    assert [(r.name, r.trainer, r.config.case, r.config.setting, r.config.seed,
             r.config.epochs, r.config.lr) for r in runs] == [
        ("case2-s1", "sparse_frequent", 2, 1, 0, 7, 0.25),
        ("case2-s1-s1", "sparse_frequent", 2, 1, 1, 7, 0.25)]
    grok = get_experiment("grokking").resolve("cpu", ["seeds=2", "seed=3", "p=31"])[1]
    assert [(r.name, r.trainer, r.config.seed, r.config.p) for r in grok] == [
        ("modadd-p31-s3", "grokking", 3, 31), ("modadd-p31-s4", "grokking", 4, 31)]
    parity = get_experiment("sparse_parity").resolve("cpu", ["only=1,4", "train_size=64"])[1]
    assert [(r.name, r.trainer, r.config.train_size, r.config.width, r.config.seed)
            for r in parity] == [("r1-n64-b32-w32-lr0.001-s1", "sparse_parity", 64, 32, 1),
                                 ("r4-n64-b32-w64-lr0.001-s0", "sparse_parity", 64, 64, 0)]
    assert parity[0].config.n_bits == 10  # the cpu scale's, from the settings


# --------------------------------------------------------------------------- synthetic
SF_TINY = ["epochs=3", "train_size=200", "test_size=200", "eval_every=1", "sens_examples=32",
           "only=case1-s0,case2-s2"]


def test_synthetic_smoke_and_resume(tmp_path: Path) -> None:
    exp = get_experiment("synthetic_sparse_frequent")
    summaries = exp.execute(tmp_path, "cpu", SF_TINY, False, _quiet)
    assert [s["name"] for s in summaries] == ["case1-s0", "case2-s2"]
    keys = {"train/loss", "train/acc", "test/acc", "ood/acc", "sens/train", "sens/train_se",
            "align/sparse", "align/frequent", "align/irrelevant", "attn/sparse",
            "attn/frequent", "attn/irrelevant"}
    _check_run_dirs(tmp_path, keys)
    for s in summaries:
        f = s["final"]
        assert abs(f["attn/sparse"] + f["attn/frequent"] + f["attn/irrelevant"] - 1) < 1e-4
        assert 0.0 <= f["sens/train"] <= 1.0
        assert f["solution/sparse"] != f["solution/frequent"]
    # even three short epochs separate the cases: the OOD set fools case 1 only
    assert summaries[0]["final"]["ood/acc"] < 0.5 < summaries[1]["final"]["ood/acc"]
    v = exp.verdict(summaries)
    assert v["verdict"] in WORDS and set(v["evidence"]) == {"case1-s0", "case2-s2"}
    # a second call reuses the finished runs instead of retraining them
    stamp = (tmp_path / "case1-s0" / "metrics.jsonl").stat().st_mtime_ns
    again = exp.execute(tmp_path, "cpu", SF_TINY, False, _quiet)
    assert again == summaries
    assert (tmp_path / "case1-s0" / "metrics.jsonl").stat().st_mtime_ns == stamp


def test_synthetic_rejects_unknown_run_and_key(tmp_path: Path) -> None:
    exp = get_experiment("synthetic_sparse_frequent")
    with pytest.raises(ValueError, match="case1-s0"):
        exp.execute(tmp_path, "cpu", ["only=case3-s0"], False, _quiet)
    with pytest.raises(KeyError, match="epochs"):
        exp.execute(tmp_path, "cpu", ["epoch=3"], False, _quiet)


def _sf(name: str, case: int, ood: float, a_s: float, a_f: float, train: float = 1.0,
        sol: tuple[float, float] | None = None) -> dict[str, Any]:
    sol = sol or ((0.05, 0.3) if case == 1 else (0.06, 0.0))
    return {"name": name, "label": name, "case": case, "ood_size": 1000, "final": {
        "train/acc": train, "ood/acc": ood, "align/sparse": a_s, "align/frequent": a_f,
        "attn/sparse": 0.1, "attn/frequent": 0.5, "sens/train": 0.05,
        "solution/sparse": sol[0], "solution/frequent": sol[1]}}


def _cases(ood1: list[float], ood2: list[float], align: float = 0.6) -> list[dict[str, Any]]:
    """One run per setting of each case; ``align``: how far the aligned feature leads."""
    runs = [_sf(f"case1-s{i}", 1, o, 0.3 + align + 0.05 * i, 0.3) for i, o in enumerate(ood1)]
    return runs + [_sf(f"case2-s{i}", 2, o, 0.2, 0.2 + align + 0.03 * i)
                   for i, o in enumerate(ood2)]


def test_synthetic_verdict_outcomes() -> None:
    good = _cases([0.02, 0.05, 0.01], [0.99, 0.97, 0.98])
    v = sparse_frequent_verdict(good)
    assert v["verdict"] == SUPPORTED and v["correction"] == "Holm over 4 parts"
    assert set(v["effects"]) == {"case 1 OOD collapses", "case 1 aligns with sparse",
                                 "case 2 OOD kept", "case 2 aligns with frequent"}
    part = v["effects"]["case 1 OOD collapses"]  # 0.5 − OOD acc over the three case-1 runs
    assert part["effect"] == pytest.approx(0.5 - 0.08 / 3) and part["df"] == 2
    # case 2 models relying on the sparse tokens: OOD collapses where it should not
    bad = [*good[:3], *(_sf(f"case2-s{i}", 2, o, 0.9, 0.2) for i, o in enumerate((0.1, 0.15,
                                                                                  0.12)))]
    out = sparse_frequent_verdict(bad)
    assert out["verdict"] == CONTRADICTED
    assert out["effects"]["case 2 OOD kept"]["verdict"] == CONTRADICTED
    assert out["effects"]["case 1 OOD collapses"]["verdict"] == SUPPORTED
    # one case-2 setting collapses, two do not: the mean cannot be told from the threshold
    mixed = sparse_frequent_verdict(_cases([0.02, 0.05, 0.01], [0.99, 0.1, 0.98]))
    kept = mixed["effects"]["case 2 OOD kept"]
    assert mixed["verdict"] == INCONCLUSIVE and kept["verdict"] == INCONCLUSIVE
    assert kept["detectable"] > abs(kept["effect"]) and "could detect" in mixed["reason"]
    # an untrained run or a missing case cannot be judged
    untrained = [*good[:5], _sf("case2-s2", 2, 0.99, 0.2, 0.9, train=0.6)]
    assert sparse_frequent_verdict(untrained)["verdict"] == NOT_COMPARABLE
    assert sparse_frequent_verdict(good[:3])["verdict"] == NOT_COMPARABLE
    # a setting whose designed low-sensitivity feature is not the less sensitive one
    swapped = [_sf("case1-s0", 1, 0.02, 0.9, 0.3, sol=(0.3, 0.05)), *good[1:]]
    assert sparse_frequent_verdict(swapped)["verdict"] == NOT_COMPARABLE


# --------------------------------------------------------------------------- grokking
GROK_TINY = ["p=11", "dim=16", "heads=2", "mlp_dim=32", "epochs=6", "eval_every=2",
             "sens_examples=20", "lr=0.01", "weight_decay=1.0", "seeds=1"]


def test_grokking_smoke(tmp_path: Path) -> None:
    exp = get_experiment("grokking")
    summaries = exp.execute(tmp_path, "cpu", GROK_TINY, False, _quiet)
    keys = {"train/loss", "train/acc", "test/loss", "test/acc", "sens/train", "sens/train_se",
            "weight_norm"}
    (summary,) = _check_run_dirs(tmp_path, keys)
    assert summary == summaries[0] and summary["epochs"] == 6
    lines = (tmp_path / summary["name"] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [0, 2, 4, 6]
    ph = summary["phases"]
    assert ph["sens_start"] == json.loads(lines[0])["sens/train"]
    assert ph["weight_norm_final"] == summary["final"]["weight_norm"] > 0
    # six epochs cannot generalise on held-out sums: the verdict must refuse to judge
    assert ph["generalisation_epoch"] is None
    v = exp.verdict(summaries)
    assert v["verdict"] == "not comparable" and "epoch 6" in v["reason"]


def _history(sens: list[float], train: list[float], test: list[float]) -> list[dict[str, Any]]:
    return [{"epoch": 10 * i, "sens/train": s, "train/acc": a, "test/acc": b, "weight_norm": 1.0}
            for i, (s, a, b) in enumerate(zip(sens, train, test, strict=True))]


TRAIN = [0.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
TEST = [0.0, 0.01, 0.01, 0.02, 0.1, 0.6, 0.97]


def _grok(name: str, sens: list[float], scale: float = 1.0) -> dict[str, Any]:
    """A run whose sensitivity after its peak (epoch 20) is ``sens``'s times ``scale``."""
    from senslab.train.loops.grokking import grokking_phases

    curve = sens[:3] + [v * scale for v in sens[3:]]
    return {"name": name, "epochs": 60, "final": {"test/acc": 0.97},
            "phases": grokking_phases(_history(curve, TRAIN, TEST))}


FALLS = [0.15, 0.03, 0.09, 0.05, 0.02, 0.015, 0.01]
FLAT = [0.15, 0.03, 0.09, 0.09, 0.08, 0.08, 0.07]


def test_grokking_phases_and_verdict() -> None:
    from senslab.experiments.lowsens.grokking import grokking_verdict
    from senslab.train.loops.grokking import grokking_phases

    falls = grokking_phases(_history(FALLS, TRAIN, TEST))
    assert (falls["memorisation_epoch"], falls["generalisation_epoch"]) == (10, 60)
    assert (falls["sens_peak"], falls["peak_epoch"]) == (0.09, 20)
    assert falls["jump_epoch"] == 50 and falls["sens_before_jump"] == 0.02
    # three seeds: each part is the threshold − the ratio, Student's t over seeds
    seeds = [_grok(f"s{k}", FALLS, c) for k, c in enumerate((1.0, 1.3, 0.8))]
    v = grokking_verdict(seeds)
    assert v["verdict"] == SUPPORTED and v["correction"] == "Holm over 2 parts"
    gen = v["effects"]["low at generalisation"]
    assert gen["effect"] == pytest.approx(0.5 - 0.01 * (1.0 + 1.3 + 0.8) / 3 / 0.09)
    assert gen["seeds"] == 3 and gen["df"] == 2
    # one seed: a ratio has no measurement error, so nothing to decide it with
    one = grokking_verdict(seeds[:1])
    assert one["verdict"] == INCONCLUSIVE and "no uncertainty estimate" in one["reason"]
    flat = [_grok(f"s{k}", FLAT, c) for k, c in enumerate((1.0, 0.95, 1.05))]
    out = grokking_verdict(flat)
    assert out["verdict"] == CONTRADICTED
    assert out["effects"]["fallen before the jump"]["verdict"] == CONTRADICTED
    # falls in two seeds, stays flat in the third
    mixed = grokking_verdict([*seeds[:2], flat[0]])
    assert mixed["verdict"] == INCONCLUSIVE
    assert mixed["effects"]["low at generalisation"]["detectable"] > 0
    never = grokking_phases(_history([0.1] * 7, TRAIN, [0.0] * 7))
    assert never["generalisation_epoch"] is None
    out = grokking_verdict([*seeds[1:], {**seeds[0], "final": {"test/acc": 0.0},
                                         "phases": never}])
    assert out["verdict"] == NOT_COMPARABLE and "epoch 60" in out["reason"]
    zero = grokking_verdict([_grok("s0", [0.15, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])])
    assert zero["verdict"] == NOT_COMPARABLE and "peak 0" in zero["reason"]


# --------------------------------------------------------------------------- sparse parity
SP_TINY = ["only=0,5", "n_bits=6", "k=2", "epochs=2", "test_size=64", "bool_samples=16",
           "train_size=64"]


def test_sparse_parity_smoke(tmp_path: Path) -> None:
    from senslab.experiments.lowsens import sparse_parity as sp

    small = tuple(s._replace(train_size=64) for s in sp.SETTINGS)
    exp = get_experiment("sparse_parity")
    summaries = exp.execute(tmp_path, "cpu", SP_TINY, False, _quiet)
    assert [s["name"] for s in summaries] == [sp.run_name(0, small[0]), sp.run_name(5, small[5])]
    keys = {"train/loss", "train/acc", "test/loss", "test/acc", "bool_sens", "bool_sens_se",
            "bool_sens/relevant"}
    _check_run_dirs(tmp_path, keys)
    for s in summaries:
        f, pr = s["final"], s["progress"]
        assert 0.0 <= f["bool_sens/relevant"] <= f["bool_sens"] <= 6
        assert s["k"] == 2 and pr["sens_final"] == f["bool_sens"]
        steps = [json.loads(x)["step"] for x in
                 (tmp_path / s["name"] / "metrics.jsonl").read_text().splitlines()]
        batch = small[int(s["name"][1])].batch_size
        assert steps == [0, -(-64 // batch), 2 * -(-64 // batch)]  # ceil(64 / batch) per epoch
    assert exp.verdict(summaries)["verdict"] in WORDS
    with pytest.raises(ValueError, match="0..5"):
        exp.execute(tmp_path, "cpu", ["only=7"], False, _quiet)


def _sp(name: str, start: float, peak: float, final: float, acc: float,
        plateau: int = 5) -> dict[str, Any]:
    """A run whose plateau starts at ``start`` and stays at ``peak`` after it (s.e. 0.05 each)."""
    return {"name": name, "k": 3, "n_bits": 10, "progress": {
        "plateau_evals": plateau, "sens_start": start, "sens_start_se": 0.05,
        "sens_plateau_max": peak, "sens_plateau_max_se": 0.05, "plateau_max_test_acc": 0.5,
        "sens_final": final, "test_acc_final": acc},
        "plateau": {"epochs": list(range(plateau)), "sens": [start] + [peak] * (plateau - 1),
                    "se": [0.05] * plateau, "sens_final_se": 0.0, "bool_samples": 200}}


def test_sparse_parity_verdict_outcomes() -> None:
    from senslab.experiments.lowsens.sparse_parity import parity_verdict
    from senslab.train.loops.sparse_parity import parity_progress

    good = [_sp("a", 0.2, 2.5, 3.1, 1.0), _sp("b", 0.0, 1.0, 2.9, 0.99),
            _sp("c", 0.1, 2.0, 3.0, 1.0)]
    v = parity_verdict(good)
    assert v["verdict"] == SUPPORTED and v["correction"] == "Holm over 2 parts"
    rise = v["effects"]["rises on the plateau"]  # over the three runs, with measurement s.e.
    assert rise["effect"] == pytest.approx((2.3 + 1.0 + 1.9) / 3) and rise["df"] == 2
    assert rise["se_measure"] == pytest.approx(0.05 * 2**0.5 / 3**0.5)
    assert v["effects"]["converges to k"]["effect"] == pytest.approx(0.45 - 0.2 / 3)
    # one value per run, settings × seed replicates: the words count runs, not seeds
    assert "3 runs" in v["reason"] and "seeds" not in v["reason"]
    # no rise on the plateau, or a final sensitivity far from k, in every run
    flat = [_sp("a", 0.5, 0.1, 3.0, 1.0), _sp("b", 0.6, 0.2, 3.1, 1.0),
            _sp("c", 0.55, 0.1, 2.9, 1.0)]
    # (a fall of 0.1–0.15 with a measurement s.e. of 0.05 per value is inconclusive: the spread
    # over runs is floored at the measurement error)
    assert parity_verdict([_sp("a", 0.2, 0.1, 3.0, 1.0), _sp("b", 0.3, 0.2, 3.1, 1.0),
                           _sp("c", 0.25, 0.1, 2.9, 1.0)])["effects"]["rises on the plateau"][
        "verdict"] == INCONCLUSIVE
    out = parity_verdict(flat)
    assert out["verdict"] == CONTRADICTED
    assert out["effects"]["rises on the plateau"]["verdict"] == CONTRADICTED
    far = [_sp("a", 0.2, 2.0, 6.0, 1.0), _sp("b", 0.2, 2.1, 5.5, 1.0),
           _sp("c", 0.2, 1.9, 6.2, 1.0)]
    assert parity_verdict(far)["effects"]["converges to k"]["verdict"] == CONTRADICTED
    # one run ends far from k, two near it
    mixed = parity_verdict([*good[:2], far[0]])
    assert mixed["verdict"] == INCONCLUSIVE
    assert mixed["effects"]["converges to k"]["detectable"] > 0
    # runs that never learned cannot be judged
    assert parity_verdict([_sp("a", 0.2, 2.0, 3.0, 0.6), _sp("b", 0.2, 2.0, 3.0, 0.5)])[
        "verdict"] == NOT_COMPARABLE
    hist = [{"epoch": e, "test/acc": a, "bool_sens": s, "bool_sens_se": 0.1}
            for e, (a, s) in enumerate([(0.5, 0.1), (0.52, 1.5), (0.49, 2.0), (0.8, 3.5),
                                        (1.0, 3.0)])]
    pr = parity_progress(hist)
    assert pr["plateau_evals"] == 3 and pr["plateau_end_epoch"] == 3
    assert (pr["sens_plateau_max"], pr["sens_plateau_max_epoch"]) == (2.0, 2)
    assert pr["sens_final"] == 3.0 and pr["test_acc_final"] == 1.0
