"""The zoo's reuse paths (local reuse of ResNet and ViT-small, prefix reuse of the LSTM and GPT-2)
give a full forward's numbers or refuse: after the weights changed in a way PyTorch counts no
version for, and with any part of the model in train mode, where the reuse (which computes an
eval-mode forward) would silently disagree with the model's own forward."""

from __future__ import annotations

import pytest
import torch

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding, Patches

from .test_local_reuse import every_patch, perturbed_full, resnet
from .test_text_models import make_batch, prefix_model


def local_gap(model, x, patch=4, seed=1):
    """Largest gap between ``forward_local`` and full forwards over one noisy copy per patch
    of every image of ``x``, and the largest logit (the scale of the gap)."""
    rows, top, left = every_patch(len(x), x.shape[-1], patch)
    noisy = torch.randn(len(rows), x.shape[1], patch, patch,
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        fast = model.forward_local(model.local_cache(x, patch), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    return float((fast - full).abs().max()), float(full.abs().max())


# ------------------------------------------- ResNet: a convolution's weights edited via .data


def test_a_convolution_edited_through_data_is_folded_again():
    """``weight.data`` edits move no version counter, and the stem's fold (its BatchNorm folded
    into it) was kept: every window then ran the old weights (a gap of ~19 on logits of ~86)."""
    model = resnet(16, stats=True, sens_patch=4)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    gap, size = local_gap(model, x)
    assert gap < 1e-5 * size
    conv = model.features[0][0]
    with torch.no_grad():
        before = model(x)
    conv.weight.data.mul_(-1.5)  # as a hand-made weight perturbation or a .data assignment
    with torch.no_grad():
        assert not torch.allclose(model(x), before, atol=1.0)  # the edit matters
    gap, size = local_gap(model, x)
    assert gap < 1e-5 * size


def test_a_measurement_follows_a_convolution_edited_through_data_between_updates():
    """One metric over two updates of the same input shape (verified once): between them the
    stem's weights are edited through ``.data``. The second update must count the flips of full
    forwards of the edited model (before the fix: the old model's, 0.156 against 0.297)."""
    model = resnet(16, sens_patch=4)
    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    opts = {"sigma": 1.0, "repeats": 1, "generator": 2, "precision": "float32"}
    fast = TokenSensitivity(model, Patches(4), **opts)
    full = TokenSensitivity(model, Patches(4, reuse_local=False), **opts)
    for m in (fast, full):
        m.update(x)
    weight = model.features[0][0].weight
    weight.data.copy_(weight.data.flip(1))  # the colour channels swapped
    for m in (fast, full):
        m.reset()  # the noise stream goes on, the same for both
        m.update(x)
    after = full.compute()
    assert 0.01 < after.estimate < 0.99
    assert torch.equal(fast.compute().per_sample, after.per_sample)


# ------------------------------------------------ a submodule left in train mode: refused


def _vit():
    return create_model("vit_small", image_size=16, patch_size=4, dim=32, depth=2, heads=4,
                        dim_head=8, mlp_dim=64).eval()


def _cache_call(name):
    """(model in eval mode, a submodule name, a call that builds its reuse cache)."""
    if name == "resnet":
        model = resnet(16, stats=True, sens_patch=4)
        x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        return model, "features.0.1", lambda: model.local_cache(x, 4)
    if name == "vit":
        model = _vit()
        x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        return model, "blocks.0.attn.drop", lambda: model.local_cache(x, 4)
    model = prefix_model(name)
    ids, mask = make_batch(lengths=[9, 4, 1, 7])
    with torch.no_grad():
        tokens = model.embed_ln(model.embed(ids))
    batch = {"input_ids": ids, "attention_mask": mask}
    sub = "drop" if name == "lstm" else "blocks.1.drop"
    return model, sub, lambda: model.prefix_cache(tokens, batch)


@pytest.mark.parametrize("name", ["resnet", "vit", "lstm", "gpt2"])
def test_a_cache_refuses_a_submodule_left_in_train_mode(name):
    """An eval model with one BatchNorm or Dropout switched back to train mode: the reuse path
    would compute without it (running statistics, no dropout) while the model's forward uses
    it, so building the cache is refused, naming the submodule."""
    model, sub, build = _cache_call(name)
    with torch.no_grad():
        build()  # all in eval mode: fine
    model.get_submodule(sub).train()
    with pytest.raises(RuntimeError, match=rf"reuse needs eval mode.*{sub.replace('.', '[.]')}"):
        with torch.no_grad():
            build()


def test_a_measurement_in_the_models_own_mode_refuses_reuse_past_a_train_mode_dropout():
    """``eval_mode=False`` on GPT-2 in eval mode but with its blocks' dropout on: full forwards
    are random and refused; prefix reuse, which applies no dropout, returned a number (0.68)
    for a model without the dropout. Now it is refused too."""
    model = prefix_model("gpt2")
    for block in model.blocks:
        block.drop.p = 0.5
        block.drop.train()
    ids, mask = make_batch(lengths=[9, 4, 1, 7])
    batch = {"input_ids": ids, "attention_mask": mask}
    for reuse, why in ((False, "output changed between two evaluations"),
                       (True, "prefix reuse needs eval mode.*blocks[.]0[.]drop")):
        with pytest.raises(RuntimeError, match=why):
            token_sensitivity(model, batch, Embedding("embed_ln", reuse_prefix=reuse),
                              sigma=2.0, generator=3, eval_mode=False, trim_padding=False)


# ---------------------------------------- a reuse path called after model.train(): refused


def _reuse_call(name):
    """(model, a call of its reuse path on a cache built in eval mode)."""
    g = torch.Generator().manual_seed(4)
    if name in ("resnet", "vit"):
        model = resnet(16, stats=True, sens_patch=4) if name == "resnet" else _vit()
        x = torch.rand(2, 3, 16, 16, generator=g)
        rows, top, left = every_patch(2, 16, 4)
        noisy = torch.randn(len(rows), 3, 4, 4, generator=g)
        with torch.no_grad():
            cache = model.local_cache(x, 4)
        return model, lambda: model.forward_local(cache, rows, top, left, noisy)
    model = prefix_model(name)
    ids, mask = make_batch(lengths=[9, 4, 1, 7])
    with torch.no_grad():
        tokens = model.embed_ln(model.embed(ids))
        cache = model.prefix_cache(tokens, {"input_ids": ids, "attention_mask": mask})
    src = torch.tensor([0, 1, 3, 0])
    tok = torch.tensor([2, 3, 0, 8])
    noise = torch.randn(4, tokens.shape[-1], generator=g)
    return model, lambda: model.forward_suffix(cache, src, tok, noise)


@pytest.mark.parametrize("name", ["resnet", "vit", "lstm", "gpt2"])
def test_a_reuse_path_refuses_a_model_switched_to_train_mode(name):
    """A cache built in eval mode, then ``model.train()``: the reuse path returned eval-style
    numbers (the LSTM's differed from its train-mode forward by 0.72 on logits of 0.98); it is
    refused, as the cache builders refuse train mode."""
    model, call = _reuse_call(name)
    with torch.no_grad():
        call()  # eval mode: fine
    model.train()
    with pytest.raises(RuntimeError, match="train mode"), torch.no_grad():
        call()
    model.eval()
    with torch.no_grad():
        call()

