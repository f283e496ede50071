"""Benchmark cases (zoo models at initialisation with their inputs) and the reference
algorithms senslab's estimator is compared with.

The references are written as a researcher would first write them, following the paper code:

* text (and the Boolean transformer): one sentence at a time; for every token, ``repeats`` (3)
  noise rows are drawn on the CPU and copied row by row (to the model's device) into a
  (repeats, T, D) delta that a forward hook adds after the token module; one forward pass per
  token holds the ``repeats`` copies of that one sentence.
* images: one image at a time; for every patch, ``repeats`` (5) random noise masks are drawn on
  the CPU, copied to the model's device and added to copies of the image; one forward pass per
  patch holds the 5 copies.

Both compute the same quantity as senslab (flip rate over tokens and draws), so forward passes per
second compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from senslab.models import create_model
from senslab.tokens import Embedding, Patches, Tokenization
from senslab.tokens.base import call_model, select


@dataclass
class Case:
    """One model to benchmark: ``inputs`` hold ``n`` examples of ``length`` tokens."""

    name: str
    kind: str  # "text" or "image"
    model: nn.Module
    inputs: Any
    tokens: Tokenization
    sigma: float
    repeats: int
    length: int
    extra: dict[str, Any] = field(default_factory=dict)

    def subset(self, n: int) -> Any:
        return select(self.inputs, torch.arange(n))


def make_cases(
    names: list[str], n: int, generator: torch.Generator, overrides: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
) -> list[Case]:
    """The suite of issue #7: 32×32×3 images (64 patches of 4×4), length-128 text, n = 20 bits.
    Noise levels: σ = 0.1 on images (paper code), σ² = 1 on text and bits. ``overrides`` go to
    ``create_model`` (e.g. smaller models for tests of the benchmark); model and inputs are
    moved to ``device``."""
    out = []
    for name in names:
        model = create_model(name, **(overrides or {}))
        model.eval().to(device)
        if name in ("vit_small", "resnet18"):
            x = torch.rand(n, 3, 32, 32, generator=generator) * 2 - 1
            out.append(Case(name, "image", model, x, Patches(4), 0.1, 5, 64))
        elif name in ("lstm", "roberta"):
            ids = torch.randint(2, 8000, (n, 128), generator=generator)
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool)}
            out.append(Case(name, "text", model, batch, Embedding("embed_ln"), 1.0, 3, 128))
        elif name == "boolean_transformer":
            bits = torch.randint(0, 2, (n, 20), generator=generator).float() * 2 - 1
            out.append(Case(name, "text", model, bits, Embedding("bit_embed"), 1.0, 3, 20))
        else:
            raise ValueError(f"no benchmark case for model {name!r}")
        out[-1].inputs = _to(out[-1].inputs, device)
    return out


def _to(inputs: Any, device: str | torch.device) -> Any:
    if isinstance(inputs, dict):
        return {k: v.to(device) for k, v in inputs.items()}
    return inputs.to(device)


def flops_per_forward(case: Case) -> float:
    """Model FLOPs of one forward pass on one example (FlopCounterMode: matmuls, convolutions;
    attention through the math backend, whose matmuls are counted on every device; recurrent
    layers counted analytically, replacing whatever the counter saw of them, which depends on
    the device's kernel)."""
    one = case.subset(1)
    with (sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter,
          torch.inference_mode()):
        call_model(case.model, one)
    flops = float(counter.get_total_flops())
    per_module = counter.get_flop_counts()
    for name, m in case.model.named_modules():
        if isinstance(m, nn.LSTM):  # gates: 4H × (in + H) multiply-adds per step and layer
            flops -= sum(per_module.get(f"{type(case.model).__name__}.{name}", {}).values())
            h = m.hidden_size
            for layer in range(m.num_layers):
                inp = m.input_size if layer == 0 else h
                flops += 2 * 4 * h * (inp + h) * case.length
    return flops


def predict(out: torch.Tensor) -> torch.Tensor:
    """Predicted class: the sign of a single score, else the arg-max logit."""
    return out.reshape(-1) > 0 if out.dim() == 1 or out.shape[-1] == 1 else out.argmax(-1)


def reference(case: Case, examples: int, tokens: int, generator: torch.Generator) -> int:
    """Run the reference algorithm on the first ``examples`` examples, ``tokens`` tokens each;
    returns the forward passes (single-example evaluations) it made."""
    if case.kind == "image":
        return _reference_images(case, examples, tokens, generator)
    return _reference_text(case, examples, tokens, generator)


def _reference_text(case: Case, examples: int, tokens: int, g: torch.Generator) -> int:
    module = case.model.get_submodule(case.tokens.module)  # type: ignore[attr-defined]
    state: dict[str, Any] = {"noise": None, "dim": 0}

    def hook(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor | None:
        if state["noise"] is None:
            state["dim"] = out.shape[-1]  # the clean pass tells the token width
            return None
        return out + state["noise"]

    handle = module.register_forward_hook(hook)
    flips = forwards = 0
    r = case.repeats
    device = next(case.model.parameters()).device
    try:
        with torch.inference_mode():
            for b in range(examples):
                one = select(case.inputs, torch.tensor([b]))
                state["noise"] = None
                clean = predict(call_model(case.model, one))
                copies = select(one, torch.zeros(r, dtype=torch.long))
                forwards += 1
                for t in range(tokens):
                    noise = torch.zeros(r, case.length, state["dim"], device=device)
                    for i in range(r):  # made on the CPU, copied row by row
                        noise[i, t] = (torch.randn(state["dim"], generator=g) * case.sigma).to(
                            device)
                    state["noise"] = noise
                    flips += int((predict(call_model(case.model, copies)) != clean).sum())
                    forwards += r
    finally:
        handle.remove()
    return forwards


def _reference_images(case: Case, examples: int, tokens: int, g: torch.Generator) -> int:
    p = case.tokens.size  # type: ignore[attr-defined]
    _, c, h, w = case.inputs.shape
    per_row = w // p
    flips = forwards = 0
    device = case.inputs.device
    with torch.inference_mode():
        for img in case.inputs[:examples]:
            img = img[None]
            clean = case.model(img).argmax(1)
            forwards += 1
            for t in range(tokens):
                i, j = (t // per_row) * p, (t % per_row) * p
                batch = img.repeat(case.repeats, 1, 1, 1)
                for k in range(case.repeats):  # one random mask per copy, noise made on the CPU
                    mask = torch.zeros(c, h, w)
                    mask[:, i : i + p, j : j + p] = torch.randn(c, p, p, generator=g)
                    batch[k] += (mask * case.sigma).to(device)
                flips += int((case.model(batch).argmax(1) != clean).sum())
                forwards += case.repeats
    return forwards
