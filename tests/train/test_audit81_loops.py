"""The trainers' own loops (audit 81): the grokking sensitivity's noise is drawn independently of
the model's initial weights, and the pretrained trainer scores accuracy in the label space of the
model's own head."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from one_thread import _one_thread_quiet  # noqa: F401  (autouse)
from torch.nn.modules.module import register_module_forward_pre_hook

from senslab.models.text import Block
from senslab.train.loops.grokking import grokking_model
from senslab.train.trainers import get_trainer, train_run


# -- grokking: the noise is not the model's initial embedding table --------------------------------
def test_grokking_sensitivity_noise_is_not_the_initial_embedding_table(tmp_path: Path) -> None:
    """The noise added to the number embeddings at the epoch-0 evaluation, read back from the
    block's input (embedding + noise + position). Before: it was drawn from ``seed``, the
    generator the model's initialisation drew its embedding table from first, so every row of
    that table came back as a noise vector (cos = 1.000): the first p + 1 copies of every
    evaluation pushed a number towards another number's initial embedding, which a trained
    model reads (a memorised p = 23 model flipped on 10% of such copies, 4.6% with fresh
    noise)."""
    cfg = dataclasses.replace(get_trainer("grokking").example(), epochs=1, eval_every=1,
                              sens_examples=16)
    init = grokking_model(cfg)
    table, pos = init.embed.weight.detach(), init.pos_embedding.detach()
    seen: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if isinstance(module, Block) and not torch.is_grad_enabled():
            seen.append(args[0].detach().clone())

    hook = register_module_forward_pre_hook(keep)
    try:
        train_run("grokking", cfg, tmp_path / "run", progress=False, log=lambda _: None)
    finally:
        hook.remove()
    rows = torch.cat(seen)
    untrained = rows[(rows[:, 2] == table[cfg.p] + pos[2]).all(dim=1)]  # the epoch-0 passes
    noise = []
    for row in untrained:
        for t in (0, 1):  # the number positions; the nearest table row is the clean token
            v = row[t] - pos[t]
            d = (v - table[(table - v).norm(dim=1).argmin()]) / cfg.sigma
            if d.norm() > 1e-2:
                noise.append(d)
    assert len(noise) >= 2 * cfg.sens_examples  # every token of the 16 pairs was perturbed
    cos = F.cosine_similarity(torch.stack(noise).unsqueeze(1), table.unsqueeze(0), dim=2)
    assert cos.abs().max() < 0.9  # before: 1.000 (the table itself)


# -- pretrained: accuracy in the head's own label space --------------------------------------------
WNIDS = ["n01440764", "n01443537"]  # ImageNet-1k classes 0 and 1 (tench, goldfish)


def test_pretrained_targets_are_the_indices_of_the_models_own_label_set() -> None:
    """Before: the folders' ImageNet-1k indices were the targets of every model, so a head over
    the 21,843 ImageNet-21k classes (where tench is class 359) that was right on every image
    scored train/acc 0.0. Now: the model's own label set; none for a head without one."""
    timm = pytest.importorskip("timm")
    from senslab.train.loops.pretrained import class_indices

    if not hasattr(timm.data, "infer_imagenet_subset"):
        pytest.skip("this timm cannot name a head's ImageNet label set")
    in1k = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=1000)
    in21k = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=21843)
    headless = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0)
    other = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)
    assert class_indices(timm, in1k, WNIDS).tolist() == [0, 1]
    names = list(timm.data.ImageNetInfo("imagenet-21k-goog").label_names())
    assert class_indices(timm, in21k, WNIDS).tolist() == [names.index(w) for w in WNIDS]
    assert class_indices(timm, in21k, WNIDS).tolist() != [0, 1]
    assert class_indices(timm, headless, WNIDS) is None  # features, not classes
    assert class_indices(timm, other, WNIDS) is None
