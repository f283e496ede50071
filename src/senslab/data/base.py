"""The in-memory dataset every loader returns."""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset


def check_severity(severity: Any, what: str = "", why: str = "") -> int:
    """``severity`` as an int 1..5 (a corruption's, CIFAR-10-C's): a bool and a float are
    refused, as any other value (True passed as severity 1, and 2.0 failed later as a bare
    slice-index TypeError). ``what`` prefixes the message (the loader); ``why`` follows the
    values (what the five are)."""
    if isinstance(severity, bool) or not isinstance(severity, numbers.Integral) \
            or severity not in (1, 2, 3, 4, 5):
        raise ValueError(f"{what}severity must be one of 1, 2, 3, 4, 5, an int{why}; got "
                         f"{severity!r}")
    return int(severity)


def whole_number(value: object) -> int | None:
    """``value`` as an int when it is exactly one (an int of any size, NumPy's and torch's
    integers, 2.0, "3"), else ``None`` (a bool, NumPy's included, 1.7, a string that is not a
    number): ``int()`` cut 1.7 to 1 and read True as 1, each without a word."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]  (ints of any size, exactly)
    except TypeError:
        pass
    try:
        out = int(value)  # type: ignore[call-overload]
        whole = float(value) == out  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return out if whole else None


@dataclass
class ArrayDataset(Dataset):
    """Examples held as tensors in memory (data loading is never the bottleneck).

    ``inputs`` is a tensor with the example axis first (images: float32 (N, C, H, W) normalised),
    or a dict of such tensors (text: ``input_ids`` (N, L) long and ``attention_mask`` (N, L) bool).
    ``targets`` is (N,) long for classification (or float for regression).
    """

    inputs: Tensor | dict[str, Tensor]
    targets: Tensor
    num_classes: int
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.targets)
        for k, v in self._input_items():
            if v.shape[0] != n:
                raise ValueError(f"{self.name}: input {k!r} has {v.shape[0]} rows, targets {n}")
        # subset() cuts these with the examples: a missing key or a row count of its own would
        # fail there, or pair each example with another one's metadata without a word
        for key in self.meta.get("per_example", ()):
            if key not in self.meta:
                raise ValueError(f"{self.name}: meta['per_example'] lists {key!r}, which meta "
                                 "lacks; add it (one row per example) or drop it from the list")
            value = self.meta[key]
            try:
                rows = value.shape[0] if hasattr(value, "shape") else len(value)
            except (TypeError, IndexError):  # a scalar: no rows at all
                rows = None
            if rows != n:
                raise ValueError(f"{self.name}: meta[{key!r}] is listed in meta['per_example'] "
                                 f"but has {rows} rows for {n} examples; give it one row per "
                                 "example or drop it from the list")

    def _input_items(self) -> list[tuple[str, Tensor]]:
        if isinstance(self.inputs, Tensor):
            return [("inputs", self.inputs)]
        return list(self.inputs.items())

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, Tensor]:
        if isinstance(self.inputs, Tensor):
            return self.inputs[i], self.targets[i]
        return {k: v[i] for k, v in self.inputs.items()}, self.targets[i]

    def batch(self, index: Tensor | slice) -> tuple[Tensor | dict[str, Tensor], Tensor]:
        """Inputs and targets of many examples at once (fancy indexing, no collate loop)."""
        if isinstance(self.inputs, Tensor):
            return self.inputs[index], self.targets[index]
        return {k: v[index] for k, v in self.inputs.items()}, self.targets[index]

    def subset(self, index: Tensor | slice) -> ArrayDataset:
        """The examples at ``index``; metadata listed in ``meta["per_example"]`` (one row per
        example: labels on ±1, token types, cube indices…) is cut alike, the rest is kept."""
        x, y = self.batch(index)
        meta = dict(self.meta)
        for key in meta.get("per_example", ()):
            value = meta[key]
            if isinstance(value, (list, tuple)):  # a tensor index, or a mask, cannot cut a list
                rows = torch.arange(len(value))[index].tolist()
                meta[key] = type(value)(value[i] for i in rows)
            else:
                meta[key] = value[index]
        return ArrayDataset(x, y, self.num_classes, self.name, meta)

    def to(self, device: torch.device | str) -> ArrayDataset:
        """The same examples with every tensor on ``device``."""
        x = (self.inputs.to(device) if isinstance(self.inputs, Tensor)
             else {k: v.to(device) for k, v in self.inputs.items()})
        return ArrayDataset(x, self.targets.to(device), self.num_classes, self.name,
                            dict(self.meta))

    def first(self, n: int, generator: torch.Generator | None = None) -> ArrayDataset:
        """``n`` examples: the first ``n``, or a random ``n`` drawn with ``generator`` (a
        ``torch.Generator``; a seed given in its place is refused, naming the fix). ``n``
        must be in ``0 .. len(self)``: a larger ``n`` gave fewer examples than asked for and a
        negative one all but the last ``-n``, each without a word."""
        try:
            k = None if isinstance(n, bool) else operator.index(n)
        except TypeError:
            k = None
        if k is None or not 0 <= k <= len(self):
            raise ValueError(f"{self.name or 'dataset'}: asked for n={n!r} examples of "
                             f"{len(self):,}; pass a whole number in 0..{len(self):,}, e.g. "
                             f"min(n, len(data))")
        n = k
        if generator is None:
            return self.subset(slice(0, n))
        if not isinstance(generator, torch.Generator):  # torch's raw randperm TypeError
            raise TypeError(f"{self.name or 'dataset'}: generator={generator!r} is not a "
                            "torch.Generator: pass generator=torch.Generator().manual_seed(seed) "
                            "for a random n (seed an int), or leave it out for the first n")
        return self.subset(torch.randperm(len(self), generator=generator)[:n])
