"""The verdict-rule corrections of 2026-11-30 (audit findings F1–F4, F11): each test feeds the
real verdict code a case the old rule judged wrongly."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from senslab.experiments import get_experiment, load_summaries
from senslab.experiments.base import Run
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_COMPARABLE, SUPPORTED


def _quiet(_: str) -> None:
    pass


def _write_run(path: Path, history: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    path.mkdir(parents=True)
    lines = [json.dumps({"step": i, "time": 0.0, **r}) for i, r in enumerate(history)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "summary.json").write_text(json.dumps(summary))


# --------------------------------------------------------------------------- F1 sparse parity
def _parity_runs(tmp_path: Path, plateau: list[list[float]], se: float) -> list[dict[str, Any]]:
    """One finished run per plateau curve (test acc 0.5 on it), then two learned evaluations at
    sensitivity k = 3; summaries as the experiment hands them to the verdict (after_run)."""
    from senslab.train.loops.sparse_parity import SparseParityRun, parity_progress

    exp = get_experiment("sparse_parity")
    out = []
    for i, curve in enumerate(plateau):
        hist = [{"epoch": e, "test/acc": 0.5, "bool_sens": s, "bool_sens_se": se}
                for e, s in enumerate(curve)]
        hist += [{"epoch": len(curve) + j, "test/acc": 1.0, "bool_sens": 3.0,
                  "bool_sens_se": 0.0} for j in range(2)]
        name = f"r{i}"
        summary = {"name": name, "k": 3, "n_bits": 10, "progress": parity_progress(hist)}
        _write_run(tmp_path / name, hist, summary)
        cfg = SparseParityRun(name=name, n_bits=10, k=3, bool_samples=200)
        out.append(exp.after_run(Run(name, cfg, trainer="sparse_parity"), tmp_path / name,
                                 summary, None, _quiet))
    return out


def test_sparse_parity_flat_noisy_plateau_is_not_a_rise(tmp_path: Path) -> None:
    # the audit's probe 1c: a flat plateau at 3.0 with ±0.3 evaluation-to-evaluation jitter and
    # a measurement s.e. of 0.07; the old rule (plateau max − start) called it "supported"
    rng = random.Random(1)
    flat = [[3.0] + [3.0 + rng.uniform(-0.3, 0.3) for _ in range(7)] for _ in range(6)]
    v = get_experiment("sparse_parity").verdict(_parity_runs(tmp_path, flat, 0.07))
    rise = v["effects"]["rises on the plateau"]
    assert rise["verdict"] != SUPPORTED and v["verdict"] != SUPPORTED
    assert abs(rise["effect"]) < 0.2  # no max-of-noise bias: the later plateau minus the start


def test_sparse_parity_plateau_that_only_falls_is_contradicted(tmp_path: Path) -> None:
    # falls from 3.0 to ≈ 2.0 on the plateau, with one noisy evaluation above the start: the
    # old rule's max − start was ≥ 0 by construction and could never say contradicted
    curves = [[3.0, 3.2 + 0.01 * i, 2.0, 2.1, 1.9, 2.0, 2.05] for i in range(4)]
    v = get_experiment("sparse_parity").verdict(_parity_runs(tmp_path, curves, 0.05))
    assert v["effects"]["rises on the plateau"]["verdict"] == CONTRADICTED


def test_sparse_parity_rising_plateau_is_supported_and_final_has_an_error(
        tmp_path: Path) -> None:
    curves = [[0.2 + 0.01 * i, 0.5, 1.0, 1.6, 2.0 + 0.05 * i, 2.3] for i in range(4)]
    v = get_experiment("sparse_parity").verdict(_parity_runs(tmp_path, curves, 0.05))
    rise = v["effects"]["rises on the plateau"]
    assert v["verdict"] == SUPPORTED
    # the later half of the five evaluations after the start: epochs 3–5
    assert rise["effect"] == pytest.approx(sum((1.6 + 2.0 + 0.05 * i + 2.3) / 3 - 0.2 - 0.01 * i
                                               for i in range(4)) / 4)
    # every run ends exactly at k with sample s.e. 0: the interval still has a width (n/m)
    close = v["effects"]["converges to k"]
    assert close["se"] > 0 and close["interval"][1] - close["interval"][0] > 0
    assert close["se_measure"] == pytest.approx(math.sqrt(4 * (10 / 200) ** 2) / 4)
    # after_run cached the curve in summary.json
    assert "plateau" in json.loads((tmp_path / "r0" / "summary.json").read_text())


# --------------------------------------------------------------------------- F2 grokking
def _grok_history(spike_after_jump: bool) -> list[dict[str, Any]]:
    """The audit's probe 3: memorised at epoch 10, sensitivity flat at 0.02 up to the jump
    (test acc 0.6 from epoch 40) and 0.20 at epoch 45, generalised (0.97) at epoch 50."""
    h = []
    for e in range(60):
        tr = 1.0 if e >= 10 else 0.5
        te = 0.1 if e < 40 else (0.6 if e < 50 else 0.97)
        s = 0.20 if (e == 45 and spike_after_jump) else 0.02
        h.append({"epoch": e, "train/acc": tr, "test/acc": te, "sens/train": s,
                  "weight_norm": 1.0})
    return h


def _grok_runs(tmp_path: Path | None, after_run: bool) -> list[dict[str, Any]]:
    from senslab.train.loops.grokking import GrokkingRun, grokking_phases

    exp = get_experiment("grokking")
    out = []
    for k in range(3):
        h = _grok_history(True)
        h[39]["sens/train"] = 0.02 + 0.001 * k  # the last evaluation before the jump
        # the peak just before it, a little higher in each seed: the seeds differ (tied seeds
        # would leave the part without a standard error) and none has fallen
        h[38]["sens/train"] = 0.0205 + 0.0015 * k
        name = f"g{k}"
        summary = {"name": name, "epochs": 60, "final": h[-1], "phases": grokking_phases(h)}
        if after_run:
            assert tmp_path is not None
            _write_run(tmp_path / name, h, summary)
            summary = exp.after_run(Run(name, GrokkingRun(name=name), trainer="grokking"),
                                    tmp_path / name, summary, None, _quiet)
        out.append(summary)
    return out


def test_grokking_spike_after_the_jump_is_not_a_fall(tmp_path: Path) -> None:
    v = get_experiment("grokking").verdict(_grok_runs(tmp_path, after_run=True))
    assert v["verdict"] == CONTRADICTED
    assert v["effects"]["fallen before the jump"]["verdict"] == CONTRADICTED
    ph = v["evidence"]["g0"]
    assert ph["peak_epoch"] < ph["jump_epoch"] == 40 and ph["before_jump_epoch"] == 39


def test_grokking_old_summary_with_peak_after_the_jump_is_not_judged() -> None:
    # summaries without the curve (before 2026-11-30): their stored peak (epoch 45) lies after
    # the jump, so the peak before it is unknown
    v = get_experiment("grokking").verdict(_grok_runs(None, after_run=False))
    assert v["verdict"] == NOT_COMPARABLE and "after the jump" in v["reason"]


def test_grokking_no_plateau_is_not_comparable(tmp_path: Path) -> None:
    from senslab.experiments.lowsens.grokking import phases_before_jump

    h = _grok_history(False)
    for r in h[10:]:
        r["test/acc"] = max(r["test/acc"], 0.55)  # test acc ≥ 0.5 already at memorisation
    ph = phases_before_jump(h)
    assert ph["plateau"] is False and ph["peak_epoch"] is None


# --------------------------------------------------------------------------- F3 cifar
def _cifar(label: str, seed: int, acc: float, measure: dict[str, Any]) -> dict[str, Any]:
    return {"label": label, "name": f"{label}-s{seed}", "seed": seed,
            "final": {"train/acc": acc, "sens/train": 0.01, "sens/train_se": 0.001},
            "final_measure": measure}


def test_cifar10_sigma_needs_comparable_train_accuracy() -> None:
    def sweep(vals: list[float]) -> dict[str, Any]:
        return {"sweep": [{"sigma": s, "sensitivity": x, "stderr": 0.001}
                          for s, x in zip((0.1, 1.0), vals, strict=True)]}

    # the audit's probe 2: a ViT at train acc 0.40 against a ResNet-18 at 0.99
    runs = []
    for seed in range(3):
        runs.append(_cifar("vit_small", seed, 0.40, sweep([0.010 + 0.001 * seed, 0.02])))
        runs.append(_cifar("resnet18", seed, 0.99, sweep([0.05 + 0.002 * seed, 0.30])))
    v = get_experiment("cifar10_sigma").verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "train accuracies" in v["reason"]


def test_cifar10_whole_input_needs_comparable_train_accuracy() -> None:
    exp = get_experiment("cifar10_whole_input")

    def measure(token: float, whole: list[float]) -> dict[str, Any]:
        return {"token": {"sigma": 0.5, "sensitivity": token, "stderr": 0.002},
                "whole": [{"sigma": 0.5 * f, "sensitivity": w, "stderr": 0.002}
                          for f, w in zip(exp.fractions, whole, strict=True)]}

    runs = []
    for seed in range(3):
        runs.append(_cifar("vit_small", seed, 0.40,
                           measure(0.005, [0.001, 0.002, 0.0049 + 0.0001 * seed, 0.03])))
        runs.append(_cifar("resnet18", seed, 0.99,
                           measure(0.083 + 0.001 * seed, [0.004, 0.008, 0.017, 0.09])))
    v = exp.verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "train accuracies" in v["reason"]


# --------------------------------------------------------------------------- F4 ties
def test_accuracy_se_is_not_zero_at_the_ends() -> None:
    from senslab.experiments._verdicts import accuracy_se

    assert accuracy_se(1.0, 1000) == pytest.approx(1e-3)
    assert accuracy_se(0.0, 1000) == pytest.approx(1e-3)
    assert accuracy_se(0.5, 100) == pytest.approx(math.sqrt((0.25 + 0.01) / 100))
    with pytest.raises(ValueError):
        accuracy_se(0.5, 0)


def _sf(name: str, case: int, ood: float) -> dict[str, Any]:
    a_s, a_f = (0.9, 0.3) if case == 1 else (0.2, 0.9)
    sol = (0.05, 0.3) if case == 1 else (0.06, 0.0)
    return {"name": name, "label": name, "case": case, "ood_size": 1000, "final": {
        "train/acc": 1.0, "ood/acc": ood, "align/sparse": a_s + 0.01 * len(name) * case,
        "align/frequent": a_f, "attn/sparse": 0.1, "attn/frequent": 0.5, "sens/train": 0.05,
        "solution/sparse": sol[0], "solution/frequent": sol[1]}}


def test_synthetic_tied_ood_accuracy_has_a_measurement_error() -> None:
    from senslab.experiments.lowsens.synthetic import sparse_frequent_verdict

    # the committed record's case: every case-2 run at OOD acc 1.000 on 1,000 OOD sequences
    runs = [_sf(f"case1-s{i}", 1, o) for i, o in enumerate((0.0, 0.009, 0.0))]
    runs += [_sf(f"case2-s{i}" + "x" * i, 2, 1.0) for i in range(3)]
    v = sparse_frequent_verdict(runs)
    kept = v["effects"]["case 2 OOD kept"]
    assert kept["se"] == pytest.approx(math.sqrt(3 * 1e-6) / 3)
    assert kept["interval"][1] - kept["interval"][0] > 0.005
    assert kept["verdict"] == SUPPORTED  # 1.0 on 1,000 sequences is still well above 0.9
    # all at 0.901: a tie one example above the threshold no longer "supports" it
    near = [*runs[:3], *(_sf(f"case2-s{i}" + "x" * i, 2, 0.901) for i in range(3))]
    assert sparse_frequent_verdict(near)["effects"]["case 2 OOD kept"]["verdict"] == INCONCLUSIVE
    # a summary without the OOD set's size cannot be judged
    old = [{k: v for k, v in s.items() if k != "ood_size"} for s in runs]
    assert sparse_frequent_verdict(old)["verdict"] == NOT_COMPARABLE


# --------------------------------------------------------------------------- F11 seed on disk
def test_summary_json_holds_the_seed_and_load_summaries_reproduces_the_verdict_input(
        tmp_path: Path) -> None:
    from senslab.experiments.lowsens.grokking import Grokking

    class Seeded(Grokking):  # grokking's runs, with the seed as run info (as fit_runs gives it)
        def runs(self, s: Any) -> list[Run]:
            return [Run(r.name, r.config, r.trainer, info={"seed": r.config.seed})
                    for r in super().runs(s)]

    tiny = ["p=11", "dim=16", "heads=2", "mlp_dim=32", "epochs=2", "eval_every=2",
            "sens_examples=10", "lr=0.01", "weight_decay=1.0", "seeds=2"]
    summaries = Seeded().execute(tmp_path, "cpu", tiny, False, _quiet)
    for s in summaries:
        on_disk = json.loads((tmp_path / s["name"] / "summary.json").read_text())
        assert on_disk["seed"] == s["seed"]
    assert load_summaries(tmp_path) == summaries


def test_load_summaries_takes_an_old_summarys_seed_from_its_config(tmp_path: Path) -> None:
    (tmp_path / "experiment.json").write_text(json.dumps({"name": "x", "runs": ["a-s1"]}))
    (tmp_path / "a-s1").mkdir()
    (tmp_path / "a-s1" / "summary.json").write_text(json.dumps({"name": "a-s1", "label": "a"}))
    (tmp_path / "a-s1" / "config.json").write_text(json.dumps({"name": "a-s1", "seed": 1}))
    assert load_summaries(tmp_path)[0]["seed"] == 1


# --------------------------------------------------------------------------- F10 language inits
def test_language_replicates_use_disjoint_inits() -> None:
    from senslab.experiments.lowsens.language import INIT_SEEDS, init_seeds

    sets = [set(init_seeds(k)) for k in range(5)]
    assert all(len(s) == INIT_SEEDS for s in sets)
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
    assert init_seeds(2)[0] == 2  # the run's own init first


def test_language_at_init_claim_needs_independent_replicates() -> None:
    from senslab.experiments.lowsens._language_verdict import language_verdict

    def summary(label: str, seed: int, sens: float, init: float, inits: list[int]
                ) -> dict[str, Any]:
        j = (0.0, 0.004, -0.003)[seed]
        final = {"train/acc": 0.97, "sens_end/train": sens + j, "sens_end/train_se": 0.002,
                 "sens_end/val": sens + j, "sens_end/val_se": 0.002,
                 "sens_init/train": init + j, "sens_init/train_se": 0.002}
        return {"label": label, "seed": seed, "final": final,
                "language": {"init_seeds": {"seeds": inits}}}

    def runs(inits: Any) -> list[dict[str, Any]]:
        return [summary(m, k, sens, init, inits(k)) for k in range(3)
                for m, sens, init in (("lstm", 0.10, 0.05), ("roberta", 0.03, 0.01),
                                      ("roberta_relu", 0.02, 0.005))]

    # seeds k, k + 1 sharing 4 of 5 inits (the old measurement): not judged
    old = language_verdict(runs(lambda k: [k + i for i in range(5)]))
    at_init = old["evidence"]["claims"]["below_lstm_at_init"]
    assert at_init["verdict"] == NOT_COMPARABLE and "overlap" in at_init["detail"]
    # disjoint inits: judged (the LSTM is above both RoBERTas at init here)
    new = language_verdict(runs(lambda k: [k] + [100 + 4 * k + i for i in range(4)]))
    assert new["evidence"]["claims"]["below_lstm_at_init"]["verdict"] == SUPPORTED
