"""Speed of senslab's token-wise sensitivity estimator against the straightforward algorithm.

The reference algorithm is written here, as a researcher would write it first: for every example,
for every token, for every noise draw, generate the noise on the CPU, add it to that one token
and run one forward pass on that one perturbed example. senslab builds all perturbed copies of a
chunk on the model's device and runs one forward pass per chunk.

Both run side by side in one process on the same model, and the script prints forward passes
(single-example model evaluations) per second for each and their ratio. Run:

    python benchmarks/bench_sensitivity.py            # both cases, ~1 minute on 2 CPU cores
    python benchmarks/bench_sensitivity.py --quick    # smaller, for a smoke check
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn

from senslab.measure import token_sensitivity
from senslab.tokens import Embedding, Patches


class TextEncoder(nn.Module):
    """A RoBERTa-style classifier: embedding → LayerNorm (noise goes here) → + positions →
    transformer encoder → CLS head."""

    def __init__(self, vocab: int = 8000, dim: int = 256, layers: int = 4, heads: int = 8,
                 max_len: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.embed_ln = nn.LayerNorm(dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_ln(self.embedding(input_ids)) + self.pos[: input_ids.shape[1]]
        return self.head(self.encoder(h)[:, 0])


class ViT(nn.Module):
    """A small ViT on 32×32×3 images, patch 4 (64 tokens), dim 192, 6 layers."""

    def __init__(self, dim: int = 192, layers: int = 6, heads: int = 3) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, stride=4)
        self.pos = nn.Parameter(torch.randn(64, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.encoder(h).mean(1))


class _Wrap(nn.Module):
    """Calls a zoo text model on ids alone (all tokens real) for the reference loop."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.embed_ln = model, model.embed_ln

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, torch.ones_like(input_ids, dtype=torch.bool))


def reference_text(model: nn.Module, ids: torch.Tensor, sigma: float, repeats: int) -> int:
    """One forward per (example, token, draw); noise made on the CPU and added by a hook."""
    delta: dict[str, torch.Tensor] = {}

    def hook(module, args, out):
        return out + delta["noise"].to(out.device)

    handle = model.embed_ln.register_forward_hook(hook)
    flips = 0
    try:
        with torch.inference_mode():
            for x in ids:
                x = x[None]
                delta["noise"] = torch.zeros(1, x.shape[1], model.embed_ln.normalized_shape[0])
                clean = model(x).argmax(1)
                for t in range(x.shape[1]):
                    for _ in range(repeats):
                        noise = torch.zeros_like(delta["noise"])
                        noise[0, t] = torch.randn(noise.shape[2]) * sigma
                        delta["noise"] = noise
                        flips += int(model(x).argmax(1) != clean)
    finally:
        handle.remove()
    return flips


def reference_images(model: nn.Module, x: torch.Tensor, sigma: float, repeats: int,
                     patch: int = 4) -> int:
    """One forward per (example, patch, draw) on a single image; noise made on the CPU."""
    flips = 0
    _, c, h, w = x.shape
    with torch.inference_mode():
        for img in x:
            img = img[None]
            clean = model(img).argmax(1)
            for i in range(0, h, patch):
                for j in range(0, w, patch):
                    for _ in range(repeats):
                        pert = img.clone()
                        noise = torch.randn(c, patch, patch) * sigma
                        pert[..., i : i + patch, j : j + patch] += noise
                        flips += int(model(pert).argmax(1) != clean)
    return flips


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(name: str, ref: Callable[[], int], ref_forwards: int, ours: Callable[[], object],
          our_forwards: int) -> dict[str, float]:
    ours()  # warm-up (allocator, kernels)
    t_ref = timed(ref)
    t_ours = timed(ours)
    row = {
        "reference_fwd_per_s": ref_forwards / t_ref,
        "senslab_fwd_per_s": our_forwards / t_ours,
    }
    row["ratio"] = row["senslab_fwd_per_s"] / row["reference_fwd_per_s"]
    print(f"{name:<28} {row['reference_fwd_per_s']:>12.0f} {row['senslab_fwd_per_s']:>12.0f} "
          f"{row['ratio']:>8.1f}x", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke check)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # model initialisation only; the estimator uses its own generator
    n_ref, n_ours = (1, 4) if args.quick else (2, 16)

    print(f"torch {torch.__version__}, {args.threads} threads, device cpu")
    print(f"{'case':<28} {'reference/s':>12} {'senslab/s':>12} {'ratio':>9}")

    text = TextEncoder().eval()
    # chunk sizes: small chunks keep activations in cache on CPU (measured: larger is slower)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8000, (n_ours, 128), generator=g)
    repeats = 1
    bench(
        "text, len 128, 4-layer d256",
        lambda: reference_text(text, ids[:n_ref], 1.0, repeats),
        n_ref * (1 + 128 * repeats),
        lambda: token_sensitivity(text, ids, Embedding("embed_ln"), sigma=1.0, repeats=repeats,
                                  chunk_size=128),
        n_ours * (1 + 128 * repeats),
    )

    from senslab.models import create_model

    lstm = create_model("lstm", dropout=0.0).eval()  # the paper's text baseline: 4×256 LSTM
    mask = torch.ones(n_ours, 128, dtype=torch.bool)
    bench(
        "text, len 128, 4-layer LSTM",
        lambda: reference_text(_Wrap(lstm), ids[:n_ref], 1.0, 1),
        n_ref * (1 + 128),
        lambda: token_sensitivity(lstm, {"input_ids": ids, "attention_mask": mask},
                                  Embedding("embed_ln"), sigma=1.0, chunk_size=128),
        n_ours * (1 + 128),
    )

    vit = ViT().eval()
    images = torch.randn(n_ours, 3, 32, 32, generator=g)
    repeats = 5 if not args.quick else 2
    bench(
        "ViT, 32x32, 64 patches",
        lambda: reference_images(vit, images[:n_ref], 0.1, repeats),
        n_ref * (1 + 64 * repeats),
        lambda: token_sensitivity(vit, images, Patches(4), sigma=0.1, repeats=repeats,
                                  chunk_size=320),
        n_ours * (1 + 64 * repeats),
    )


if __name__ == "__main__":
    main()
