"""Benchmark suite of senslab's token-wise sensitivity estimator (issue #7).

For each case — ViT-small and ResNet-18 on 32×32×3 images (64 patches), an LSTM and a 4-layer
RoBERTa-like encoder on length-128 text, the Boolean transformer at n = 20 — it prints forward
passes per second of senslab's estimator and of the reference algorithm (:mod:`cases`), their
ratio, model FLOPs per forward and the fraction of the machine's dense float32 GEMM throughput
the estimator reaches. Reference, senslab and a GEMM are timed in interleaved repetitions (the
order rotates) and the medians of per-repetition values are reported, so load from other
processes affects both sides alike. Then: full forwards vs reuse of the clean computation
(prefix reuse for the LSTM and GPT-2, local reuse for ResNet-18 and the CNN); forward passes
needed to reach a standard error, plain Monte Carlo vs each variance-reduction technique
(:mod:`precision`); and the training throughput of ``senslab.train.loop.fit`` on the demo's and
the CIFAR-10 CPU-scale configs, beside the bare training step of the same models.
``benchmarks/gpu.py`` is the GPU counterpart.

    python benchmarks/run.py                 # full suite (idle 2-core CPU: ~12 min)
    python benchmarks/run.py --quick         # smaller workloads, for a smoke check
    python benchmarks/run.py --cases lstm roberta --out results.json
    python benchmarks/run.py --copies 1 --no-reuse --no-precision --no-training
                                             # issue #2's reference: one forward per token
    python benchmarks/run.py --no-timing --no-precision --no-training   # reuse table only
    python benchmarks/run.py --device cuda   # on a GPU: larger senslab workloads, GEMM there

Results go to ``benchmarks/results/<host>-<date>-<mode>.json`` (or ``--out``), with the command
line and the machine, written after every case and section (a run stopped later keeps them), and
a markdown table is printed. senslab runs with its defaults, ``precision="auto"`` included: where
checked bf16 or int8 pays it runs its copies there (float32's decisions), and each row says what
ran (``senslab_precision``, per repetition).

On cores shared with other processes, pass ``--threads 1``: with 2 OpenMP threads every small
sequential operator ends in a barrier that waits for a descheduled peer (measured here under a
load average of 4 on 2 cores: a batch-3 LSTM forward ran at 71/s with 1 thread and 0.37/s with
2), which slows the reference's small forwards far more than senslab's large ones and inflates
the ratio. Measured full-suite runtime with 2 threads at load 3–4: ~12 min.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine  # noqa: E402
from cases import Case, flops_per_forward, make_cases, reference  # noqa: E402
from precision import TECHNIQUES, digits_savings, savings  # noqa: E402

from senslab.measure import TokenSensitivity  # noqa: E402

ALL = ["vit_small", "resnet18", "lstm", "roberta", "boolean_transformer"]
TARGETS = {"text": 20.0, "image": 3.0}  # speed-up over the reference, issue #7
GEMM_TARGET = {"vit_small": 0.5}
#: (senslab examples, senslab tokens per example, reference examples, reference tokens)
SIZES = {
    "full": {"image": (8, 16, 1, 4), "text": (4, 32, 1, 4), "bits": (64, 20, 2, 20)},
    "quick": {"image": (2, 4, 1, 2), "text": (2, 8, 1, 2), "bits": (16, 20, 1, 20)},
    "tiny": {"image": (1, 2, 1, 1), "text": (1, 2, 1, 1), "bits": (4, 20, 1, 4)},
    # a GPU fills only with many copies per forward; the reference stays one example at a time
    "gpu": {"image": (256, 64, 2, 64), "text": (32, 128, 1, 128), "bits": (4096, 20, 8, 20)},
}
TINY_MODELS = {  # --tiny: the same architectures, shrunk (smoke test of this script)
    "vit_small": {"depth": 1, "heads": 2, "dim_head": 8, "mlp_dim": 32},
    "resnet18": {"width": 0.125, "blocks": (1, 1, 1, 1)},
    "lstm": {"layers": 1, "dim": 32},
    "roberta": {"layers": 1, "dim": 32, "heads": 2},
    "boolean_transformer": {"layers": 1, "dim": 16, "ff_dim": 16},
}


def loadavg() -> list[float]:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def sync(device: torch.device) -> None:
    """Wait for queued device work (GPU kernels run asynchronously to the host clock)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_flops(n: int, a: torch.Tensor, b: torch.Tensor, reps: int = 3) -> float:
    """FLOP/s of an n×n matrix product in ``a``'s dtype (median of ``reps``)."""
    times = []
    for _ in range(reps):
        sync(a.device)
        start = time.perf_counter()
        a @ b
        sync(a.device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def sizes(case: Case, mode: str) -> tuple[int, int, int, int]:
    key = "bits" if case.name == "boolean_transformer" else case.kind
    return SIZES[mode][key]


def senslab_run(case: Case, n: int, k: int, seed: int) -> tuple[int, int | None, str]:
    """Forward passes made, the (automatic) chunk size and what the copies ran in
    (:func:`ran_in`)."""
    metric = TokenSensitivity(case.model, case.tokens, sigma=case.sigma, repeats=case.repeats,
                              num_tokens=None if k >= case.length else k, generator=seed)
    metric.update(case.subset(n))
    res = metric.compute()
    return res.num_forward, metric.last_chunk_size, ran_in(metric.checked_precision,
                                                           res.recheck_fraction)


def ran_in(low: str | None, recheck: float | None) -> str:
    """What a run's copies ran in: ``precision="auto"`` (the default) runs checked bf16 or int8
    where the machine's products pay, and its timed judgement can differ between runs on a
    loaded machine; the fraction of the float32 GEMM then compares bf16 or int8 work with a
    float32 rate, so every row says what ran."""
    if low is None:
        return "float32"
    if low == "float32":
        return "float32 (auto judged checking not to pay)"
    return f"{low}-checked ({100 * (recheck or 0.0):.0f}% re-checked)"


def time_case(case: Case, mode: str, reps: int, gemm_n: int) -> dict[str, Any]:
    """Interleaved repetitions of reference, senslab and a GEMM; medians."""
    n_ours, k_ours, n_ref, k_ref = sizes(case, mode)
    g = torch.Generator().manual_seed(0)
    device = next(case.model.parameters()).device
    a = torch.randn(gemm_n, gemm_n, generator=g).to(device)
    b = torch.randn(gemm_n, gemm_n, generator=g).to(device)
    # bf16 too: the ceiling counts every precision the hardware offers (on some CPUs with
    # AVX-512 BF16 bf16 products run slower than float32, on others twice as fast: measure)
    a16, b16 = a.bfloat16(), b.bfloat16()
    gemm_flops(gemm_n, a16, b16, reps=1)  # warm-up (oneDNN primitive creation)
    reference(case, 1, 1, g)  # warm-up (allocator, kernels, one-time initialisation)
    senslab_run(case, 1, 1, 0)
    flops = flops_per_forward(case)
    samples: dict[str, list[float]] = {"reference": [], "senslab": [], "gemm": [],
                                       "gemm_bf16": []}
    chunk = None
    ran: list[str] = []
    for rep in range(reps):
        order = ["reference", "senslab", "gemm"]
        order = order[rep % 3:] + order[: rep % 3]
        for what in order:
            sync(device)
            start = time.perf_counter()
            if what == "reference":
                fwd = reference(case, n_ref, k_ref, g)
            elif what == "senslab":
                fwd, chunk, precision = senslab_run(case, n_ours, k_ours, rep)
                ran.append(precision)
            else:
                samples["gemm"].append(gemm_flops(gemm_n, a, b))
                samples["gemm_bf16"].append(gemm_flops(gemm_n, a16, b16))
                continue
            sync(device)
            samples[what].append(fwd / (time.perf_counter() - start))
    ratios = [o / r for o, r in zip(samples["senslab"], samples["reference"], strict=True)]
    fractions = [o * flops / gm for o, gm in zip(samples["senslab"], samples["gemm"], strict=True)]
    peak = [max(g32, g16) for g32, g16 in zip(samples["gemm"], samples["gemm_bf16"],
                                              strict=True)]
    fractions16 = [o * flops / gm for o, gm in zip(samples["senslab"], samples["gemm_bf16"],
                                                  strict=True)]
    # the largest ratio any exact method could reach: the reference's FLOP rate against the
    # machine's GEMM rate in its faster precision (a forward pass cannot do its FLOPs faster
    # than a large GEMM in the fastest precision the hardware offers)
    ceilings = [gm / (r * flops) for r, gm in zip(samples["reference"], peak, strict=True)]
    row = {
        "case": case.name, "kind": case.kind, "tokens": case.length, "draws": case.repeats,
        "chunk": chunk, "gflop_per_forward": flops / 1e9,
        # what senslab's copies ran in, per repetition ("auto" may judge each differently)
        "senslab_precision": ran,
        "reference_fwd_per_s": statistics.median(samples["reference"]),
        "senslab_fwd_per_s": statistics.median(samples["senslab"]),
        "ratio": statistics.median(ratios), "ratios": ratios,
        "gemm_gflops": statistics.median(samples["gemm"]) / 1e9,
        "gemm_fraction": statistics.median(fractions),
        "gemm_bf16_gflops": statistics.median(samples["gemm_bf16"]) / 1e9,
        "gemm_bf16_fraction": statistics.median(fractions16),
        "ratio_ceiling": statistics.median(ceilings),
        "target_ratio": TARGETS[case.kind],
        "target_gemm_fraction": GEMM_TARGET.get(case.name),
        "workload": {"senslab": [n_ours, k_ours], "reference": [n_ref, k_ref]},
    }
    return row


def reuse(mode: str, device: torch.device, reps: int) -> dict[str, Any]:
    """Perturbed forwards per second with full forwards and with reuse of the clean
    computation — prefix reuse for the zoo's left-to-right text models (LSTM, GPT-2;
    ``Embedding(reuse_prefix=...)``), local reuse for ResNet-18 on 32×32×3 and the CNN on 28×28
    (``Patches(reuse_local=...)``) —
    in interleaved repetitions on the same examples, and whether both give the same
    per-example numbers."""
    from senslab.models import create_model
    from senslab.tokens import Embedding, Patches

    # every token measured, as in the experiments (the clean cache is built once per batch or
    # chunk, so measuring a few tokens of each example would mostly time the cache)
    n, k = {"tiny": (1, 2), "quick": (1, None)}.get(mode, (2, None))
    out = {}
    images = {"resnet18": (3, 32), "cnn": (1, 28)}  # channels, side
    for name in ("lstm", "gpt2", "resnet18", "cnn"):
        tiny = {"layers": 1, "dim": 32, "heads": 2} if mode == "tiny" else {}
        if name in images:
            tiny = ({"resnet18": {"width": 0.125}, "cnn": {"channels": (4, 8)}}[name]
                    if mode == "tiny" else {})
        model = create_model(name, **tiny).eval().to(device)
        if name in images:
            c, side = images[name]
            batch: Any = (torch.rand(n, c, side, side, generator=torch.Generator().manual_seed(0))
                          * 2 - 1).to(device)
            sigma, repeats = 0.1, 5
        else:
            ids = torch.randint(2, 8000, (n, 128), generator=torch.Generator().manual_seed(0))
            batch = {"input_ids": ids.to(device),
                     "attention_mask": torch.ones(n, 128, dtype=torch.bool, device=device)}
            sigma, repeats = 1.0, 3
        rates: dict[bool, list[float]] = {False: [], True: []}
        results = {}
        for rep in range(reps + 1):  # the first round warms up
            for on in ((False, True) if rep % 2 else (True, False)):
                tokens = (Patches(4, reuse_local=on) if name in images
                          else Embedding("embed_ln", reuse_prefix=on))
                metric = TokenSensitivity(model, tokens, sigma=sigma, repeats=repeats,
                                          num_tokens=k, generator=rep, compare="l2")
                sync(device)
                start = time.perf_counter()
                metric.update(batch)
                results[on] = metric.compute()
                sync(device)
                if rep:
                    rates[on].append(results[on].num_forward / (time.perf_counter() - start))
        full, fast = statistics.median(rates[False]), statistics.median(rates[True])
        # output distances (not classes: the zoo's models at init predict one class, so class
        # flips would be 0 either way) — equal up to float rounding
        same = torch.allclose(results[False].per_sample, results[True].per_sample,
                              rtol=1e-3, atol=1e-6)
        out[name] = {"kind": "local" if name in images else "prefix",
                     "full_fwd_per_s": full, "reuse_fwd_per_s": fast, "speedup": fast / full,
                     "same_numbers": bool(same)}
        print(f"{name} reuse: {full:.1f} -> {fast:.1f} fwd/s ({fast / full:.2f}x)", flush=True)
    return out


def fit_throughput(base: Any, steps: int, reps: int = 3, extra: tuple[str, ...] = ()
                   ) -> dict[str, Any]:
    """Images/s of ``fit`` on config ``base`` (sensitivity tracking off): the training loop's own
    clock between the first and the last logged record (which brackets the ``steps`` optimizer
    steps and one evaluation of 2×50 examples), median of ``reps`` runs after a 1-step warm-up
    run (first data load, caches). Beside it, ``step_images_per_s``: the same model's bare
    forward + backward + optimizer step on one in-memory batch, so ``fit``/step shows what data
    handling, evaluation and logging cost."""
    from senslab.train.config import apply_overrides
    from senslab.train.loop import build_model, build_optimizer, fit, load_data

    rates = []
    for rep in range(reps + 1):
        k = 1 if rep == 0 else steps
        cfg = apply_overrides(base, [f"train.max_steps={k}", "train.epochs=100", "track.sigma=0",
                                     "track.eval_examples=50", "device=cpu", *extra])
        with tempfile.TemporaryDirectory() as tmp:
            fit(cfg, tmp, progress=False)
            records = [json.loads(line) for line in Path(tmp, "metrics.jsonl").open()]
        if rep:
            rates.append(k * base.train.batch_size / (records[-1]["time"] - records[0]["time"]))
    train, _ = load_data(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, train).train()
    opt = build_optimizer(cfg, model)
    x, y = train.batch(slice(0, base.train.batch_size))
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return {"model": base.model.name, "data": base.data.name,
            "batch_size": base.train.batch_size, "steps": steps, "images_per_s_runs": rates,
            "images_per_s": statistics.median(rates),
            "step_images_per_s": base.train.batch_size / statistics.median(times)}


def write_cifar_folder(root: Path, per_batch: int) -> None:
    """``root/cifar-10-batches-py`` as the official tarball extracts it (5 train batches and a
    test batch of ``per_batch`` random images each), for timing the CIFAR configs offline."""
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": [(i + j) % 10 for j in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))


def training_throughput(steps: int, cifar: bool = True) -> dict[str, Any]:
    """``fit`` throughput of the demo's ViT config (batch 50, MNIST or digits) and of the CIFAR-10
    CPU-scale configs of ViT-small and ResNet-18 (batch 100, 5,000 training images written in
    the official layout)."""
    from senslab.experiments.demo import Demo
    from senslab.experiments.lowsens._vision import CPU, VisionSettings, vision_runs

    out = {"demo": fit_throughput(Demo().configs("cpu")[0], steps)}
    if cifar:
        with tempfile.TemporaryDirectory() as tmp:
            write_cifar_folder(Path(tmp), 1000)
            for name in ("vit_small", "resnet18"):
                cfg = vision_runs({name: (name, [])}, VisionSettings(**CPU))[0].config
                out[f"cifar10 {name}"] = fit_throughput(cfg, steps, extra=(f"data.root={tmp}",))
    return out


def _ran(row: dict[str, Any]) -> str:
    """`` (what ran)`` after senslab's rate where its copies did not all run in float32."""
    ran = [r for r in row.get("senslab_precision", []) if r != "float32"]
    return f" ({'; '.join(dict.fromkeys(row['senslab_precision']))})" if ran else ""


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| case | tokens × draws | chunk | reference fwd/s | senslab fwd/s | ratio (target) "
        "| ceiling | GFLOP/fwd | % of GEMM |",
        "|---|---|---|---|---|---|---|---|---|",
    ] if result["cases"] else []
    for r in result["cases"]:
        ok = "✓" if r["ratio"] >= r["target_ratio"] else "✗"
        gf = f"{100 * r['gemm_fraction']:.0f}%"
        if r["target_gemm_fraction"]:
            gf += f" ({'✓' if r['gemm_fraction'] >= r['target_gemm_fraction'] else '✗'} ≥ 50%)"
        lines.append(
            f"| {r['case']} | {r['tokens']} × {r['draws']} | {r['chunk']} | "
            f"{r['reference_fwd_per_s']:.1f} | {r['senslab_fwd_per_s']:.1f}{_ran(r)} | "
            f"{r['ratio']:.1f}× ({ok} ≥ {r['target_ratio']:.0f}×) | "
            f"{r['ratio_ceiling']:.1f}× | {r['gflop_per_forward']:.3f} | {gf} |"
        )
    if result.get("reuse"):
        lines += ["", "Reuse of the clean computation (every token; length-128 text with 3 "
                  "draws, images with 5; perturbed fwd/s):", "",
                  "| model | reuse | full forwards | with reuse | speed-up | same numbers |",
                  "|---|---|---|---|---|---|"]
        for name, r in result["reuse"].items():
            lines.append(f"| {name} | {r['kind']} | {r['full_fwd_per_s']:.1f} | "
                         f"{r['reuse_fwd_per_s']:.1f} | {r['speedup']:.2f}× | "
                         f"{'✓' if r['same_numbers'] else '✗'} |")
    if result.get("precision"):
        names = list(TECHNIQUES) + ["adaptive"]
        lines += ["", f"Perturbed forward passes to reach a fixed-subset standard error of "
                  f"{TARGET_SE} (plain Monte Carlo over (example, token, noise) triples vs each "
                  "technique; saving in brackets; adaptive: forwards it spent to reach half the "
                  "stratified run's s.e. vs plain MC for that s.e.):", "",
                  "| case | σ | flip rate | plain MC | " + " | ".join(names) + " |",
                  "|---|---|---|---|" + "---|" * len(names)]
        for case, p in result["precision"].items():
            cells = [_needed(p, n) for n in names]
            plain = f"{p['plain_cost'] / TARGET_SE**2:,.0f}" if p["plain_cost"] > 0 else "–"
            lines.append(f"| {case} | {p['sigma']:g} | {p['flip_rate']:.3f} | {plain} | "
                         + " | ".join(cells) + " |")
    if result.get("training"):
        lines += ["", "| training config | model | data | batch | `fit` images/s | bare step "
                  "images/s |", "|---|---|---|---|---|---|"]
        for name, t in result["training"].items():
            lines.append(f"| {name} | {t['model']} | {t['data']} | {t['batch_size']} | "
                         f"{t['images_per_s']:.0f} | {t['step_images_per_s']:.0f} |")
    gm = [r["gemm_gflops"] for r in result["cases"]]
    g16 = [r["gemm_bf16_gflops"] for r in result["cases"] if "gemm_bf16_gflops" in r]
    if gm:
        bf = f", bf16 {statistics.median(g16):.1f} GFLOP/s" if g16 else ""
        lines += ["", f"GEMM {result['gemm_n']}²: float32 {statistics.median(gm):.1f}{bf}; "
                  f"load average {result['loadavg_start']} → {result['loadavg_end']}; "
                  f"{result['threads']} threads. Ceiling: the largest speed-up any exact method "
                  "could reach over the reference, the faster GEMM's FLOP/s ÷ the reference's "
                  "FLOP/s; % of GEMM: of the float32 product's rate."]
    return "\n".join(lines)


#: σ for the precision table: at initialisation RoBERTa and the Boolean transformer flip only
#: under large noise; the vision zoo models and the LSTM at initialisation predict one class
#: whatever the input (no flips even at σ = 30), so images are represented by the trained digits
#: MLP
PRECISION_SIGMA = {"roberta": 3.0, "boolean_transformer": 3.0}


def precision_suite(names: list[str], mode: str, g: torch.Generator) -> dict[str, Any]:
    """Savings of each technique on a trained digits MLP and on the zoo models (at init;
    ``--quick``: the Boolean transformer only; examples × measured tokens kept small)."""
    out = {}
    start = time.perf_counter()
    out["digits_mlp (trained)"] = digits_savings(examples={"tiny": 8}.get(mode, 64),
                                                 steps={"tiny": 50}.get(mode, 300))
    _report("digits_mlp (trained)", out["digits_mlp (trained)"], start)
    for name in names:
        if name not in PRECISION_SIGMA or (mode == "quick" and name != "boolean_transformer"):
            continue
        examples, tokens = (16, 20) if name == "boolean_transformer" else (2, 16)
        if mode == "tiny":
            examples, tokens = 2, 4
        (case,) = make_cases([name], examples, g, TINY_MODELS.get(name) if mode == "tiny" else None)
        start = time.perf_counter()
        out[name] = savings(case.model, case.inputs, case.tokens, PRECISION_SIGMA[name], tokens,
                            case.length)
        _report(name, out[name], start)
    return out


def _report(name: str, p: dict[str, Any], start: float) -> None:
    cells = [f"{k} {'exact' if p[k].get('exact') else _times(p[k]['saving'])}"
             for k in [*TECHNIQUES, "adaptive"] if k in p]
    print(f"{name}: flip rate {p['flip_rate']:.3f}, savings {', '.join(cells)} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)


TARGET_SE = 0.005


def _needed(p: dict[str, Any], name: str) -> str:
    """'forwards (saving×)' of one technique at TARGET_SE, from its measured cost."""
    if name in p and p[name].get("exact"):
        return "0 (s.e. 0: exact)"
    if name not in p or p[name]["saving"] is None:
        return "–"
    row = p[name]
    if name == "adaptive":
        return f"{row['forwards']:,.0f} vs {row['plain_forwards']:,.0f} ({row['saving']:.1f}×)"
    return f"{row['cost'] / TARGET_SE**2:,.0f} ({row['saving']:.1f}×)"


def _times(x: float | None) -> str:
    return "– (no flips)" if x is None else f"{x:.1f}×"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads (smoke check)")
    parser.add_argument("--tiny", action="store_true", help="shrunk models (tests of the script)")
    parser.add_argument("--cases", nargs="+", default=ALL, choices=ALL)
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu",
                        help="e.g. cuda: models, inputs, noise and the GEMM on that device (larger "
                             "senslab workloads; the reference still draws noise on the CPU)")
    parser.add_argument("--no-timing", action="store_true", help="skip the speed table")
    parser.add_argument("--no-precision", action="store_true")
    parser.add_argument("--no-reuse", action="store_true",
                        help="skip full forwards vs reuse (LSTM, GPT-2, ResNet-18, CNN)")
    parser.add_argument("--no-training", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    parser.add_argument("--copies", type=int, default=None,
                        help="noise copies per token (the reference puts them in one forward); "
                             "default: the paper code's 5 for images, 3 for text; 1 = one "
                             "forward pass per perturbed token (issue #2's reference)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu:  # float32 throughout (cuDNN would otherwise run convolutions in TF32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    mode = "tiny" if args.tiny else "quick" if args.quick else "gpu" if gpu else "full"
    reps = args.reps or {"full": 5, "quick": 3, "tiny": 1, "gpu": 5}[mode]
    gemm_n = {"full": 2048, "quick": 1024, "tiny": 256, "gpu": 8192}[mode]
    result: dict[str, Any] = {
        "host": socket.gethostname(), "date": datetime.datetime.now(datetime.timezone.utc)
        .isoformat(timespec="seconds"), "torch": torch.__version__, "threads": args.threads,
        "argv": sys.argv[1:] if argv is None else list(argv),  # the command that wrote it
        "mode": mode, "reps": reps, "copies": args.copies, "gemm_n": gemm_n,
        "device": torch.cuda.get_device_name(device) if gpu else "cpu",
        "loadavg_start": loadavg(), "cases": [],
        # the CPU and the threads as set, read back: the host name alone (a VM's is often
        # "vm") cannot tell machines whose float32, bf16 and int8 rates differ several-fold
        "machine": machine(),
    }
    print(f"torch {torch.__version__}, {args.threads} threads, mode {mode}, load "
          f"{result['loadavg_start']}", flush=True)
    torch.manual_seed(0)  # zoo models seed their own init; this covers anything else
    g = torch.Generator().manual_seed(0)
    n_max = max(s[0] for s in SIZES[mode].values())
    stem = f"{socket.gethostname()}-{result['date'][:10]}-{mode}"
    for name in [] if args.no_timing else args.cases:
        (case,) = make_cases([name], n_max, g, TINY_MODELS.get(name) if args.tiny else None,
                             device)
        if args.copies is not None:
            case = dataclasses.replace(case, repeats=args.copies)
        start = time.perf_counter()
        row = time_case(case, mode, reps, gemm_n)
        row["seconds"] = time.perf_counter() - start
        result["cases"].append(row)
        print(f"{name}: reference {row['reference_fwd_per_s']:.1f}/s, senslab "
              f"{row['senslab_fwd_per_s']:.1f}/s{_ran(row)}, ratio {row['ratio']:.1f}x, "
              f"{100 * row['gemm_fraction']:.0f}% of GEMM ({row['seconds']:.0f} s)", flush=True)
        save(result, args.out, stem)  # after every case: a later one may fail or be stopped
    if not args.no_reuse:
        result["reuse"] = reuse(mode, device, reps)
        save(result, args.out, stem)
    if gpu:
        args.no_precision = args.no_training = True  # CPU measurements; run them without --device
    if not args.no_precision:
        result["precision"] = precision_suite(args.cases, mode, g)
        save(result, args.out, stem)
    if not args.no_training:
        steps = {"full": 30, "quick": 10, "tiny": 2}[mode]
        result["training"] = training_throughput(steps, cifar=mode != "tiny")
    result["loadavg_end"] = loadavg()
    result["markdown"] = markdown(result)
    return write_results(result, args.out, stem)


def save(result: dict[str, Any], out: Path | None, stem: str) -> Path:
    """Write ``result`` as JSON to ``out`` (default ``benchmarks/results/<stem>.json``), whole
    and then renamed into place, so that a run stopped or failing later keeps what it measured
    and a run killed while writing never leaves half a file. A record written before the end
    has no ``loadavg_end``."""
    out = out or Path(__file__).resolve().parent / "results" / f"{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=float))
    tmp.replace(out)
    return out


def write_results(result: dict[str, Any], out: Path | None, stem: str) -> dict[str, Any]:
    """Print the result's markdown table and write it as JSON to ``out`` (default
    ``benchmarks/results/<stem>.json``; :func:`save`)."""
    print("\n" + result["markdown"])
    out = save(result, out, stem)
    print(f"\nwrote {out}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    main()
