r"""Where checked low precision pays: float32 against ``precision="int8-checked"``,
``"bf16-checked"`` and ``"auto"`` on MLPs trained on scikit-learn's digits (offline), timed side
by side in one process, rounds interleaved.

The real-model benchmark (``real_models.py``) found checked int8 a loss on MiniLM and the zoo's
GPT-2: their margins are small next to int8's error, so most copies are re-checked in float32.
A classifier with wide linear layers and confident decisions is the other end: few copies lie
near a boundary. Each case trains ``zoo mlp`` (seeded, Adam) for ``steps`` steps on senslab's
``digits`` training split and measures the first ``examples`` of its test split (359 images)
with 2×2 patches at ``sigma``; the rows report seconds (best of
``reps``), the speed-up over float32, the re-checked share, what ``"auto"`` ran
(``checked_precision``: ``"int8"``/``"bf16"``, or ``"float32"`` when its timed calibration
judged checking a loss), and whether every row's per-example flip rates equal float32's.

    python benchmarks/checked_precision.py --threads 2 \
        --out benchmarks/results/checked-precision-2threads.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine  # noqa: E402

from senslab.data import create_dataset  # noqa: E402
from senslab.measure import TokenSensitivity  # noqa: E402
from senslab.models import create_model  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

#: name: (hidden widths, Adam steps)
CASES: dict[str, tuple[tuple[int, ...], int]] = {
    "mlp 3×1024, 300 steps": ((1024, 1024, 1024), 300),
    "mlp 3×1024, 10 steps": ((1024, 1024, 1024), 10),
}
PRECISIONS = ("float32", "int8-checked", "bf16-checked", "auto")


def digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """senslab's digits split (images in [−1, 1], 8×8) and its labels."""
    x, y = create_dataset("digits", split=split).batch(slice(None))
    return x, y


def trained(widths: tuple[int, ...], steps: int, seed: int = 0) -> nn.Module:
    x, y = digits("train")
    torch.manual_seed(seed)  # the zoo's MLP initialises from the global RNG
    model = create_model("mlp", image_size=8, in_channels=1, widths=widths).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (64,), generator=g)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def measure(model: nn.Module, x: torch.Tensor, precision: str, sigma: float,
            repeats: int) -> dict[str, Any]:
    metric = TokenSensitivity(model, Patches(2), sigma=sigma, repeats=repeats, generator=0,
                              precision=precision)
    start = time.perf_counter()
    metric.update(x)
    seconds = time.perf_counter() - start
    r = metric.compute()
    return {"seconds": seconds, "estimate": r.estimate, "stderr": r.stderr,
            "recheck_fraction": r.recheck_fraction, "ran": metric.checked_precision or "float32",
            "per_sample": r.per_sample}


def run_case(name: str, widths: tuple[int, ...], steps: int, examples: int, sigma: float,
             repeats: int, reps: int) -> dict[str, Any]:
    model = trained(widths, steps)
    x, y = digits("test")
    held = x[:examples]
    with torch.inference_mode():
        accuracy = float((model(held).argmax(1) == y[:examples]).float().mean())
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PRECISIONS}
    for _ in range(reps):
        for p in PRECISIONS:
            runs[p].append(measure(model, held, p, sigma, repeats))
    rows = []
    base = min(r["seconds"] for r in runs["float32"])
    ref = runs["float32"][0]["per_sample"]
    for p in PRECISIONS:
        best = min(runs[p], key=lambda r: r["seconds"])
        rows.append({
            "precision": p, "seconds": best["seconds"], "speedup": base / best["seconds"],
            "estimate": best["estimate"], "stderr": best["stderr"],
            "recheck_fraction": best["recheck_fraction"], "ran": best["ran"],
            "flips_equal_float32": all(torch.equal(r["per_sample"], ref) for r in runs[p]),
        })
    return {"case": name, "widths": list(widths), "steps": steps, "accuracy": accuracy,
            "examples": examples, "sigma": sigma, "repeats": repeats, "reps": reps,
            "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    cpu = result.get("machine", {}).get("cpu")
    lines = [f"{result['threads']} threads, torch {result['torch']}"
             + (f", {cpu} ({', '.join(result['machine']['cpu_flags'] or [])})" if cpu else ""), "",
             "| case | precision | ran | seconds | vs float32 | re-checked | same flips |",
             "|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        for r in c["rows"]:
            share = "-" if r["recheck_fraction"] is None else f"{r['recheck_fraction']:.1%}"
            lines.append(f"| {c['case']} (accuracy {c['accuracy']:.2f}) | {r['precision']} | "
                         f"{r['ran']} | {r['seconds']:.2f} | {r['speedup']:.2f}× | {share} | "
                         f"{'✓' if r['flips_equal_float32'] else '✗'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--sigma", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=8, help="draws per patch")
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    # the command and the machine: int8's and bf16's speed-ups over float32 differ several-fold
    # between CPUs (VNNI, AVX-512 BF16, AMX), so a record without them cannot be read
    result: dict[str, Any] = {"threads": args.threads, "torch": torch.__version__,
                              "argv": sys.argv[1:] if argv is None else list(argv),
                              "machine": machine(), "cases": []}
    for name in args.cases:
        widths, steps = CASES[name]
        result["cases"].append(run_case(name, widths, steps, args.examples, args.sigma,
                                        args.repeats, args.reps))
    print(markdown(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for path, text in ((args.out, json.dumps(result, indent=1) + "\n"),
                           (args.out.with_suffix(".md"), markdown(result) + "\n")):
            tmp = path.with_name(path.name + ".tmp")  # whole, then renamed into place
            tmp.write_text(text)
            tmp.replace(path)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
