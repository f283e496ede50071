"""GPU benchmark (issue #7): CIFAR-10-sized sensitivity of ViT-small and ResNet-18 in examples/s,
float32 against TF32, bf16/fp16 autocast and ``torch.compile``, each checked for agreement with
float32; then training throughput (images/s) of the same models on CIFAR-10-sized batches and of
the demo's ``fit``.

The models are first trained for a few hundred steps on scikit-learn's digits, upsampled to
32×32×3 (the zoo's models at initialisation predict one class whatever the input, so nothing
would flip and every variant would trivially agree). Sensitivity: all 64 patches of 4×4, 5 draws
each (the paper code's copies), on ``--examples`` images (repeated digits), at the smallest σ of a
doubling ladder where float32 flips at least 1% (or ``--sigma``).

    python benchmarks/gpu.py                          # needs a CUDA device; ~3 min on an H100
    python benchmarks/gpu.py --mnist-root DIR         # also the demo's fit (DIR/mnist.pkl.gz)

Writes ``benchmarks/results/gpu-<device>-<date>.json`` (or ``--out``) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import flops_per_forward, make_cases  # noqa: E402
from run import write_results  # noqa: E402

from senslab.measure import TokenSensitivity  # noqa: E402
from senslab.models import create_model  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "float32": {},
    "tf32": {"tf32": True},
    "bf16 autocast": {"autocast": torch.bfloat16},
    "fp16 autocast": {"autocast": torch.float16},
    "compile": {"compile": True},
    "compile + bf16": {"compile": True, "autocast": torch.bfloat16},
}


def digits32(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 digits as 32×32×3 images in [−1, 1] and their labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 8 - 1
    x = F.interpolate(x, size=32, mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    return x.to(device), torch.tensor(d.target).to(device)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Adam, batch 128, ``steps`` steps; returns the train accuracy."""
    g = torch.Generator(device=x.device).manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(x), (128,), generator=g, device=x.device)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        return float((model(x).argmax(1) == y).float().mean())


@contextlib.contextmanager
def tf32(on: bool):
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def measure(model: nn.Module, x: torch.Tensor, sigma: float, opts: dict[str, Any],
            reps: int) -> dict[str, Any]:
    """Examples/s (median of ``reps`` timed runs after one warm-up) and the estimate."""
    opts = dict(opts)
    use_tf32 = opts.pop("tf32", False)
    times, result, chunk = [], None, None
    with tf32(use_tf32):
        metric = TokenSensitivity(model, Patches(4), sigma=sigma, repeats=5, generator=0, **opts)
        for rep in range(reps + 1):
            metric.reset()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            metric.update(x)
            result = metric.compute()
            torch.cuda.synchronize()
            if rep:
                times.append(time.perf_counter() - start)
            chunk = metric.last_chunk_size
    assert result is not None
    t = statistics.median(times)
    return {"examples_per_s": len(x) / t, "forwards_per_s": result.num_forward / t,
            "seconds": t, "estimate": result.estimate, "stderr": result.stderr_subset,
            "ci95_half": 1.96 * result.stderr_subset, "chunk": chunk,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def pick_sigma(model: nn.Module, x: torch.Tensor) -> float:
    """The smallest σ of a doubling ladder at which float32 flips ≥ 1% (agreement between
    precisions is only informative where predictions flip)."""
    for sigma in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0):
        r = TokenSensitivity(model, Patches(4), sigma=sigma, repeats=2, generator=0)
        r.update(x)
        if r.compute().estimate >= 0.01:
            break
    return sigma


def gemm_tflops(dtype: torch.dtype, n: int = 8192, reps: int = 10) -> float:
    with tf32(False):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize()
        return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


def train_throughput(name: str, batch: int = 100, steps: int = 50) -> dict[str, float]:
    """Images/s of SGD steps (batch 100, CIFAR-10-sized tensors kept on the GPU), float32 and
    bf16 autocast."""
    out = {}
    for label, dtype in (("float32", None), ("bf16 autocast", torch.bfloat16)):
        torch.manual_seed(0)
        model = create_model(name).cuda().train()
        opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(batch, 3, 32, 32, device="cuda", generator=g)
        y = torch.randint(10, (batch,), device="cuda", generator=g)
        ctx = torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext()
        for i in range(steps + 5):
            if i == 5:
                torch.cuda.synchronize()
                start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with ctx:
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        out[label] = steps * batch / (time.perf_counter() - start)
    return out


def demo_fit(mnist_root: str) -> dict[str, Any]:
    """Images/s of ``fit`` on the demo's paper-scale ViT config on the GPU (sensitivity
    tracking off), from the loop's own records."""
    from senslab.experiments.demo import Demo
    from senslab.train.config import apply_overrides
    from senslab.train.loop import fit

    base = Demo().configs("paper")[0]
    rates = []
    for steps in (5, 200, 200):
        cfg = apply_overrides(base, [f"train.max_steps={steps}", "track.sigma=0",
                                     "track.eval_examples=100", "device=cuda", "data.name=mnist",
                                     f"data.root={mnist_root}", "model.overrides.patch_size=7"])
        with tempfile.TemporaryDirectory() as tmp:
            fit(cfg, tmp, progress=False)
            rec = [json.loads(line) for line in Path(tmp, "metrics.jsonl").open()]
        if steps > 5:
            rates.append(steps * base.train.batch_size / (rec[-1]["time"] - rec[0]["time"]))
    return {"model": base.model.name, "batch_size": base.train.batch_size,
            "images_per_s": statistics.median(rates), "runs": rates}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000,
                        help="images measured (CIFAR-10's test set: 10,000)")
    parser.add_argument("--sigma", type=float, default=None,
                        help="noise level (default: per model, the first of 0.25, 0.5, 1, 2, 4, "
                             "8 at which float32 flips at least 1%% on 256 images)")
    parser.add_argument("--steps", type=int, default=400, help="training steps on digits")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["vit_small", "resnet18"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--mnist-root", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device; on a CPU use benchmarks/run.py")
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "examples": args.examples,
        "gemm_tflops": {"float32": gemm_tflops(torch.float32),
                        "bf16": gemm_tflops(torch.bfloat16)},
        "sensitivity": {}, "training": {},
    }
    print(f"{res['device']}, torch {torch.__version__}: GEMM {res['gemm_tflops']}", flush=True)
    xd, yd = digits32(dev)
    x = xd[torch.arange(args.examples, device=dev) % len(xd)]
    for name in args.models:
        torch.manual_seed(0)
        model = create_model(name).to(dev)
        acc = train(model, xd, yd, args.steps)
        (case,) = make_cases([name], 1, torch.Generator().manual_seed(0), device=dev)
        gflop = flops_per_forward(case) / 1e9
        sigma = args.sigma or pick_sigma(model, x[:256])
        rows: dict[str, Any] = {"train_acc": acc, "gflop_per_forward": gflop, "sigma": sigma}
        for v in args.variants:
            try:
                row = measure(model, x, sigma, VARIANTS[v], args.reps)
            except Exception as err:  # a variant the installed torch cannot run: say so
                rows[v] = {"error": f"{type(err).__name__}: {err}"[:300]}
                print(f"{name} {v}: {rows[v]['error']}", flush=True)
                continue
            row["gemm_fraction_fp32"] = (row["forwards_per_s"] * gflop
                                         / (res["gemm_tflops"]["float32"] * 1e3))
            if v != "float32":
                ref = rows["float32"]
                row["delta"] = row["estimate"] - ref["estimate"]
                row["agrees"] = abs(row["delta"]) <= ref["ci95_half"]
            rows[v] = row
            print(f"{name} {v}: {row['examples_per_s']:.0f} examples/s, "
                  f"{row['forwards_per_s'] / 1e3:.0f}k fwd/s, estimate {row['estimate']:.5f} "
                  f"± {row['stderr']:.5f}, chunk {row['chunk']}, peak {row['peak_gib']:.1f} GiB",
                  flush=True)
        res["sensitivity"][name] = rows
        res["training"][name] = train_throughput(name)
        print(f"{name} training: {res['training'][name]}", flush=True)
    if args.mnist_root:
        res["demo_fit"] = demo_fit(args.mnist_root)
        print(f"demo fit: {res['demo_fit']}", flush=True)
    res["markdown"] = markdown(res)
    return write_results(res, args.out, f"gpu-{res['device'].replace(' ', '_')}-{res['date'][:10]}")


def markdown(res: dict[str, Any]) -> str:
    sig = ", ".join(f"{k} {v['sigma']:g}" for k, v in res["sensitivity"].items())
    lines = [f"{res['device']}, torch {res['torch']}; {res['examples']:,} images of 32×32×3, "
             f"64 patches × 5 draws, σ: {sig}; float32 GEMM "
             f"{res['gemm_tflops']['float32']:.0f} TFLOP/s, bf16 "
             f"{res['gemm_tflops']['bf16']:.0f} TFLOP/s.", "",
             "| model | variant | examples/s | forwards/s | % of fp32 GEMM | estimate ± s.e. "
             "| agrees with fp32 (95% CI) | chunk | peak GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, rows in res["sensitivity"].items():
        for v, r in rows.items():
            if v not in VARIANTS:
                continue
            if "error" in r:
                lines.append(f"| {name} | {v} | – | – | – | {r['error'][:60]} | – | – | – |")
                continue
            agree = "–" if v == "float32" else (
                f"{'✓' if r['agrees'] else '✗'} (Δ {r['delta']:+.5f})")
            lines.append(
                f"| {name} | {v} | {r['examples_per_s']:,.0f} | {r['forwards_per_s']:,.0f} | "
                f"{100 * r['gemm_fraction_fp32']:.0f}% | {r['estimate']:.5f} ± "
                f"{r['stderr']:.5f} | {agree} | {r['chunk']} | {r['peak_gib']:.1f} |")
    lines += ["", "| model | training images/s, float32 | bf16 autocast |", "|---|---|---|"]
    for name, t in res["training"].items():
        lines.append(f"| {name} | {t['float32']:,.0f} | {t['bf16 autocast']:,.0f} |")
    if "demo_fit" in res:
        d = res["demo_fit"]
        lines += ["", f"Demo `fit` ({d['model']}, batch {d['batch_size']}, MNIST): "
                  f"{d['images_per_s']:,.0f} images/s"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
