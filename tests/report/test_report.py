"""Tests for senslab.report: reading run directories, aggregation over seeds, plots, HTML report.

The run directories are written here by hand in the format of docs/run-directory.md, with
made-up but structurally real metrics (the training engine is tested on its own).
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from senslab.report import (
    RunFormatError,
    Stat,
    aggregate_curve,
    final_table,
    format_table,
    load_run,
    load_runs,
    make_report,
    plot_curves,
    plot_position_profiles,
    plot_scatter,
    position_profile,
    read_metrics,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMG_TAG = '<img src="data:image/png;base64,'
# Final numbers of the fake runs: label -> seed -> (train acc, test acc, sensitivity, s.e.).
FINALS = {
    "vit_small": {0: (0.92, 0.81, 0.012, 0.002), 1: (0.88, 0.79, 0.018, 0.003)},
    "resnet18 <cnn>": {0: (0.99, 0.85, 0.060, 0.004), 1: (0.97, 0.86, 0.050, 0.005)},
}


def write_run(
    path: Path,
    label: str,
    seed: int,
    final: tuple[float, float, float, float],
    *,
    steps: int = 5,
    positions: bool | str = False,
    summary: bool = True,
) -> Path:
    """A run directory whose metrics move linearly towards ``final`` over ``steps`` log lines."""
    train_acc, test_acc, sens, se = final
    path.mkdir(parents=True)
    config = {"name": f"{label}-s{seed}", "label": label, "seed": seed, "train": {"epochs": 5}}
    (path / "config.json").write_text(json.dumps(config))
    env = {"python": "3.11.0", "torch": "2.13.0", "git_commit": "abc1234", "device": "cpu"}
    (path / "env.json").write_text(json.dumps(env))
    lines = []
    for i in range(1, steps + 1):
        frac = i / steps
        s = sens * (2 - frac)  # sensitivity falls to its final value
        row = {
            "step": 10 * i,
            "epoch": float(i),
            "train/loss": 2.0 * (1 - frac) + 0.1,
            "train/acc": train_acc * frac,
            "test/acc": test_acc * frac,
            "sens/train": s,
            "sens/train_se": se,
            "sens/train_ci": [s - 1.96 * se, s + 1.96 * se],
            "weight_norm": 10.0 + seed + i,
            "time": 0.5 * i,
        }
        if positions == "patches":  # a 3×3 patch grid, row by row; the centre patch the most
            row["sens/train_positions"] = list(range(9))
            row["sens/train_per_position"] = [s * (3 if p == 4 else 1) for p in range(9)]
        elif positions:
            row["sens/train_positions"] = [-4, -3, -2, -1]
            row["sens/train_per_position"] = [s * 0.5, s * 0.8, s, s * 1.5]
        lines.append(json.dumps(row))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if summary:
        fin = {"train/acc": train_acc, "test/acc": test_acc, "sens/train": sens}
        fin["sens/train_se"] = se
        (path / "summary.json").write_text(json.dumps({"label": label, "final": fin}))
    return path


def write_experiment(root: Path, positions: bool | str = False) -> Path:
    exp = root / "exp"
    subdirs = []
    for label, seeds in FINALS.items():
        for seed, final in seeds.items():
            sub = f"{label.split()[0]}-s{seed}"
            write_run(exp / sub, label, seed, final, positions=positions)
            subdirs.append(sub)
    info = {
        "name": "vision_sensitivity",
        "claim": "ViTs are less sensitive than CNNs (sens < 0.05 & acc > 0.8)",
        "paper": "Transformers Learn Low Sensitivity Functions",
        "runs": subdirs,
    }
    (exp / "experiment.json").write_text(json.dumps(info))
    verdict = {
        "verdict": "supported",
        "reason": "ViT sensitivity is below the CNN's in every seed",
        "evidence": {"vit_small": 0.015, "resnet18": 0.055, "ratio": 0.2727},
        "effects": {"resnet18": {"what": "resnet18 − vit_small", "effect": 0.04,
                                 "interval": [0.021, 0.059], "level": 0.95, "se": 0.0044,
                                 "se_measure": 0.003, "se_seed": 0.0032, "seeds": 3,
                                 "verdict": "supported", "detectable": None}},
        "correction": "none (one part)",
    }
    (exp / "verdict.json").write_text(json.dumps(verdict))
    return exp


def embedded_pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'data:image/png;base64,([^"]+)"', html)]


# ------------------------------------------------------------------------------------- report


def test_make_report_for_an_experiment(tmp_path: Path) -> None:
    import matplotlib.image

    exp = write_experiment(tmp_path)
    report = make_report(exp)
    assert report == exp / "report.html"  # default out_dir: the experiment directory
    html = report.read_text(encoding="utf-8")
    # Claim and labels are HTML-escaped user text.
    assert "ViTs are less sensitive than CNNs (sens &lt; 0.05 &amp; acc &gt; 0.8)" in html
    assert "resnet18 &lt;cnn&gt;" in html and "<cnn>" not in html
    assert "vit_small" in html
    assert 'class="verdict holds"' in html and "Verdict: supported" in html
    assert "below the CNN" in html and "0.2727" in html  # reason and evidence numbers
    # the claim's parts as a table: effect, interval, replicates in the part's unit, both
    # parts of the s.e.
    assert ("<th>resnet18 − vit_small</th><td class=\"num\">+0.04</td>"
            "<td class=\"num\">[+0.021, +0.059] (95%)</td><td class=\"num\">3 seeds</td>"
            "<td class=\"num\">0.0044 (0.003 / 0.0032)</td><td>supported</td>") in html
    assert "<details><summary>Evidence" in html
    assert "<td>2 (seeds 0, 1)</td>" in html  # the seeds column: how many, then which
    assert "2.13.0" in html and "abc1234" in html  # footer with env info
    # Self-contained: curves + final bars, embedded; nothing fetched from elsewhere.
    assert html.count(IMG_TAG) == 2
    assert "<script" not in html and "http" not in html
    for png in embedded_pngs(html):
        assert png.startswith(PNG_MAGIC)
        image = matplotlib.image.imread(io.BytesIO(png), format="png")
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert (exp / "curves.png").stat().st_size > 0
    assert (exp / "final_sensitivity.png").read_bytes().startswith(PNG_MAGIC)
    assert not (exp / "positions.png").exists()  # no positions logged, no profile plot


def test_positions_plot_only_when_logged(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path, positions=True)
    out = tmp_path / "out"
    report = make_report([exp], out_dir=out, title="With positions")
    html = report.read_text(encoding="utf-8")
    assert report.parent == out and "<h1>With positions</h1>" in html
    assert html.count(IMG_TAG) == 3
    assert (out / "positions.png").read_bytes().startswith(PNG_MAGIC)
    assert all(p.startswith(PNG_MAGIC) for p in embedded_pngs(html))
    assert "right-aligned" in html and "patch grid" not in html


def test_image_positions_are_a_heatmap_over_the_patch_grid(tmp_path: Path) -> None:
    """Patches numbered 0 … g² − 1 are drawn on their g × g grid, one panel per model; the
    centre patch, three times as sensitive, is the brightest cell of each panel."""
    import matplotlib.image

    from senslab.report.plots import patch_grid
    from senslab.report.runs import load_experiment

    exp = write_experiment(tmp_path, positions="patches")
    assert patch_grid(load_experiment(exp).runs) == (3, 3)
    html = make_report(exp).read_text(encoding="utf-8")
    assert "Sensitivity per image patch on the 3×3 patch grid" in html
    assert "right-aligned" not in html
    image = matplotlib.image.imread(str(exp / "positions.png"))
    assert image.shape[1] > image.shape[0]  # panels side by side
    # sequences (right-aligned, negative positions) never qualify as a grid
    seq = write_experiment(tmp_path / "seq", positions=True)
    assert patch_grid(load_experiment(seq).runs) is None


def test_report_for_plain_runs_defaults_to_first_run_dir(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", "mlp", 0, (0.9, 0.8, 0.1, 0.01))
    b = write_run(tmp_path / "b", "cnn", 0, (0.9, 0.8, 0.2, 0.01), summary=False)
    report = make_report([a, b])
    assert report == a / "report.html"
    html = report.read_text(encoding="utf-8")
    assert "mlp" in html and "cnn" in html and "not judged" not in html  # no experiment
    assert html.count(IMG_TAG) == 2


def test_report_needs_runs(tmp_path: Path) -> None:
    exp = tmp_path / "empty_exp"
    exp.mkdir()
    (exp / "experiment.json").write_text(json.dumps({"name": "x", "claim": "c", "runs": []}))
    with pytest.raises(RunFormatError, match="no runs found"):
        make_report(exp)


def test_import_does_not_load_matplotlib() -> None:
    # Plotting libraries load only when a plot is drawn, so `import senslab.report` stays light.
    code = "import sys, senslab.report; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# ----------------------------------------------------------------------------- aggregation


def test_final_table_mean_and_std_over_seeds(tmp_path: Path) -> None:
    runs = load_runs(write_experiment(tmp_path))
    rows = {row["label"]: row for row in final_table(runs)}
    assert set(rows) == set(FINALS)
    for label, seeds in FINALS.items():
        row = rows[label]
        assert row["runs"] == 2 and row["seeds"] == [0, 1]
        for col, key in enumerate(["train/acc", "test/acc", "sens/train"]):
            values = [final[col] for final in seeds.values()]
            stat = row[key]
            assert stat.n == 2 and stat.kind == "std"
            assert stat.mean == pytest.approx(statistics.mean(values))
            assert stat.spread == pytest.approx(statistics.stdev(values))  # sample std, R - 1
        # weight_norm is not in summary.json: it falls back to the last logged value (10 + s + 5).
        assert row["weight_norm"].mean == pytest.approx(15.5)
    per_run = final_table(runs, per_run=True)
    assert [r["seed"] for r in per_run] == [0, 1, 0, 1]
    assert per_run[0]["sens/train"].spread == pytest.approx(0.002)  # single run: its own s.e.
    assert per_run[0]["sens/train"].kind == "se"


def test_format_table_is_aligned(tmp_path: Path) -> None:
    rows = final_table(load_runs(write_experiment(tmp_path)), keys=["train/acc", "sens/train"])
    text = format_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["label", "runs", "train/acc", "sens/train"]
    assert len(lines) == 2 + len(FINALS)
    assert set(lines[1]) <= {"-", " "}
    assert "0.9 ± 0.028" in text  # vit_small train acc: mean 0.9, std 0.0283
    # Right-aligned numeric columns end at the same character in every row.
    ends = {line.rstrip().__len__() for line in lines}
    assert len(ends) == 1
    assert format_table([]) == "(no runs)"
    assert str(Stat(0.5)) == "0.5"


def test_aggregate_curve_band_is_std_or_single_run_ci(tmp_path: Path) -> None:
    runs = load_runs(write_experiment(tmp_path))
    vit = [r for r in runs if r.label == "vit_small"]
    curve = aggregate_curve(vit, "sens/train")
    assert curve is not None
    assert curve.steps.tolist() == [10, 20, 30, 40, 50]
    assert curve.epochs.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    last = [0.012, 0.018]
    assert curve.mean[-1] == pytest.approx(statistics.mean(last))
    assert curve.high[-1] - curve.mean[-1] == pytest.approx(statistics.stdev(last))
    single = aggregate_curve(vit[:1], "sens/train")
    assert single is not None and (single.count == 1).all()
    assert single.high[-1] - single.mean[-1] == pytest.approx(1.96 * 0.002)  # logged 95% CI
    assert aggregate_curve(vit, "no/such_metric") is None


# ---------------------------------------------------------------------------------- reading


def test_truncated_last_line_is_skipped_with_warning(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "r", "mlp", 0, (0.9, 0.8, 0.1, 0.01), summary=False)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 60, "epoch": 6.0, "train/lo')  # killed mid-write
    with pytest.warns(UserWarning, match="truncated last line 6"):
        run = load_run(run_dir)
    assert len(run.metrics) == 5
    assert run.final["train/acc"] == pytest.approx(0.9)  # no summary: last logged value
    assert run.label == "mlp" and run.summary is None


def test_corrupt_middle_line_is_an_error_naming_it(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "r", "mlp", 0, (0.9, 0.8, 0.1, 0.01))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:20]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RunFormatError, match=r"metrics.jsonl: line 3 is not valid JSON"):
        load_run(run_dir)


def test_line_without_step_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "epoch": 0.1}\n\n{"epoch": 0.2}\n{"step": 3, "epoch": 0.3}\n')
    with pytest.raises(RunFormatError, match="line 3 must be a JSON object with a 'step'"):
        read_metrics(path)


def test_non_run_paths_are_clear_errors(tmp_path: Path) -> None:
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    with pytest.raises(RunFormatError, match=r"not_a_run is not a run directory"):
        load_run(empty)
    with pytest.raises(RunFormatError, match="not_a_run is not a run directory"):
        load_runs([empty])
    with pytest.raises(RunFormatError, match="does not exist"):
        load_run(tmp_path / "missing")
    exp = write_experiment(tmp_path)
    with pytest.raises(RunFormatError, match="experiment directory"):
        load_run(exp)
    (exp / "verdict.json").write_text("{oops")
    with pytest.raises(RunFormatError, match="verdict.json is not valid JSON"):
        load_runs(exp)


def test_load_runs_expands_experiments_in_order(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path)
    extra = write_run(tmp_path / "extra", "mlp", 3, (0.5, 0.5, 0.3, 0.02))
    runs = load_runs([exp, extra])
    assert [r.name for r in runs] == [
        "vit_small-s0",
        "vit_small-s1",
        "resnet18 <cnn>-s0",
        "resnet18 <cnn>-s1",
        "mlp-s3",
    ]
    assert runs[0].experiment == exp and runs[-1].experiment is None
    info = json.loads((exp / "experiment.json").read_text())
    info["runs"].append("not-yet-started")
    (exp / "experiment.json").write_text(json.dumps(info))
    with pytest.warns(UserWarning, match="not-yet-started"):
        assert len(load_runs(exp)) == 4


def test_a_step_logged_twice_is_an_error(tmp_path: Path) -> None:
    # a resume drops the records after its checkpoint before it logs again, so a repeated step
    # means two writers (or a log pieced together): its numbers cannot be trusted
    run_dir = write_run(tmp_path / "r", "mlp", 0, (0.9, 0.8, 0.1, 0.01), steps=3)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 30, "epoch": 3.0, "train/loss": 0.05}) + "\n")
    with pytest.raises(RunFormatError, match="line 4 repeats step 30 after step 30"):
        load_run(run_dir)


# ------------------------------------------------------------------------------------ plots


def test_position_profile_and_mismatch_error(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "r", "lstm", 0, (0.9, 0.8, 0.1, 0.01), positions=True))
    pos, vals = position_profile(run)
    assert pos == [-4, -3, -2, -1] and vals[-1] == pytest.approx(0.15)
    run.metrics[-1]["sens/train_per_position"] = [0.1]
    with pytest.raises(ValueError, match="must match one to one"):
        position_profile(run)


def test_a_position_no_example_reached_is_left_out_of_the_profile(tmp_path: Path) -> None:
    # the tracker logs a position no example reached as null (NaN has no JSON form); a report of
    # such a run used to stop with "float() argument must be ... not 'NoneType'"
    runs = [load_run(write_run(tmp_path / f"r{s}", "lstm", s, (0.9, 0.8, 0.1, 0.01),
                               positions=True)) for s in (0, 1)]
    runs[0].metrics[-1]["sens/train_per_position"][0] = None
    pos, vals = position_profile(runs[0])
    assert math.isnan(vals[0]) and vals[-1] == pytest.approx(0.15)
    out = plot_position_profiles(runs, tmp_path / "positions.png")
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_scatter_and_curve_options(tmp_path: Path) -> None:
    runs = load_runs(write_experiment(tmp_path))
    out = plot_scatter(runs, "weight_norm", "config.seed", tmp_path / "p" / "s.png", logx=True)
    assert out.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="no run has numeric values"):
        plot_scatter(runs, "weight_norm", "blowup", tmp_path / "never.png")
    out = plot_curves(runs, tmp_path / "c.png", x="step", logy={"train/loss"}, keys=["train/loss"])
    assert out.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="x must be 'epoch' or 'step'"):
        plot_curves(runs, tmp_path / "c.png", x="time")


def test_a_single_logged_value_shows_its_own_runs_standard_error() -> None:
    """Three runs of a label, only seed 1 logged sens/val: the table shows seed 1's value with
    seed 1's s.e. (it showed seed 0's), and counts the one run behind the number."""
    from senslab.report.runs import Run

    def run(seed: int, final: dict) -> Run:
        return Run(Path(f"r{seed}"), {"name": f"r{seed}", "label": "vit", "seed": seed}, {},
                   [], {"label": "vit", "final": final})

    runs = [run(0, {"acc": 0.9, "sens/val_se": 0.25}),
            run(1, {"acc": 0.8, "sens/val": 0.031, "sens/val_se": 0.0012}),
            run(2, {"acc": 0.85})]
    row = final_table(runs, keys=["acc", "sens/val"])[0]
    assert row["runs"] == 3 and row["acc"].n == 3
    stat = row["sens/val"]
    assert (stat.mean, stat.spread, stat.n, stat.kind) == (0.031, 0.0012, 1, "se")


def test_runs_of_other_settings_are_not_averaged_as_seeds(tmp_path: Path) -> None:
    """Loose runs that share a label but differ in a setting (optim.lr) are shown apart, each
    labelled with its setting; the same seed and settings twice warns; a run given twice (or
    with its experiment) is refused; within one experiment the labels stay as given."""
    a = write_run(tmp_path / "a", "mlp", 0, (0.9, 0.8, 0.02, 0.002))
    b = write_run(tmp_path / "b", "mlp", 1, (0.7, 0.6, 0.04, 0.002))
    seeds = {row["label"]: row for row in final_table(load_runs([a, b]))}
    assert list(seeds) == ["mlp"] and seeds["mlp"]["runs"] == 2  # seeds 0 and 1 of one setting
    config = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**config, "optim": {"lr": 0.5}}))
    with pytest.warns(UserWarning, match="labelled 'mlp' differ in optim.lr"):
        rows = {row["label"]: row for row in final_table(load_runs([a, b]))}
    assert set(rows) == {"mlp (optim.lr=-)", "mlp (optim.lr=0.5)"}
    assert rows["mlp (optim.lr=0.5)"]["train/acc"].mean == pytest.approx(0.7)
    c = write_run(tmp_path / "c", "mlp", 0, (0.9, 0.8, 0.02, 0.002))
    with pytest.warns(UserWarning, match="same settings and seed 0"):
        load_runs([a, c])
    with pytest.raises(RunFormatError, match="given twice"):
        load_runs([a, tmp_path / "." / "a"])
    exp = write_experiment(tmp_path / "e")
    with pytest.raises(RunFormatError, match="given twice"):
        load_runs([exp, exp / "vit_small-s0"])
    assert {r.label for r in load_runs(exp)} == set(FINALS)


def test_a_sweep_within_an_experiment_is_not_averaged_as_seeds(tmp_path: Path) -> None:
    """An experiment that labels runs by function over several input lengths (hr_sharpness_vs_
    length): the runs of one label differ in n, so the label is split by n, without a warning
    (the experiment's own design), instead of a mean ± std "over seeds" of different n."""
    exp = write_experiment(tmp_path)
    for sub, n in (("vit_small-s0", 4), ("vit_small-s1", 6)):
        path = exp / sub / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "n": n, "seed": 0}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels = [r.label for r in load_runs(exp)]
    assert labels[:2] == ["vit_small (n=4)", "vit_small (n=6)"]
    assert labels[2:] == ["resnet18 <cnn>", "resnet18 <cnn>"]
