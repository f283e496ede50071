"""The verdict of the language experiments (``language.py``): one sub-verdict per claim of the
paper's §6 / A.4, computed from the run summaries alone, and an overall verdict on the main claim.

A summary is what ``language.finish_run`` writes: ``final`` holds ``sens_end/train``,
``sens_end/val`` (σ² = 15, end of training), ``sens_alt/*`` (σ² = 4), ``sens_init/train``
(untrained weights), ``recency/*`` and ``sens_first/*``, all with standard errors over examples,
and ``train/acc``; :func:`numbers` falls back to the tracked ``sens/*`` and the step-0 record for
summaries without them. "A below B" always means B − A > 2 s.e. of the difference (the two
estimates are independent: different models).
"""

from __future__ import annotations

import math
from typing import Any

#: final train accuracies further apart than this make the comparison "not comparable"
MAX_ACC_GAP = 0.05
#: the LSTM "rises towards the end" when its late/early flip-rate ratio is at least this (and the
#: late − early difference exceeds 2 s.e.); an encoder is "flat" when it does not rise so
RISE_RATIO = 1.5
#: below this every model counts as insensitive (no flips to compare)
INSENSITIVE = 1e-3
ENCODERS = ("roberta", "roberta_relu")
#: the main claim's number: the end-of-training measurement on the larger train subset
MAIN = "sens_end/train"


def numbers(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's final numbers, with the end-of-training measurements' fallbacks: a run
    without ``sens_end/*`` (larger end subset) uses the last tracked ``sens/*``, one without
    ``sens_init/train`` the logged step-0 record."""
    f = dict(summary["final"])
    init = summary.get("language", {}).get("init", {})
    for split in ("train", "val"):
        for suffix in ("", "_se"):
            if f"sens/{split}{suffix}" in f:
                f.setdefault(f"sens_end/{split}{suffix}", f[f"sens/{split}{suffix}"])
    for suffix in ("", "_se"):
        if f"sens/train{suffix}" in init:
            f.setdefault(f"sens_init/train{suffix}", init[f"sens/train{suffix}"])
    return f


def _get(summary: dict[str, Any], key: str) -> tuple[float, float]:
    value, se = summary.get(key), summary.get(f"{key}_se")
    return (math.nan if value is None else float(value)), (math.nan if se is None else float(se))


def _below(low: dict[str, Any], high: dict[str, Any], key: str) -> tuple[bool, float, float]:
    """Is ``low``'s ``key`` below ``high``'s by more than 2 s.e.? Returns (ok, diff, 2·se)."""
    (a, sa), (b, sb) = _get(low, key), _get(high, key)
    diff, two_se = b - a, 2 * math.hypot(sa, sb)
    return bool(diff > two_se), diff, two_se


def _sub(ok: bool | None, detail: str) -> dict[str, str]:
    word = "not comparable" if ok is None else ("holds" if ok else "does not hold")
    return {"verdict": word, "detail": detail}


def _fmt(summary: dict[str, Any], key: str) -> str:
    v, se = _get(summary, key)
    return f"{v:.4f} ± {se:.4f}"


def recency(summary: dict[str, Any]) -> tuple[float, float, float, float]:
    """(late rate, early rate, late − early, its s.e.) of a run's final model."""
    f = summary
    return (float(f["recency/late"]), float(f["recency/early"]), float(f["recency/diff"]),
            float(f["recency/diff_se"]))


def ratio(summary: dict[str, Any]) -> float:
    late, early, _, _ = recency(summary)
    if early > 0:
        return late / early
    return math.inf if late > 0 else 1.0


def rises(summary: dict[str, Any]) -> bool:
    _, _, diff, se = recency(summary)
    return ratio(summary) >= RISE_RATIO and diff > 2 * se


def _below_lstm(runs: dict[str, dict[str, Any]], key: str,
                who: tuple[str, ...] = ENCODERS) -> tuple[bool | None, str]:
    if any(key not in runs[m] for m in (*who, "lstm")):
        return None, f"{key} not measured"
    parts, ok = [], True
    for m in who:
        good, diff, two_se = _below(runs[m], runs["lstm"], key)
        ok &= good
        parts.append(f"lstm − {m} = {diff:+.4f} (2 s.e. {two_se:.4f})")
    return ok, "; ".join(parts)


def language_verdict(summaries: list[dict[str, Any]],
                     max_acc_gap: float = MAX_ACC_GAP) -> dict[str, Any]:
    """Per-claim sub-verdicts (``evidence["claims"]``) and the overall verdict on the main claim
    (both RoBERTas below the LSTM at the end of training, train subset, σ² = 15)."""
    runs = {s["label"]: numbers(s) for s in summaries}
    missing = [m for m in ("lstm", *ENCODERS) if m not in runs]
    if missing:
        return {"verdict": "not comparable", "reason": f"runs missing: {', '.join(missing)}",
                "evidence": {}}
    accs = {m: float(f.get("train/acc", math.nan)) for m, f in runs.items()}
    evidence: dict[str, Any] = {
        m: {"train_acc": accs[m], "val_acc": f.get("test/acc"),
            "sens_train": f.get(MAIN), "se": f.get(f"{MAIN}_se"),
            "sens_val": f.get("sens_end/val"), "sens_alt_train": f.get("sens_alt/train"),
            "sens_init": f.get("sens_init/train"), "sens_last_tracked": f.get("sens/train"),
            "recency_ratio": ratio(f) if "recency/late" in f else None,
            "sens_first": f.get("sens_first/train")}
        for m, f in runs.items()
    }
    for s in summaries:  # the end-of-training per-position profile, right-aligned
        lang = s.get("language", {})
        prof = lang.get("sens_end_profile_train") or lang.get("profile_train")
        if prof and s["label"] in evidence:
            evidence[s["label"]]["profile"] = prof
    claims: dict[str, dict[str, str]] = {}
    main_ok, main_detail = _below_lstm(runs, MAIN)
    claims["roberta_below_lstm"] = _sub(main_ok, main_detail)
    claims["below_lstm_at_init"] = _sub(*_below_lstm(runs, "sens_init/train"))
    claims["below_lstm_on_validation"] = _sub(*_below_lstm(runs, "sens_end/val"))
    claims["below_lstm_at_alt_sigma"] = _sub(*_below_lstm(runs, "sens_alt/train"))
    ok, diff, two_se = _below(runs["roberta_relu"], runs["roberta"], MAIN)
    claims["relu_below_softmax"] = _sub(ok, f"roberta − roberta_relu = {diff:+.4f} "
                                            f"(2 s.e. {two_se:.4f})")
    have_recency = all("recency/late" in f for f in runs.values())
    if have_recency:
        flat = {m: not rises(runs[m]) for m in ENCODERS}
        claims["lstm_recency"] = _sub(
            rises(runs["lstm"]) and all(flat.values()),
            "late/early flip-rate ratio " + ", ".join(
                f"{m} {ratio(runs[m]):.2f} (late − early {recency(runs[m])[2]:+.4f} ± "
                f"{recency(runs[m])[3]:.4f})" for m in ("lstm", *ENCODERS))
            + f"; rise = ratio ≥ {RISE_RATIO} and difference > 2 s.e.")
    else:
        claims["lstm_recency"] = _sub(None, "recency contrast not measured")
    if "sens_first/train" in runs["roberta"]:
        (f, fse), (s, sse) = (_get(runs["roberta"], "sens_first/train"),
                              _get(runs["roberta"], MAIN))
        claims["softmax_cls_bump"] = _sub(
            f - s > 2 * math.hypot(fse, sse),
            f"roberta: flip rate at <s> {f:.4f} ± {fse:.4f} vs all tokens {s:.4f} ± {sse:.4f}")
    if "gpt2" in runs:
        g = runs["gpt2"]
        top = max(ENCODERS, key=lambda m: _get(runs[m], MAIN)[0])
        above = _get(g, MAIN)[0] > _get(runs[top], MAIN)[0]
        below, diff, two_se = _below(g, runs["lstm"], MAIN)
        claims["gpt2_between"] = _sub(
            above and below, f"gpt2 {_fmt(g, MAIN)} vs {top} {_fmt(runs[top], MAIN)} and "
                             f"lstm − gpt2 = {diff:+.4f} (2 s.e. {two_se:.4f})")
        if have_recency:
            _, _, gdiff, gse = recency(g)
            more = all(ratio(g) > ratio(runs[m]) for m in ENCODERS) and gdiff > 2 * gse
            claims["gpt2_recency"] = _sub(
                more, f"gpt2 late/early ratio {ratio(g):.2f} (late − early {gdiff:+.4f} ± "
                      f"{gse:.4f}) vs " + ", ".join(f"{m} {ratio(runs[m]):.2f}" for m in ENCODERS))
    evidence["claims"] = claims
    evidence["acc_gap"] = max(accs.values()) - min(accs.values())

    main = ", ".join(f"{m} {_fmt(runs[m], MAIN)}" for m in runs)
    init = ", ".join(f"{m} {_fmt(runs[m], 'sens_init/train')}" for m in runs)
    acc = "/".join(f"{accs[m]:.3f}" for m in runs)
    subs = "; ".join(f"{k}: {v['verdict']}" for k, v in claims.items()
                     if k != "roberta_below_lstm")
    reason = (f"end-of-training train-subset sensitivity (σ² = 15) {main}; at init {init}; "
              f"train acc "
              f"{acc}. Sub-claims — {subs}")
    gap = evidence["acc_gap"]
    if main_ok is None:
        word = "not comparable"
    elif not gap <= max_acc_gap:
        word = "not comparable"
        reason = f"train accuracies differ by {gap:.3f} (> {max_acc_gap}): " + reason
    elif all(_get(runs[m], MAIN)[0] < INSENSITIVE for m in runs):
        word = "not comparable"
        reason = "every model is insensitive (no flips to compare): " + reason
    else:
        word = "holds" if main_ok else "does not hold"
    return {"verdict": word, "reason": reason, "evidence": evidence}
