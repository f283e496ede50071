"""The seed replicates of one setting share a label, so that ``senslab report`` on an experiment
directory shows one row per setting over its seeds: tiny real runs of sparse_parity,
synthetic_sparse_frequent and grokking, read back as the report reads them; and a directory whose
summaries still carry the per-run labels of earlier versions is reused, not retrained, and
relabelled."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from senslab.experiments.base import run_experiment
from senslab.report.aggregate import final_table
from senslab.report.runs import load_runs

#: each experiment at a size that trains in about a second, two seed replicates per setting
TINY = {
    "sparse_parity": ["only=0,1,5", "n_bits=6", "k=2", "epochs=1", "test_size=64",
                      "bool_samples=16", "train_size=64", "seeds=2"],
    "synthetic_sparse_frequent": ["epochs=1", "train_size=100", "test_size=100", "eval_every=1",
                                  "sens_examples=16", "only=case1-s0,case2-s2", "seeds=2"],
    "grokking": ["p=11", "dim=16", "heads=2", "mlp_dim=32", "epochs=2", "eval_every=1",
                 "sens_examples=20", "lr=0.01", "weight_decay=1.0", "seeds=2"],
}

#: the rows ``senslab report`` shows for TINY: (label, the runs' seeds). sparse_parity's settings
#: 0 and 1 are one setting at seeds 0 and 1, so its replicate at seed 1 is listed once
ROWS = {
    "sparse_parity": [("n64-b32-w32-lr0.001", [0, 1, 2]), ("n64-b32-w32-lr0.003", [0, 1])],
    "synthetic_sparse_frequent": [("case1-s0", [0, 1]), ("case2-s2", [0, 1])],
    "grokking": [("modadd", [0, 1])],
}


def _quiet(_: str) -> None:
    pass


def _run(name: str, out: Path) -> None:
    with warnings.catch_warnings():  # tiny runs: measurements with no flip warn, as they should
        warnings.simplefilter("ignore")
        run_experiment(name, out, "cpu", TINY[name], progress=False, log=_quiet)


def _rows(out: Path) -> list[tuple[str, list[int]]]:
    """(label, seeds) of every row of the report's table of ``out``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(out)
    return [(row["label"], sorted(row["seeds"])) for row in final_table(runs, keys=[])]


def _files(out: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for n in names
            for p in sorted(out.glob(f"*/{n}"))}


def test_seed_replicates_share_a_label(tmp_path: Path) -> None:
    for name in TINY:
        out = tmp_path / name
        _run(name, out)
        assert _rows(out) == ROWS[name], name
        listed = json.loads((out / "experiment.json").read_text())["runs"]
        for run in listed:
            # the label is the summary's: config.json, which decides whether a finished run is
            # reused, has none (these trainers' configurations have no label field)
            assert "label" not in json.loads((out / run / "config.json").read_text())
            summary = json.loads((out / run / "summary.json").read_text())
            assert summary["name"] == run and summary["label"] in dict(ROWS[name])


def test_runs_recorded_with_per_run_labels_are_reused_and_relabelled(tmp_path: Path) -> None:
    for name in ("sparse_parity", "synthetic_sparse_frequent"):
        out = tmp_path / name
        _run(name, out)
        # as earlier versions recorded them: each summary labelled by its run's own name
        for path in out.glob("*/summary.json"):
            summary = json.loads(path.read_text())
            path.write_text(json.dumps({**summary, "label": summary["name"]}, indent=2))
        runs = json.loads((out / "experiment.json").read_text())["runs"]
        assert sorted(label for label, _ in _rows(out)) == sorted(runs)  # one row per run
        trained = _files(out, ("config.json", "metrics.jsonl"))
        _run(name, out)  # the same command again
        assert _files(out, ("config.json", "metrics.jsonl")) == trained, name  # not retrained
        assert _rows(out) == ROWS[name], name
