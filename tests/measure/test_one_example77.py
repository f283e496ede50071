"""One example: the result reads "1 example", not "1 examples"."""

from __future__ import annotations

import torch

from senslab import Patches, token_sensitivity
from senslab.models import create_model


def test_one_example_reads_in_the_singular() -> None:
    model = create_model("mlp", image_size=8, seed=0).eval()
    x = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    r = token_sensitivity(model, x, Patches(2), sigma=5.0, repeats=4, generator=0,
                          estimand="subset")
    assert "; 1 example," in str(r)
    r2 = token_sensitivity(model, x.repeat(2, 1, 1, 1), Patches(2), sigma=5.0, repeats=4,
                           generator=0)
    assert "; 2 examples," in str(r2)
