r"""Winograd's F(4×4, 3×3) under bf16: the exact cut missing from ResNet-18's ceilings.

The real-model benchmark's ceilings (``real_models.py``: every FLOP of a row at its unit's peak)
count a ResNet-18 copy under ``autocast=torch.bfloat16`` at the FLOPs of direct convolutions,
since local reuse runs Winograd's algorithm in float32 only (``senslab.models._winograd``). This
script counts the cut and measures what it costs in bf16, on the zoo ResNet-18 trained briefly on
MNIST (the benchmark's case, ``_real.image_case``):

* **FLOPs**: for each 3×3 convolution local reuse runs on whole maps where Winograd applies
  (stages 3 and 4 on 32×32 images), the direct convolution's FLOPs, the Winograd version's as
  ``torch.utils.flop_counter`` counts :func:`~senslab.models._winograd.conv3x3` (transforms and
  one product per tile position), and its products alone (36 · tiles · C · K · 2); a variant
  with k bf16 products (a hi/lo split of the transformed inputs and filters) costs the transforms
  and k times the products.
* **Error** of each variant against a float64 convolution, on the layers' own inputs (the clean
  test images' activations): direct float32 and bf16 (autocast), Winograd in float32 (as local
  reuse runs it), and Winograd with its products in bf16 — one product, two (the transformed
  inputs split hi + lo) and three (hi·hi + hi·lo + lo·hi). A CPU bf16 product returns bf16
  (``torch.bmm`` has no float32 output for bf16 operands here; the script checks), so each
  product's sum is rounded to bf16 in the Winograd domain, where the output transform
  (constants up to 8) magnifies it.
* **Ceilings**: the record's rows under autocast (``--record``, a ``real_models.py`` record of
  the ResNet-18 case with ``gflop_per_local_copy`` and ``gflop_per_local_copy_direct``) with their
  copies at each variant's FLOPs at the bf16 peak, against the paper code's bf16 row, as
  ``real_models.ceilings`` counts them.

    python benchmarks/winograd_bf16.py --threads 2 \
        --record benchmarks/results/real-resnet18-256-2threads-zen4-sampling.json \
        --out benchmarks/results/winograd-bf16-zen4.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine  # noqa: E402

from senslab.models import _winograd  # noqa: E402

TILE = _winograd.TILE


def winograd_layers(model: nn.Module, images: Tensor) -> list[tuple[str, nn.Conv2d, Tensor]]:
    """(name, convolution, its input on ``images``) of every convolution of ``model`` that
    :func:`senslab.models._winograd.applies` to (float32, outside autocast)."""
    found: list[tuple[str, nn.Conv2d, Tensor]] = []
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            def grab(mod: nn.Module, args: tuple[Tensor, ...], name: str = name) -> None:
                x = args[0]
                if _winograd.applies(mod, x):  # type: ignore[arg-type]
                    found.append((name, mod, x.detach().clone()))  # type: ignore[arg-type]
            hooks.append(m.register_forward_pre_hook(grab))
    try:
        with torch.inference_mode():
            model(images)
    finally:
        for h in hooks:
            h.remove()
    return found


def transformed_input(x: Tensor) -> Tensor:
    """Winograd's transformed input tiles (36, tiles, C) of ``x`` (N, C, H, W), as
    :func:`~senslab.models._winograd.conv3x3` makes them (float32)."""
    n, c, h, w = x.shape
    a = TILE + 2
    padded = F.pad(x.permute(0, 2, 3, 1), (0, 0, 1, 1, 1, 1))
    d = padded.unfold(1, a, TILE).unfold(2, a, TILE).permute(0, 1, 2, 4, 5, 3)
    v = torch.matmul(_winograd._KB.to(x.dtype), d.reshape(n * (h // TILE) * (w // TILE), a * a, c))
    return v.transpose(0, 1)


def untransformed(prod: Tensor, n: int, h: int, w: int) -> Tensor:
    """The convolution (N, K, H, W) from the products (36, tiles, K), in float32."""
    k = prod.shape[-1]
    y = _winograd._KA.to(prod.dtype) @ prod.reshape(36, -1)
    return (y.view(TILE, TILE, n, h // TILE, w // TILE, k).permute(2, 5, 3, 0, 4, 1)
            .reshape(n, k, h, w))


def split(t: Tensor) -> tuple[Tensor, Tensor]:
    """``t`` (float32) as bf16 hi + lo, hi + lo equal to t to about 2⁻¹⁶ relative."""
    hi = t.to(torch.bfloat16)
    return hi, (t - hi.float()).to(torch.bfloat16)


def variants(x: Tensor, weight: Tensor) -> dict[str, Tensor]:
    """The convolution of ``x`` by ``weight`` (stride 1, padding 1), each way, in float32."""
    n, _, h, w = x.shape
    with torch.autocast("cpu", dtype=torch.bfloat16):
        direct_bf16 = F.conv2d(x, weight, padding=1)
    u = _winograd.transform_weight(weight)  # (36, C, K), float32
    v = transformed_input(x)  # (36, tiles, C)
    one = torch.bmm(v.to(torch.bfloat16), u.to(torch.bfloat16)).float()
    (vh, vl), (uh, ul) = split(v), split(u)
    two = torch.bmm(vh, uh).float() + torch.bmm(vl, uh).float()
    three = two + torch.bmm(vh, ul).float()
    return {"direct float32": F.conv2d(x, weight, padding=1),
            "direct bf16 (autocast)": direct_bf16.float(),
            "Winograd float32": _winograd.conv3x3(x, u).contiguous(),
            "Winograd, 1 bf16 product": untransformed(one, n, h, w),
            "Winograd, 2 bf16 products (inputs hi/lo)": untransformed(two, n, h, w),
            "Winograd, 3 bf16 products (hi/lo)": untransformed(three, n, h, w)}


def errors(x: Tensor, weight: Tensor) -> dict[str, dict[str, float]]:
    """Each variant's error against a float64 convolution: the root mean square over the root
    mean square of the exact output (``rms``) and the largest over the largest output
    (``max``)."""
    exact = F.conv2d(x.double(), weight.double(), padding=1)
    rms, top = float(exact.pow(2).mean().sqrt()), float(exact.abs().max())
    out = {}
    for label, y in variants(x, weight).items():
        e = (y.double() - exact).abs()
        out[label] = {"rms": float(e.pow(2).mean().sqrt()) / rms, "max": float(e.max()) / top}
    return out


def flops(conv: nn.Conv2d, shape: tuple[int, ...]) -> dict[str, float]:
    """FLOPs of one image's convolution of ``shape`` (C, H, W): direct, Winograd as
    :func:`~senslab.models._winograd.conv3x3` runs it (counted), its products alone, and its
    transforms (the difference)."""
    from torch.utils.flop_counter import FlopCounterMode

    c, h, w = shape
    k = conv.out_channels
    x = torch.zeros(1, c, h, w)
    u = _winograd.transform_weight(conv.weight.detach())
    with FlopCounterMode(display=False) as mode, torch.inference_mode():
        _winograd.conv3x3(x, u)
    counted = float(mode.get_total_flops())
    products = 36.0 * (h // TILE) * (w // TILE) * c * k * 2
    return {"direct": float(h * w * c * k * 9 * 2), "winograd": counted, "products": products,
            "transforms": counted - products}


def bf16_output_available() -> bool:
    """Whether this torch multiplies bf16 matrices into a float32 result on the CPU."""
    a = torch.zeros(2, 2, dtype=torch.bfloat16)
    try:
        torch.mm(a, a, out=torch.empty(2, 2))
        return True
    except RuntimeError:
        return False


def ceilings(record: dict[str, Any], per_copy: dict[str, float]) -> list[dict[str, Any]]:
    """For each senslab row of ``record``'s ResNet-18 case that ran under autocast: its ratio to
    the paper code's bf16 row with every FLOP at the bf16 peak (the GEMM's, or the best rate a
    row reached on bf16 alone, as ``real_models.ceilings``), its copies at the direct
    convolutions' FLOPs (the record's) and at each Winograd variant's (``per_copy``: GFLOP a
    copy)."""
    from real_models import row_unit

    case = next(c for c in record["cases"] if c["case"] == "resnet18")
    peaks = {k: v * 1e9 for k, v in case["gemm_gflops"].items()}
    for r in case["rows"]:
        if r["seconds"] > 0 and "checked" not in r["precision"]:
            unit = row_unit(r)
            peaks[unit] = max(peaks[unit], r["flops"] / r["seconds"])
    paper = next(r for r in case["rows"] if r["label"] == "paper code bf16")
    direct = case["gflop_per_local_copy_direct"]
    out = []
    for r in case["rows"]:
        if not r["label"].startswith("senslab") or "autocast" not in r["precision"]:
            continue
        parts, scale = r["flop_parts"], r["ttp"] / r["seconds"]
        row: dict[str, Any] = {"label": r["label"], "measured": paper["ttp"] / r["ttp"]}
        for label, gflop in {"direct": direct, **per_copy}.items():
            seconds = (parts["clean"] + parts["copies"] * gflop / direct) / peaks["bf16"] * scale
            row[label] = paper["ttp"] / seconds
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--examples", type=int, default=64,
                        help="clean test images whose activations the errors are measured on")
    parser.add_argument("--record", type=Path, default=None,
                        help="a real_models.py record of the ResNet-18 case, for the ceilings")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from _real import image_case

    case = image_case("resnet18", args.examples, 1.5)
    layers = winograd_layers(case.model, case.inputs)
    if not layers:
        raise SystemExit("no convolution of the model is one Winograd's algorithm runs")
    result: dict[str, Any] = {**machine(), "examples": args.examples,
                              "bf16_product_float32_output": bf16_output_available(),
                              "layers": []}
    saved = {"direct": 0.0, **{f"Winograd, {k} bf16 product{'s' if k > 1 else ''}": 0.0
                               for k in (1, 2, 3)}}
    for name, conv, x in layers:
        f = flops(conv, tuple(x.shape[1:]))
        err = errors(x, conv.weight.detach())
        result["layers"].append({"name": name, "shape": list(x.shape[1:]),
                                 "out_channels": conv.out_channels, "flops": f, "errors": err})
        saved["direct"] += f["direct"]
        for k in (1, 2, 3):
            saved[f"Winograd, {k} bf16 product{'s' if k > 1 else ''}"] += (
                f["transforms"] + k * f["products"])
        print(f"{name} {tuple(x.shape[1:])}: direct {f['direct'] / 1e6:.1f} MFLOP, Winograd "
              f"{f['winograd'] / 1e6:.1f} (products {f['products'] / 1e6:.1f}); rms error "
              + ", ".join(f"{lb} {e['rms']:.2e}" for lb, e in err.items()), flush=True)
    result["bf16_error_vs_direct_bf16"] = {
        lb: math.exp(sum(math.log(ly["errors"][lb]["rms"] / ly["errors"]["direct bf16 (autocast)"]
                                  ["rms"]) for ly in result["layers"]) / len(result["layers"]))
        for lb in result["layers"][0]["errors"]}
    if args.record is not None:
        record = json.loads(args.record.read_text())
        case_rec = next(c for c in record["cases"] if c["case"] == "resnet18")
        direct = case_rec["gflop_per_local_copy_direct"]
        per_copy = {lb: direct - (saved["direct"] - fl) / 1e9
                    for lb, fl in saved.items() if lb != "direct"}
        result["record"] = str(args.record)
        result["gflop_per_local_copy"] = {"direct (record)": direct,
                                          "Winograd float32 (record)":
                                              case_rec["gflop_per_local_copy"], **per_copy}
        result["ceilings"] = ceilings(record, per_copy)
        for row in result["ceilings"]:
            print(f"{row['label']}: measured {row['measured']:.2f}×; ceiling at the bf16 peak "
                  + ", ".join(f"{k} {v:.2f}×" for k, v in row.items()
                              if k not in ("label", "measured")), flush=True)
    print("rms error against direct bf16's (geometric mean over the layers): "
          + ", ".join(f"{k} {v:.3g}×" for k, v in result["bf16_error_vs_direct_bf16"].items()))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
