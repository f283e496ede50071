"""The language experiments (main paper §6 / A.4): registration, paper-scale settings, a tiny
end-to-end run on a GLUE-format MRPC fixture written here, and the verdict on hand-made
summaries (one per outcome)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.data import DataUnavailableError
from senslab.experiments import get_experiment, list_experiments, run_experiment
from senslab.experiments.lowsens._language_verdict import language_verdict
from senslab.experiments.lowsens.language import (
    MODELS,
    VARIANCE,
    LanguageMRPC,
    recency_masks,
)
from senslab.report import load_runs
from senslab.report.plots import curve_panels
from senslab.train.loop import locate_data

NAMES = ("language_mrpc", "language_rotten_tomatoes", "language_qqp")


def test_registered() -> None:
    assert set(NAMES) <= set(list_experiments())
    for name in NAMES:
        exp = get_experiment(name)
        assert exp.claim and exp.paper and exp.cpu_scale_note
    assert "data.root" in get_experiment("language_mrpc").requires
    assert "data.root" in get_experiment("language_qqp").requires


@pytest.mark.parametrize("name", NAMES)
def test_paper_scale_settings(name: str) -> None:
    """docs/definitions.md#language: 4 layers, width 256, 8 heads, dropout 0.1, AdamW 1e-4 /
    1e-4, batch 32, max length 128, σ² = 15, validation tracked; the four models of the paper."""
    configs = get_experiment(name).configs("paper")
    assert [c.model.name for c in configs] == list(MODELS)
    for c in configs:
        assert c.model.overrides == {"layers": 4, "dim": 256, "heads": 8, "dropout": 0.1}
        assert (c.optim.name, c.optim.lr, c.optim.weight_decay) == ("adamw", 1e-4, 1e-4)
        assert c.train.batch_size == 32 and c.data.options["max_len"] == 128
        assert c.data.train_subset is None and c.track.val
        assert math.isclose(c.track.sigma**2, VARIANCE) and VARIANCE == 15.0
        assert c.track.every == 1 and c.track.unit == "epoch"
    cpu = get_experiment(name).configs("cpu")
    assert all(c.optim.name == "adamw" and c.data.options["max_len"] <= 128 for c in cpu)
    with pytest.raises(ValueError, match="scale"):
        get_experiment(name).configs("gpu")


def test_recency_masks() -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    late, early, first = recency_masks(mask)
    assert late[0].nonzero().flatten().tolist() == [6, 7]  # last ⌈8/4⌉ = 2 tokens
    assert early[0].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert late[1].nonzero().flatten().tolist() == [2]
    assert early[1].nonzero().flatten().tolist() == [0]
    assert first.sum(1).tolist() == [1, 1] and not (late & ~mask).any()


# --------------------------------------------------------------------------- end to end

_WORDS = ("the company said its shares rose sharply on monday after a strong quarter while "
          "analysts expected lower profits and the market fell later that week in new york").split()


def write_mrpc_fixture(root: Path, n_train: int = 20, n_dev: int = 8) -> None:
    """GLUE-format MRPC files: UTF-8 BOM, tab-separated, a header, quotes inside the text."""
    gen = torch.Generator().manual_seed(0)

    def sentence() -> str:
        idx = torch.randint(len(_WORDS), (int(torch.randint(5, 12, (1,), generator=gen)),),
                            generator=gen)
        words = [_WORDS[i] for i in idx.tolist()]
        return '" ' + " ".join(words) + ' " , he said .'  # GLUE keeps quotes as tokens

    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(n):
            a = sentence()
            b = a if i % 2 else sentence()
            lines.append(f"{i % 2}\t{1000 + i}\t{2000 + i}\t{a}\t{b}")
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


TINY = ["model.overrides={'layers': 1, 'dim': 16, 'heads': 2, 'dropout': 0.0}", "train.epochs=1",
        "track.num_examples=6", "data.options={'max_len': 28, 'vocab_size': 300}"]


def test_tiny_end_to_end_on_mrpc_fixture(tmp_path: Path) -> None:
    data = tmp_path / "mrpc"
    data.mkdir()
    write_mrpc_fixture(data)
    out = tmp_path / "exp"
    verdict = run_experiment("language_mrpc", out, overrides=[f"data.root={data}", *TINY],
                             progress=False, log=lambda _: None)
    on_disk = json.loads((out / "verdict.json").read_text())
    assert on_disk["verdict"] == verdict["verdict"] in {"holds", "does not hold",
                                                         "not comparable"}
    claims = on_disk["evidence"]["claims"]
    assert {"roberta_below_lstm", "below_lstm_at_init", "below_lstm_on_validation",
            "below_lstm_at_alt_sigma", "relu_below_softmax", "lstm_recency", "gpt2_between",
            "gpt2_recency"} <= set(claims)
    assert all(c["verdict"] in {"holds", "does not hold", "not comparable"}
               for c in claims.values())
    for name in MODELS:  # the end-of-training per-position profile, right-aligned
        prof = on_disk["evidence"][name]["profile"]
        assert prof["positions"][-1] == -1
        assert len(prof["positions"]) == len(prof["per_position"]) > 0
    for name in MODELS:
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["step"] == 0 and len(rows) == 2  # init + one epoch
        last = rows[-1]
        assert len(last["sens/train_positions"]) == len(last["sens/train_per_position"]) > 0
        assert last["sens/train_positions"][-1] == -1 and "sens/val" in last
        summary = json.loads((out / name / "summary.json").read_text())
        f = summary["final"]
        assert 0.0 <= f["sens_alt/train"] <= 1.0 and 0.0 <= f["recency/late"] <= 1.0
        assert 0.0 <= f["sens_end/val"] <= 1.0 and 0.0 <= f["sens_init/train"] <= 1.0
        assert summary["language"]["end_examples"] == 20  # capped by the fixture's 20 pairs
        assert summary["language"]["init"]["sens/train"] == rows[0]["sens/train"]
        assert summary["language"]["profile_train"]["per_position"] == last[
            "sens/train_per_position"]
    # end-of-training numbers live in summary.json only: the report draws no empty curve panels
    panels = [k for _, _, keys in curve_panels(load_runs([out])) for k in keys]
    assert "sens/train" in panels and not any(k.startswith("sens_end") for k in panels)
    # a second run reuses every finished run and its end-of-training numbers
    stamp = (out / "lstm" / "summary.json").stat().st_mtime_ns
    again = run_experiment("language_mrpc", out, overrides=[f"data.root={data}", *TINY],
                           progress=False, log=lambda _: None)
    assert again["evidence"]["claims"] == claims
    assert (out / "lstm" / "summary.json").stat().st_mtime_ns == stamp


def test_missing_mrpc_names_files_and_option(tmp_path: Path) -> None:
    cfg = LanguageMRPC().configs("cpu")[0]
    cfg.data.root = str(tmp_path)
    with pytest.raises(DataUnavailableError, match=r"train\.tsv.*--set data\.root=DIR"):
        locate_data(cfg)


# --------------------------------------------------------------------------- verdict


def _summary(label: str, sens: float, *, init: float, acc: float = 0.97, late: float = 0.1,
             early: float = 0.1, se: float = 0.002) -> dict[str, Any]:
    final = {"train/acc": acc, "test/acc": 0.7, "sens/train": sens, "sens/train_se": se,
             "sens/val": sens, "sens/val_se": se, "sens_alt/train": sens / 2,
             "sens_alt/train_se": se, "recency/late": late, "recency/early": early,
             "recency/diff": late - early, "recency/diff_se": 0.005,
             "sens_first/train": sens, "sens_first/train_se": se}
    return {"label": label, "final": final,
            "language": {"init": {"sens/train": init, "sens/train_se": se}}}


def paper_like() -> list[dict[str, Any]]:
    return [_summary("lstm", 0.10, init=0.05, late=0.25, early=0.05),
            _summary("roberta", 0.03, init=0.01, late=0.03, early=0.03),
            _summary("roberta_relu", 0.02, init=0.01, late=0.02, early=0.02),
            _summary("gpt2", 0.05, init=0.02, late=0.08, early=0.03)]


def test_verdict_holds_with_every_claim() -> None:
    v = language_verdict(paper_like())
    assert v["verdict"] == "holds"
    assert all(c["verdict"] == "holds" for k, c in v["evidence"]["claims"].items()
               if k != "softmax_cls_bump")
    assert "lstm 0.1000" in v["reason"] and "at init" in v["reason"]


def test_verdict_does_not_hold_and_sub_claims_fail() -> None:
    runs = paper_like()
    runs[1] = _summary("roberta", 0.12, init=0.06, late=0.30, early=0.05)  # above the LSTM
    runs[0] = _summary("lstm", 0.10, init=0.05, late=0.10, early=0.10)  # and flat
    v = language_verdict(runs)
    claims = v["evidence"]["claims"]
    assert v["verdict"] == "does not hold"
    assert claims["roberta_below_lstm"]["verdict"] == "does not hold"
    assert claims["below_lstm_at_init"]["verdict"] == "does not hold"
    assert claims["lstm_recency"]["verdict"] == "does not hold"
    assert claims["relu_below_softmax"]["verdict"] == "holds"


def test_verdict_not_comparable() -> None:
    runs = paper_like()
    runs[0]["final"]["train/acc"] = 0.70  # the LSTM never fitted the data
    v = language_verdict(runs)
    assert v["verdict"] == "not comparable" and "differ by 0.270" in v["reason"]
    assert v["evidence"]["claims"]["roberta_below_lstm"]["verdict"] == "holds"
    quiet = [_summary(s["label"], 0.0, init=0.0, se=0.0) for s in paper_like()]
    assert language_verdict(quiet)["verdict"] == "not comparable"
    assert language_verdict(paper_like()[1:])["verdict"] == "not comparable"  # no LSTM run
