"""The language experiments (main paper §6 / A.4): registration, paper-scale settings, a tiny
end-to-end run on a GLUE-format MRPC fixture written here, and the verdict on hand-made
summaries of three seeds (one per outcome: supported, contradicted, inconclusive, not
comparable; the pairing by seed; the side claims)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.data import DataUnavailableError
from senslab.experiments import get_experiment, list_experiments, run_experiment
from senslab.experiments.lowsens._language_verdict import RISE_RATIO, language_verdict
from senslab.experiments.lowsens.language import (
    MODELS,
    VARIANCE,
    LanguageMRPC,
    recency_masks,
)
from senslab.report import load_runs
from senslab.report.plots import curve_panels
from senslab.train.loop import locate_data
from senslab.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_COMPARABLE, SUPPORTED, WORDS

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
    assert [c.model.name for c in configs] == list(MODELS) * 3  # three seeds of each model
    assert [c.seed for c in configs] == [0] * 4 + [1] * 4 + [2] * 4
    assert [c.name for c in configs[:5]] == [*MODELS, "lstm-s1"]  # seed 0 keeps its name
    for c in configs:
        assert c.model.overrides == {"layers": 4, "dim": 256, "heads": 8, "dropout": 0.1}
        assert (c.optim.name, c.optim.lr, c.optim.weight_decay) == ("adamw", 1e-4, 1e-4)
        assert c.train.batch_size == 32 and c.data.options["max_len"] == 128
        assert c.data.train_subset is None and c.track.val
        assert math.isclose(c.track.sigma**2, VARIANCE) and VARIANCE == 15.0
        assert c.track.every == 1 and c.track.unit == "epoch"
    cpu = get_experiment(name).configs("cpu")
    assert all(c.optim.name == "adamw" and c.data.options["max_len"] <= 128 for c in cpu)
    assert [c.seed for c in cpu] == [0] * 4 + [1] * 4 + [2] * 4
    assert get_experiment(name).seed_aware
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
        "track.num_examples=6", "data.options={'max_len': 28, 'vocab_size': 300}", "seeds=2"]


@pytest.mark.heavy
def test_tiny_end_to_end_on_mrpc_fixture(tmp_path: Path) -> None:
    data = tmp_path / "mrpc"
    data.mkdir()
    write_mrpc_fixture(data)
    out = tmp_path / "exp"
    verdict = run_experiment("language_mrpc", out, overrides=[f"data.root={data}", *TINY],
                             progress=False, log=lambda _: None)
    on_disk = json.loads((out / "verdict.json").read_text())
    assert on_disk["verdict"] == verdict["verdict"] in WORDS
    claims = on_disk["evidence"]["claims"]
    assert {"roberta_below_lstm", "below_lstm_at_init", "below_lstm_on_validation",
            "below_lstm_at_alt_sigma", "relu_below_softmax", "lstm_recency", "gpt2_between",
            "gpt2_recency"} <= set(claims)
    assert all(c["verdict"] in WORDS for c in claims.values())
    for name in MODELS:  # the end-of-training per-position profile, right-aligned
        prof = on_disk["evidence"][name]["profile"]
        assert prof["positions"][-1] == -1
        assert len(prof["positions"]) == len(prof["per_position"]) > 0
        assert on_disk["evidence"][name]["seeds"] == [0, 1]  # both seeds judged
    if verdict["verdict"] != NOT_COMPARABLE:  # paired over the two seeds
        assert set(verdict["effects"]) == {"lstm − roberta", "lstm − roberta_relu"}
        assert all(p["seeds"] == 2 for p in verdict["effects"].values())
    assert json.loads((out / "lstm-s1" / "config.json").read_text())["seed"] == 1
    from senslab.data import create_dataset

    cut = {}
    for split, name in (("train", "train"), ("test", "validation")):
        meta = create_dataset("mrpc", name, root=data, max_len=28, vocab_size=300).meta
        cut[split] = {k: meta[k] for k in ("truncated_rows", "truncated_tokens")}
    assert cut["train"]["truncated_rows"] > 0  # the fixture's pairs exceed 28 tokens
    labels = torch.bincount(create_dataset("mrpc", "train", root=data, max_len=28,
                                           vocab_size=300).targets, minlength=2).tolist()
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
        assert summary["language"]["truncated"] == cut  # what max_len 28 took, per split
        # train/acc is measured on the whole training split here (no track.eval_examples): its
        # labels' counts, for the verdict's majority-class note
        assert summary["language"]["label_counts"]["train"] == labels
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
             early: float = 0.1, se: float = 0.002, seed: int = 0, first: float | None = None
             ) -> dict[str, Any]:
    final = {"train/acc": acc, "test/acc": 0.7, "sens/train": sens, "sens/train_se": se,
             "sens/val": sens, "sens/val_se": se, "sens_alt/train": sens / 2,
             "sens_alt/train_se": se, "recency/late": late, "recency/early": early,
             "recency/diff": late - early, "recency/diff_se": 0.005,
             "sens_first/train": sens if first is None else first, "sens_first/train_se": se}
    return {"label": label, "seed": seed, "final": final,
            "language": {"init": {"sens/train": init, "sens/train_se": se}}}


#: a small seed-to-seed variation of every number, so that the t intervals have a width
JITTER = (0.0, 0.004, -0.003)


def paper_like(seeds: int = 3) -> list[dict[str, Any]]:
    """Every claim of the paper, clearly, in each of ``seeds`` seeds."""
    out = []
    for k in range(seeds):
        j = JITTER[k]
        out += [_summary("lstm", 0.10 + j, init=0.05 + j, late=0.25 + j, early=0.05, seed=k),
                _summary("roberta", 0.03 + j, init=0.01 + j / 4, late=0.03, early=0.03 + j / 4,
                         seed=k),
                _summary("roberta_relu", 0.02 + j / 2, init=0.005, late=0.02, early=0.02 + j / 4,
                         seed=k),
                _summary("gpt2", 0.05 + j, init=0.02, late=0.08 + j, early=0.03, seed=k)]
    return out


def _replace(runs: list[dict[str, Any]], label: str, **kw: Any) -> list[dict[str, Any]]:
    """``runs`` with every seed of ``label`` rebuilt with ``kw``; a value that is a list gives
    one per seed."""
    out = []
    for s in runs:
        if s["label"] == label:
            k = s["seed"]
            args = {n: (v[k] if isinstance(v, list) else v) for n, v in kw.items()}
            s = _summary(label, seed=k, **args)
        out.append(s)
    return out


def test_verdict_supported_with_every_claim() -> None:
    v = language_verdict(paper_like())
    assert v["verdict"] == SUPPORTED
    assert set(v["effects"]) == {"lstm − roberta", "lstm − roberta_relu"}
    assert v["correction"] == "Holm over 2 parts"
    for part in v["effects"].values():  # Student's t over the three seeds
        assert part["seeds"] == 3 and part["df"] == 2 and part["interval"][0] > 0
    claims = v["evidence"]["claims"]
    assert all(c["verdict"] == SUPPORTED for k, c in claims.items() if k != "softmax_cls_bump")
    assert claims["roberta_below_lstm"]["effects"].keys() == v["effects"].keys()
    assert set(claims["gpt2_between"]["effects"]) == {"gpt2 − roberta", "gpt2 − roberta_relu",
                                                       "lstm − gpt2"}
    assert set(claims["lstm_recency"]["effects"]) == {
        "lstm late − early", f"{RISE_RATIO:g} − roberta late/early",
        f"{RISE_RATIO:g} − roberta_relu late/early"}
    # <s> at the rate of every token: no bump, and nothing to decide it with
    assert claims["softmax_cls_bump"]["verdict"] == INCONCLUSIVE
    assert "lstm 0.1003 (seeds 0.1000, 0.1040, 0.0970)" in v["reason"]
    assert "at init" in v["reason"] and "(95%, 3 seeds) supported" in v["reason"]
    assert v["evidence"]["lstm"]["seeds"] == [0, 1, 2]
    assert v["evidence"]["lstm"]["per_seed"][1]["sens_train"] == pytest.approx(0.104)


def test_verdict_pairs_models_by_seed() -> None:
    """Seeds far apart, the same small gap in each: supported only because seed k of the LSTM
    is compared with seed k of each RoBERTa."""
    runs = _replace(paper_like(), "lstm", sens=[0.10, 0.30, 0.50], init=0.05, late=0.25,
                    early=0.05)
    runs = _replace(runs, "roberta", sens=[0.09, 0.289, 0.491], init=0.01, late=0.03, early=0.03)
    runs = _replace(runs, "roberta_relu", sens=[0.08, 0.281, 0.479], init=0.005, late=0.02,
                    early=0.02)
    v = language_verdict(runs)
    assert v["verdict"] == SUPPORTED
    assert v["effects"]["lstm − roberta"]["effect"] == pytest.approx(0.01, abs=1e-9)
    assert v["evidence"]["claims"]["relu_below_softmax"]["verdict"] == SUPPORTED
    # paired the wrong way round (seed 2 of the RoBERTas with seed 0 of the LSTM): the seeds'
    # spread swamps the gap
    swapped = [{**s, "seed": 2 - s["seed"]} if s["label"] != "lstm" else s for s in runs]
    assert language_verdict(swapped)["verdict"] == INCONCLUSIVE


def test_a_missing_run_is_not_paired_away() -> None:
    """roberta's seed-2 run missing: not comparable, naming the seeds (it was judged on the two
    seeds left, with the words still saying three)."""
    runs = [s for s in paper_like() if not (s["label"] == "roberta" and s["seed"] == 2)]
    v = language_verdict(runs)
    assert v["verdict"] == "not comparable"
    assert "different seeds" in v["reason"] and "roberta [0, 1]" in v["reason"]


def test_verdict_contradicted_and_side_claims_fail() -> None:
    runs = _replace(paper_like(), "roberta", sens=[0.12, 0.13, 0.125], init=[0.06, 0.07, 0.065],
                    late=[0.30, 0.31, 0.29], early=0.05)  # above the LSTM, rising to the end
    v = language_verdict(runs)
    claims = v["evidence"]["claims"]
    assert v["verdict"] == CONTRADICTED
    assert v["effects"]["lstm − roberta"]["verdict"] == CONTRADICTED
    assert v["effects"]["lstm − roberta_relu"]["verdict"] == SUPPORTED
    assert claims["roberta_below_lstm"]["verdict"] == CONTRADICTED
    assert claims["below_lstm_at_init"]["verdict"] == CONTRADICTED
    rec = claims["lstm_recency"]
    assert rec["verdict"] == CONTRADICTED
    assert rec["effects"][f"{RISE_RATIO:g} − roberta late/early"]["verdict"] == CONTRADICTED
    assert rec["effects"]["lstm late − early"]["verdict"] == SUPPORTED
    assert claims["relu_below_softmax"]["verdict"] == SUPPORTED
    assert claims["gpt2_between"]["verdict"] == CONTRADICTED  # gpt2 now below roberta


def test_verdict_inconclusive_with_detectable_effect() -> None:
    """The LSTM above softmax RoBERTa in two seeds and below it in the third."""
    runs = _replace(paper_like(), "roberta", sens=[0.05, 0.16, 0.05], init=0.01, late=0.03,
                    early=0.03)
    v = language_verdict(runs)
    part = v["effects"]["lstm − roberta"]
    assert v["verdict"] == INCONCLUSIVE and part["verdict"] == INCONCLUSIVE
    assert part["interval"][0] < 0 < part["interval"][1]
    assert part["detectable"] > abs(part["effect"])
    assert "could detect ≥" in v["reason"]
    # no bump at <s> either way: flip rate at <s> above in one seed, below in another
    runs = _replace(paper_like(), "roberta", sens=0.03, init=0.01, late=0.03, early=0.03,
                    first=[0.06, 0.01, 0.05])
    assert language_verdict(runs)["evidence"]["claims"]["softmax_cls_bump"][
        "verdict"] == INCONCLUSIVE
    runs = _replace(paper_like(), "roberta", sens=0.03, init=0.01, late=0.03, early=0.03,
                    first=[0.06, 0.065, 0.058])
    assert language_verdict(runs)["evidence"]["claims"]["softmax_cls_bump"][
        "verdict"] == SUPPORTED


def test_verdict_one_seed_is_measurement_only() -> None:
    v = language_verdict(paper_like(seeds=1))
    assert v["verdict"] == SUPPORTED
    assert all(p["seeds"] == 1 and p["df"] is None for p in v["effects"].values())
    assert "measurement noise only" in v["reason"]
    # the encoders' flatness is a ratio without a measurement error: one seed cannot decide it
    rec = v["evidence"]["claims"]["lstm_recency"]
    assert rec["verdict"] == INCONCLUSIVE
    assert rec["effects"]["lstm late − early"]["verdict"] == SUPPORTED


def test_verdict_not_comparable() -> None:
    runs = paper_like()
    runs[4]["final"]["train/acc"] = 0.70  # seed 1's LSTM never fitted the data
    v = language_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "differ by 0.270" in v["reason"]
    assert v["evidence"]["acc_gap_by_seed"] == {0: 0.0, 1: pytest.approx(0.27), 2: 0.0}
    assert v["evidence"]["claims"]["roberta_below_lstm"]["verdict"] == SUPPORTED
    for r in runs[4:8]:  # seed 1 at 0.75 and 0.70: 0.75 − 0.70 is 0.05000000000000004
        r["final"]["train/acc"] = 0.75
    runs[4]["final"]["train/acc"] = 0.70
    assert language_verdict(runs)["verdict"] != NOT_COMPARABLE
    quiet = [_summary(s["label"], 0.0, init=0.0, se=0.0, seed=s["seed"]) for s in paper_like()]
    assert language_verdict(quiet)["verdict"] == NOT_COMPARABLE
    assert "insensitive" in language_verdict(quiet)["reason"]
    no_lstm = [s for s in paper_like() if s["label"] != "lstm"]
    assert language_verdict(no_lstm)["verdict"] == NOT_COMPARABLE
    runs = paper_like()
    runs[1]["final"]["sens/train"] = math.nan  # a number that is not finite
    v = language_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "roberta/seed 0" in v["reason"]
    # early flip rate 0 with late flips: the ratio is undefined, the recency claim unjudged
    runs = _replace(paper_like(), "roberta", sens=0.03, init=0.01, late=0.03, early=0.0)
    v = language_verdict(runs)
    assert v["verdict"] == SUPPORTED
    assert v["evidence"]["claims"]["lstm_recency"]["verdict"] == NOT_COMPARABLE
    with pytest.raises(ValueError, match="seed 0"):
        language_verdict([*paper_like(), paper_like()[0]])
