"""Local reuse: a copy with one noisy patch computed on windows of the early feature maps
(senslab.models.windows; ResNet and CNN ``forward_local``), or on the tokens the patch reaches and
the CLS row of the last block (ViT-small's ``forward_local``), equals a full forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.models import create_model
from senslab.models.windows import Window, fold, read
from senslab.tokens import Patches
from senslab.tokens import patches as patches_module


def resnet(image: int, stats: bool = False, **overrides):
    """A narrow ResNet whose predictions depend on its input (at PyTorch's init it predicts one
    class for every image): He-normal weights and spread-out BatchNorm affines, all drawn from a
    seeded generator; ``stats``: spread-out running statistics too."""
    g = torch.Generator().manual_seed(0)
    model = create_model("resnet18", image_size=image, num_classes=10,
                         **{"width": 0.125, **overrides})
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2 / fan_in) ** 0.5)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.3)
                if not stats:
                    continue
                # running statistics as training leaves them (forward_local folds them into
                # the convolutions)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model.eval()


def every_patch(images, side, patch):
    """(rows, top, left) of one copy per patch position of every image (corners and borders
    included) for ``images`` images of ``side``×``side`` pixels."""
    grid = side // patch
    rows = torch.arange(images).repeat_interleave(grid * grid)
    tok = torch.arange(grid * grid).repeat(images)
    return rows, tok // grid * patch, tok % grid * patch


def perturbed_full(model, x, rows, top, left, patch):
    """The reference: paste each copy's patch into its image and run the whole model."""
    copies = x[rows].clone()
    p = patch.shape[-1]
    for i in range(len(rows)):
        copies[i, :, top[i]:top[i] + p, left[i]:left[i] + p] = patch[i]
    return model(copies)


@pytest.mark.parametrize("image, patch, blocks, windowed", [
    (32, 4, (2, 2, 2, 2), 4),   # ResNet-18: stem, stages 1 and 2 on windows
    (32, 4, (1, 1, 1, 1), 3),   # two strided blocks with 1×1 shortcuts on windows
    (16, 2, (2, 2, 2, 2), 2),
    (16, 8, (2, 2, 2, 2), 1),   # a large patch: the stem and one block
])
def test_forward_local_equals_full_forward(image, patch, blocks, windowed):
    model = resnet(image, stats=True, blocks=blocks, sens_patch=patch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, image, image, generator=g)
    rows, top, left = every_patch(3, image, patch)
    noisy = torch.randn(len(rows), 3, patch, patch, generator=g)
    with torch.no_grad():
        cache = model.local_cache(x, patch)
        fast = model.forward_local(cache, rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    assert cache["blocks"] == windowed
    assert fast.shape == full.shape == (len(rows), 10)
    # folded BatchNorms and another order of summation: equal up to float rounding
    torch.testing.assert_close(fast, full, rtol=1e-4, atol=1e-6 * float(full.abs().max()))
    assert not torch.allclose(full, model(x)[rows], atol=1e-3)  # the noise did change outputs


def test_read_pastes_the_window_and_zero_pads():
    clean = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).view(2, 1, 4, 4)  # value 4·row + col
    data = -torch.arange(1.0, 5.0).view(1, 1, 2, 2).repeat(2, 1, 1, 1)  # [[-1, -2], [-3, -4]]
    # copy 0 reads image 1 and has its window on rows 0–1, cols 0–1; copy 1 reads image 0, window
    # on rows 2–3, cols 2–3
    win = Window(clean, torch.tensor([1, 0]), data, torch.tensor([0, 2]), torch.tensor([0, 2]))
    # 3 × 2 regions: copy 0 from (−1, −1): a row and a column of zero padding, the window's
    # column 1 outside; copy 1 from (1, 3): column 4 is padding, the window's column 2 outside
    out = read(win, torch.tensor([-1, 1]), torch.tensor([-1, 3]), 3, 2, pad=1)
    assert out.shape == (2, 1, 3, 2)
    assert out[0, 0].tolist() == [[0, 0], [0, -1], [0, -3]]
    assert out[1, 0].tolist() == [[7, 0], [-2, 0], [-4, 0]]
    # 1 × 2 regions; copy 1's is the padding row below the map, the whole window above it
    out = read(win, torch.tensor([0, 4]), torch.tensor([0, 2]), 1, 2, pad=1)
    assert out[0, 0].tolist() == [[-1, -2]]
    assert out[1, 0].tolist() == [[0, 0]]


def test_read_lays_out_each_clean_map_once():
    g = torch.Generator().manual_seed(0)
    clean = torch.randn(3, 5, 6, 6, generator=g)
    store: dict[int, torch.Tensor] = {}
    rows, top = torch.tensor([2, 0]), torch.tensor([1, 3])
    outs = []
    for _ in range(2):
        data = torch.randn(2, 5, 2, 2, generator=g)
        win = Window(clean, rows, data, top, top, store)
        out = read(win, top - 1, top - 1, 4, 4, pad=1)
        # the reference: the padded clean maps with each window pasted in
        ref = torch.nn.functional.pad(clean, (1, 1, 1, 1))[rows]
        for i in range(2):
            ref[i, :, top[i] + 1:top[i] + 3, top[i] + 1:top[i] + 3] = data[i]
        assert torch.equal(out, torch.stack([ref[i, :, top[i]:top[i] + 4, top[i]:top[i] + 4]
                                             for i in range(2)]))
        assert out.is_contiguous(memory_format=torch.channels_last)  # what convolutions read
        outs.append(store[1])
    assert list(store) == [1] and outs[0] is outs[1]  # laid out by the first read, then reused


@pytest.mark.parametrize("bias, affine", [(False, True), (True, True), (True, False)])
def test_fold_equals_the_convolution_then_its_batchnorm(bias, affine):
    g = torch.Generator().manual_seed(0)
    layer = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=bias),
                          nn.BatchNorm2d(4, affine=affine))
    with torch.no_grad():
        for t in [*layer.parameters(), layer[1].running_mean]:
            t.copy_(torch.randn(t.shape, generator=g))
        layer[1].running_var.copy_(torch.rand(4, generator=g) + 0.1)
    layer.eval()
    x = torch.randn(2, 3, 5, 5, generator=g)
    weight, shift = fold(layer)
    torch.testing.assert_close(torch.nn.functional.conv2d(x, weight, shift, padding=1), layer(x),
                               rtol=1e-5, atol=1e-5)
    assert fold(layer.train()) is None  # batch statistics: nothing to fold
    assert fold(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False)
                              ).eval()) is None
    assert fold(layer[0]) is None


def assert_same_gradients(model, side, top, left):
    """The gradient of a logit with respect to two copies' patches (4×4 at ``top``/``left`` of
    two ``side``×``side`` images) is the same through ``forward_local`` as through full
    forwards, and not zero."""
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(0))
    rows, top, left = torch.tensor([0, 1]), torch.tensor(top), torch.tensor(left)
    grads = []
    for local in (True, False):
        patch = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1),
                            requires_grad=True)
        if local:
            out = model.forward_local(model.local_cache(x, 4), rows, top, left, patch)
        else:
            out = perturbed_full(model, x, rows, top, left, patch)
        grads.append(torch.autograd.grad(out[:, 3].sum(), patch)[0])
    assert grads[1].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_forward_local_keeps_the_gradient():
    assert_same_gradients(resnet(16, stats=True, sens_patch=4), 16, [0, 8], [4, 12])


@pytest.mark.parametrize("options", [
    {"repeats": 3},
    {"repeats": 4, "antithetic": True, "num_tokens": 5},
    {"repeats": 2, "chunk_size": 7},  # the cache is rebuilt for the examples of each chunk
    {"repeats": 2, "compare": "l2"},
])
def test_local_reuse_gives_the_full_forwards_numbers(options):
    model = resnet(16, sens_patch=4)
    x = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    runs = {}
    for reuse in (False, True):
        m = TokenSensitivity(model, Patches(4, reuse_local=reuse), sigma=0.5, generator=2,
                             **options)
        m.update(x)
        runs[reuse] = m.compute()
    full, fast = runs[False], runs[True]
    assert full.num_forward == fast.num_forward
    if options.get("compare") == "l2":
        assert full.estimate > 1e-3
        torch.testing.assert_close(fast.per_sample, full.per_sample, rtol=1e-4, atol=1e-7)
    else:
        assert 0.02 < full.estimate < 0.98
        assert torch.equal(full.per_sample, fast.per_sample)


@pytest.mark.parametrize("ahead", [1, 8])
def test_cache_holds_a_chunks_examples_and_the_next_ones(monkeypatch, ahead):
    """The clean maps of a chunk's examples, made together with the examples after them up to
    LOCAL_AHEAD in all (the next chunks read them: one call instead of one per example, at
    batch-1 speed), and never more than a chunk's own examples beyond that."""
    monkeypatch.setattr(patches_module, "LOCAL_AHEAD", ahead)
    model = resnet(16, sens_patch=4)
    sizes = []
    original = model.local_cache

    def recording(x, patch):
        sizes.append(len(x))
        return original(x, patch)

    model.local_cache = recording
    x = torch.rand(12, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    full = token_sensitivity(model, x, Patches(4, reuse_local=False), sigma=0.5, repeats=2,
                             chunk_size=12)
    fast = token_sensitivity(model, x, Patches(4), sigma=0.5, repeats=2, chunk_size=12)
    assert torch.equal(fast.per_sample, full.per_sample)
    # 16 patches × 2 draws = 32 copies per example, chunks of 12: at most 2 examples per chunk
    if ahead == 1:
        assert max(sizes) <= 2 and sum(sizes) >= 12  # every example cached at least once
    else:
        # examples 0–7, then 7–11 for the chunk of copies 252–263 (examples 7 and 8): two calls
        assert sizes == [8, 5]


def test_train_mode_and_whole_input_run_full_forwards():
    model = resnet(16, sens_patch=4).train()
    for m in model.modules():  # batch statistics are refused outside eval mode
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    # the cache refuses train mode, so a result means full forwards were run
    r = token_sensitivity(model, x, Patches(4), sigma=0.5, eval_mode=False)
    assert r.num_forward == 2 + 2 * 16
    with pytest.raises(RuntimeError, match="eval mode"):
        model.local_cache(x, 4)
    model.eval()
    whole = token_sensitivity(model, x, Patches(4), sigma=0.5, mode="whole", repeats=3)
    assert whole.num_forward == 2 + 2 * 3


def cnn(**overrides):
    return create_model("cnn", channels=(4, 8), hidden=16, **overrides).eval()


@pytest.mark.parametrize("patch, kernel", [(4, 3), (7, 3), (2, 5)])
def test_cnn_forward_local_equals_full_forward(patch, kernel):
    model = cnn(kernel_size=kernel, sens_patch=patch)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 1, 28, 28, generator=g)
    rows, top, left = every_patch(2, 28, patch)
    noisy = torch.randn(len(rows), 1, patch, patch, generator=g) * 3
    with torch.no_grad():
        fast = model.forward_local(model.local_cache(x, patch), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    torch.testing.assert_close(fast, full, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(full, model(x)[rows], atol=1e-4)


def test_cnn_local_reuse_gives_the_full_forwards_numbers():
    model = cnn()
    x = torch.rand(6, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    runs = {}
    for reuse in (False, True):
        m = TokenSensitivity(model, Patches(4, reuse_local=reuse), sigma=4.0, repeats=2,
                             generator=2, chunk_size=40)
        m.update(x)
        runs[reuse] = m.compute()
    assert 0.02 < runs[False].estimate < 0.98
    assert torch.equal(runs[False].per_sample, runs[True].per_sample)


def test_layers_local_reuse_cannot_window_are_refused():
    from senslab.models.windows import local

    win = Window(torch.zeros(1, 1, 8, 8), torch.zeros(1, dtype=torch.long),
                 torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.long),
                 torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="undilated"):
        local(nn.Conv2d(1, 1, 3, dilation=2), win)
    with pytest.raises(ValueError, match="unpadded pooling"):
        local(nn.MaxPool2d(2, padding=1), win)
    with pytest.raises(TypeError, match="cannot window a Linear"):
        local(nn.Linear(2, 2), win)


def vit(**overrides):
    config = dict(image_size=16, dim=16, depth=3, heads=2, dim_head=8, mlp_dim=32)
    return create_model("vit_small", seed=0, **{**config, **overrides}).eval()


@pytest.mark.parametrize("overrides, patch", [
    ({}, 4),
    ({}, 2),                          # noise on a quarter of a model patch
    ({}, 8),                          # noise over four model patches
    ({"shift": "diagonal"}, 4),
    ({"shift": "none", "locality": False}, 4),
    ({"attention": "relu"}, 4),
    ({"depth": 1}, 4),                # the first block is the last: no CLS-only block
    ({"depth": 2, "patch_size": 2}, 4),
    # heads as wide as the tokens (ViT-small: 64 and 64): fused query-key and value-output
    # weights, keys and values the normalised tokens themselves
    ({"dim_head": 16}, 4),
    ({"dim_head": 16, "depth": 1}, 4),
    ({"dim_head": 16, "locality": False, "shift": "diagonal"}, 2),
])
def test_vit_forward_local_equals_full_forward(overrides, patch):
    model = vit(**overrides)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    rows, top, left = every_patch(2, 16, patch)
    noisy = torch.randn(len(rows), 3, patch, patch, generator=g) * 2
    with torch.no_grad():
        fast = model.forward_local(model.local_cache(x, patch), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    torch.testing.assert_close(fast, full, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(full, model(x)[rows], atol=1e-3)
    fused = model.local_cache(x, patch)["fused"]
    assert all((f is not None) == (overrides.get("dim_head", 8) >= 16
                                   and overrides.get("attention") != "relu") for f in fused)


def test_vit_fused_attention_keeps_its_memory_and_changes_nothing():
    """Without autograd on the host the fused attention writes into memory kept in the cache
    (no fresh mapping per call): the same outputs as full forwards for chunks that grow and
    shrink, no new memory for a smaller chunk; with autograd the plain path and a gradient."""
    model = vit(dim_head=16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    rows, top, left = every_patch(2, 16, 4)
    noisy = torch.randn(len(rows), 3, 4, 4, generator=g) * 2
    cache = model.local_cache(x, 4)
    with torch.no_grad():
        full = perturbed_full(model, x, rows, top, left, noisy)
        for sl in (slice(0, 5), slice(5, 30), slice(30, 32)):
            out = model.forward_local(cache, rows[sl], top[sl], left[sl], noisy[sl])
            torch.testing.assert_close(out, full[sl], rtol=1e-4, atol=1e-5)
        kept = {k: v.data_ptr() for k, v in cache["scratch"].items()}
        # the attention's intermediates, its output, the MLP's hidden layer, and the blocks'
        # outputs in turn
        assert set(kept) == {"q", "logits", "weights", "y", "out", "hidden", "block0", "block1"}
        seven = model.forward_local(cache, rows[:7], top[:7], left[:7], noisy[:7])
        assert {k: v.data_ptr() for k, v in cache["scratch"].items()} == kept
    patch = noisy[:7].clone().requires_grad_()
    out = model.forward_local(cache, rows[:7], top[:7], left[:7], patch)
    # the plain path: every query and logit computed afresh
    torch.testing.assert_close(out.detach(), seven, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert patch.grad is not None and float(patch.grad.abs().sum()) > 0


def test_vit_first_block_updates_the_clean_rows_in_any_order_of_copies():
    """The first block computes only the logits against the keys a patch reached and updates
    each clean row's sums; copies of several images interleaved (not in runs of one image)
    give the full forwards' outputs too."""
    model = vit(dim_head=16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 16, 16, generator=g)
    rows, top, left = every_patch(3, 16, 4)
    order = torch.randperm(len(rows), generator=g)
    rows, top, left = rows[order], top[order], left[order]
    noisy = torch.randn(len(rows), 3, 4, 4, generator=g) * 2
    with torch.no_grad():
        fast = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    torch.testing.assert_close(fast, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("share, close", [(0.5, True), (2.0, False)])
def test_vit_first_block_recomputes_rows_the_reached_keys_dominate(monkeypatch, share, close):
    """With sharp attention (a high LSA temperature) some clean rows put nearly all their
    weight on the keys a patch reached; updating them would subtract nearly all of the row's
    sum. Those rows are computed in full (``REACHED_SHARE``): the full forward's outputs, which
    updating every row (a share that never triggers) misses by far more than rounding."""
    from senslab.models import vit as vit_module

    model = vit(dim_head=16, depth=2)
    with torch.no_grad():
        model.blocks[0].attn.log_scale.add_(4.0)  # 55 times sharper
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    rows, top, left = every_patch(2, 16, 4)
    noisy = torch.randn(len(rows), 3, 4, 4, generator=g) * 2
    monkeypatch.setattr(vit_module, "REACHED_SHARE", share)
    with torch.no_grad():
        fast = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
    error = float((fast - full).abs().max())
    assert (error < 1e-5) == close, error


@pytest.mark.parametrize("tile", [1, 3])
def test_vit_fused_attention_in_tiles_of_copies_changes_nothing(monkeypatch, tile):
    """A chunk larger than a tile (``ATTENTION_TILE_BYTES``) runs the attention's logits and
    softmax and output projection a tile of copies at a time: the outputs of the untiled path,
    first block (its clean queries and logits) included, and the tile's memory kept for the
    next tile."""
    from senslab.models import vit as vit_module

    model = vit(dim_head=16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    rows, top, left = every_patch(2, 16, 4)
    noisy = torch.randn(len(rows), 3, 4, 4, generator=g) * 2
    with torch.no_grad():
        whole = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
        t, heads = 17, 2  # 16 patches and CLS; two heads
        monkeypatch.setattr(vit_module, "ATTENTION_TILE_BYTES", tile * t * heads * t * 4)
        monkeypatch.setattr(vit_module, "ATTENTION_TILE_ROWS", 1)
        cache = model.local_cache(x, 4)
        tiled = model.forward_local(cache, rows, top, left, noisy)
    torch.testing.assert_close(tiled, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tiled, full, rtol=1e-4, atol=1e-5)
    kept = cache["scratch"]
    # one tile's logits and mixed tokens kept, not the chunk's; the projection's output whole
    assert kept["logits"].numel() == tile * t * heads * t
    assert kept["y"].numel() == tile * t * heads * 16
    assert kept["out"].numel() == len(rows) * t * 16


@pytest.mark.parametrize("autocast,by_rows", [(False, False), (True, False), (False, True)])
def test_vit_fused_attention_runs_in_tiles_without_kept_memory(monkeypatch, autocast, by_rows):
    """Under bf16 autocast (no kept memory: its buffers are float32) the host still runs the
    fused attention a tile of copies at a time, tiles counted in the products' bytes (bf16: 2);
    a whole chunk's logits, fresh each call, were mapped and faulted in again on every call
    (18.7M page faults against 12k in a ViT-small run). The outputs: the untiled path's, and
    the full forwards' under the same autocast. ``by_rows``: a tile of fewer query rows than
    ``ATTENTION_TILE_ROWS`` by its bytes grows to that many rows (MKL's product of fewer rows
    ran at 0.7× its rate on two threads)."""
    from senslab.models import vit as vit_module

    model = vit(dim_head=16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    rows, top, left = every_patch(2, 16, 4)
    noisy = torch.randn(len(rows), 3, 4, 4, generator=g) * 2
    t, heads, tile = 17, 2, 3
    calls = []
    attend = vit_module.Attention._attend_fused

    def counted(self, x, *args):
        calls.append(x.shape[0])
        return attend(self, x, *args)

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        whole = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
        full = perturbed_full(model, x, rows, top, left, noisy)
        size = 2 if autocast else 4
        if by_rows:  # bytes for one copy, rows for three (the CLS row alone: 3 · 17 copies)
            monkeypatch.setattr(vit_module, "ATTENTION_TILE_BYTES", t * heads * t * size)
            monkeypatch.setattr(vit_module, "ATTENTION_TILE_ROWS", tile * t - 1)
        else:
            monkeypatch.setattr(vit_module, "ATTENTION_TILE_BYTES", tile * t * heads * t * size)
            monkeypatch.setattr(vit_module, "ATTENTION_TILE_ROWS", 1)
        monkeypatch.setattr(vit_module.Attention, "_attend_fused", counted)
        tiled = model.forward_local(model.local_cache(x, 4), rows, top, left, noisy)
    # depth 3: the first block updates its clean rows under kept memory (no tiles there) and
    # runs in tiles under autocast, the second in tiles; the last, the CLS row alone (a
    # seventeenth of the logits), in one
    tiles = [tile] * (len(rows) // tile) + [len(rows) % tile]
    assert calls == (tiles * 2 if autocast else tiles) + [len(rows)]
    close = {"rtol": 2e-2, "atol": 2e-2} if autocast else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(tiled.float(), whole.float(), **close)
    torch.testing.assert_close(tiled.float(), full.float(), **(
        {"rtol": 5e-2, "atol": 5e-2} if autocast else {"rtol": 1e-4, "atol": 1e-5}))


def test_vit_reports_the_memory_it_keeps_and_the_chunks_count_it():
    """``local_copy_bytes`` is the kept memory of one copy exactly (the buffers of a first call
    of 7 copies hold 7 times it); a chunk sized to a ``memory_budget`` counts it, so the kept
    memory stays inside the budget."""
    model = vit(dim_head=16)
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    rows, top, left = every_patch(3, 16, 4)
    cache = model.local_cache(x, 4)
    assert model.local_copy_bytes(cache) == 0  # nothing kept yet
    with torch.no_grad():
        model.forward_local(cache, rows[:7], top[:7], left[:7], torch.zeros(7, 3, 4, 4))
    kept = sum(v.numel() * v.element_size() for v in cache["scratch"].values())
    per_copy = model.local_copy_bytes(cache)
    assert per_copy > 0 and kept == 7 * per_copy
    budget = 12 * per_copy
    m = TokenSensitivity(model, Patches(4), sigma=0.5, repeats=2, memory_budget=budget)
    m.update(x)
    assert 2 <= m.last_chunk_size <= 12
    m.compute()


def test_default_chunks_count_kept_memory_against_the_hosts_free_memory(monkeypatch):
    """Under the default budget on the host the cap for temporaries (64 MiB) does not count
    memory made once and reused, but the share of free memory does: with ample free memory a
    model's kept memory leaves the chunk as it is, with little it makes the chunk smaller."""
    from senslab.measure import _chunks

    model = vit(dim_head=16)
    silent = vit(dim_head=16)
    silent.local_copy_bytes = lambda cache: 0  # the same model, its kept memory unreported
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    cache = model.local_cache(x, 4)
    with torch.no_grad():
        model.forward_local(cache, *every_patch(1, 16, 4), torch.zeros(16, 3, 4, 4))
    per_copy = model.local_copy_bytes(cache)
    chunks = {}
    for share in (1 << 34, 40 * per_copy):
        monkeypatch.setattr(_chunks, "memory_share", lambda device, share=share: share)
        for name, m in (("model", model), ("silent", silent)):
            metric = TokenSensitivity(m, Patches(4), sigma=0.5, repeats=2)
            metric.update(x)
            chunks[name, share] = metric.last_chunk_size
    assert chunks["model", 1 << 34] == chunks["silent", 1 << 34] == 3 * 16 * 2
    assert chunks["model", 40 * per_copy] < chunks["silent", 40 * per_copy]
    assert chunks["model", 40 * per_copy] <= 40


def test_patches_pass_the_models_kept_memory_to_the_next_chunks_cache(monkeypatch):
    """The clean maps are rebuilt for a chunk of other examples; the memory ``forward_local``
    keeps (``cache["scratch"]``) passes on, so the next chunk writes into the same buffers, and
    every chunk's values are still those of its own examples."""
    monkeypatch.setattr(patches_module, "LOCAL_AHEAD", 1)  # one example's maps at a time
    model = vit(dim_head=16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 16, 16, generator=g)
    rows, top, left = every_patch(4, 16, 4)
    noise = torch.randn(len(rows), 3 * 4 * 4, generator=g)
    tok = top // 4 * 4 + left // 4
    with torch.no_grad(), Patches(4).bind(model, x) as bound:
        first = bound.forward_perturbed(rows[:16], tok[:16], noise[:16])  # example 0
        cache = bound._cache
        kept = {k: v.data_ptr() for k, v in cache["scratch"].items()}
        second = bound.forward_perturbed(rows[16:32], tok[16:32], noise[16:32])  # example 1
        assert bound._cache is not cache  # rebuilt for example 1
        assert bound._cache["scratch"] is cache["scratch"]
        assert {k: v.data_ptr() for k, v in bound._cache["scratch"].items()} == kept
        patch = torch.stack([x[r, :, t:t + 4, le:le + 4] for r, t, le in
                             zip(rows[:32].tolist(), top[:32].tolist(), left[:32].tolist(),
                                 strict=True)]) + noise[:32].view(32, 3, 4, 4)
        full = perturbed_full(model, x, rows[:32], top[:32], left[:32], patch)
    torch.testing.assert_close(torch.cat([first, second]), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shift, inner, corner", [("axis", 5, 3), ("diagonal", 9, 4),
                                                   ("none", 1, 1)])
def test_vit_recomputes_the_tokens_a_patch_reaches(shift, inner, corner):
    """One-pixel axis shifts carry a patch into its 4 neighbours; half-patch diagonal shifts
    into all 8 around it (both clipped at the border)."""
    model = vit(shift=shift)
    mask = torch.zeros(2, 1, 16, 16)
    mask[0, :, 4:8, 4:8] = 1  # an inner patch
    mask[1, :, 0:4, 0:4] = 1  # the top-left corner
    reached = model.reached_tokens(mask)
    assert reached.shape == (2, 16)
    assert reached[0, 5] and reached[1, 0]  # a patch always reaches its own token
    assert reached.sum(1).tolist() == [inner, corner]
    # the tokens every copy recomputes: the most any patch position reaches, fixed before any
    # copy (no device read per chunk, no data-dependent shape under torch.compile)
    assert model.eval().local_cache(torch.zeros(1, 3, 16, 16), 4)["reach"] == inner


@pytest.mark.parametrize("overrides", [{}, {"dim_head": 16}])  # per head, or fused weights
def test_vit_local_reuse_gives_the_full_forwards_numbers(overrides):
    model = vit(**overrides)
    x = torch.rand(5, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():  # at init every image gets one class: centre the logits on these
        model.head[1].bias.sub_(model(x).mean(0))
    runs = {}
    for reuse in (False, True):
        m = TokenSensitivity(model, Patches(4, reuse_local=reuse), sigma=0.5, repeats=3,
                             generator=2, chunk_size=20)
        m.update(x)
        runs[reuse] = m.compute()
    assert 0.02 < runs[False].estimate < 0.98
    assert torch.equal(runs[False].per_sample, runs[True].per_sample)
    with pytest.raises(RuntimeError, match="eval mode"):
        model.train().local_cache(x, 4)
