"""Audit of session 75: a forward hook of the user's on a model that reuses its clean
computation (the zoo's lstm, gpt2, cnn) was skipped by ``forward_suffix``/``forward_local`` —
a hook that moved some perturbed copies' logits read 0.0203 with reuse against 0.0552 with full
forwards, without a word; now such a model runs full forwards. ``TokenSensitivity.merge``
accepted a metric of bf16's own decisions (``autocast``) or one measured in training mode
(``eval_mode=False``) beside a float32 one in eval mode: now refused, naming the option. A
tensor a module caches as a plain attribute, built during a measurement, was an inference tensor
that failed the next training step: now put back as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab import token_sensitivity
from senslab.measure import TokenSensitivity
from senslab.models import create_model
from senslab.tokens import Embedding, Patches

OPTS = {"sigma": 1.0, "repeats": 4, "precision": "float32", "generator": 0}


def text_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 60, (8, 8), generator=g)
    mask = torch.ones(8, 8, dtype=torch.long)
    mask[4:, 6:] = 0
    ids[mask == 0] = 1
    return {"input_ids": ids, "attention_mask": mask}


def lstm() -> nn.Module:
    torch.manual_seed(0)  # test-only: init
    return create_model("lstm", vocab_size=60, dim=16, layers=1, num_classes=3, max_len=16).eval()


def shifted_above(threshold: float):
    """A forward hook that raises class 2's logit by 5 where class 0's passes ``threshold``:
    it changes some perturbed copies' predictions and no clean one's."""
    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return out + 5.0 * (out[:, :1] > threshold).float() * torch.tensor([0.0, 0.0, 1.0])
    return hook


def counted_copies(model: nn.Module, tokens, inputs, **options) -> tuple[int, float]:
    """(forwards of the model the measurement made, its estimate)."""
    calls = []
    handle = model.register_forward_hook(lambda m, a, o: calls.append(len(o)))
    try:
        r = token_sensitivity(model, inputs, tokens, **options)
    finally:
        handle.remove()
    return sum(calls), r.estimate


def test_a_users_hook_on_a_prefix_reusing_model_runs_on_every_copy():
    model, batch = lstm(), text_batch()
    with torch.no_grad():
        clean = model(**batch)
    threshold = clean[:, 0].max().item() + 0.02
    reference = {}
    for reuse in (False, True):
        handle = model.register_forward_hook(shifted_above(threshold))
        try:
            r = token_sensitivity(model, batch, Embedding("embed_ln", reuse_prefix=reuse),
                                  **OPTS)
        finally:
            handle.remove()
        reference[reuse] = r
    assert torch.equal(reference[True].per_sample, reference[False].per_sample)
    # the hook does change the measurement: without it, other numbers
    plain = token_sensitivity(model, batch, Embedding("embed_ln"), **OPTS)
    assert not torch.equal(plain.per_sample, reference[False].per_sample)
    # every perturbed copy ran through the model's call (real tokens × repeats of them)
    rows, _ = counted_copies(model, Embedding("embed_ln"), batch, **OPTS)
    assert rows >= int(batch["attention_mask"].sum()) * OPTS["repeats"]


def test_without_hooks_prefix_reuse_still_runs():
    """No hook of the user's: copies resume from the prefix (the model's call runs only for the
    clean forwards, far fewer rows than the copies)."""
    model, batch = lstm(), text_batch()
    seen = []
    original = type(model).forward_suffix

    def suffix(self, *args, **kwargs):
        seen.append(1)
        return original(self, *args, **kwargs)

    type(model).forward_suffix = suffix
    try:
        token_sensitivity(model, batch, Embedding("embed_ln"), **OPTS)
    finally:
        type(model).forward_suffix = original
    assert seen


def test_a_global_hook_also_turns_reuse_off():
    model, batch = lstm(), text_batch()
    seen = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, a, o: seen.append(m) if m is model else None)
    try:
        token_sensitivity(model, batch, Embedding("embed_ln"), **OPTS)
    finally:
        handle.remove()
    assert len(seen) > 2  # the copies ran through the model's call, not only the clean forwards


def test_a_users_hook_on_a_local_reusing_model_runs_on_every_copy():
    torch.manual_seed(0)  # test-only: init
    model = create_model("cnn", num_classes=3, in_channels=1, image_size=8).eval()
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        clean = model(x)
    threshold = clean[:, 0].max().item() + 0.01
    results = {}
    for reuse in (False, True):
        handle = model.register_forward_hook(shifted_above(threshold))
        try:
            results[reuse] = token_sensitivity(model, x, Patches(4, reuse_local=reuse),
                                               **OPTS)
        finally:
            handle.remove()
    assert torch.equal(results[True].per_sample, results[False].per_sample)
    plain = token_sensitivity(model, x, Patches(4), **OPTS)
    assert not torch.equal(plain.per_sample, results[False].per_sample)


@pytest.mark.parametrize("option, theirs", [
    ("autocast", {"autocast": torch.bfloat16, "precision": "auto"}),
    ("eval_mode", {"eval_mode": False}),
])
def test_merge_refuses_other_decisions_or_training_mode(option, theirs):
    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x = torch.randn(2, 8, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    mine = TokenSensitivity(model, Patches(2), sigma=0.5, precision="float32", generator=0)
    mine.update(x[0])
    other = TokenSensitivity(model, Patches(2), sigma=0.5,
                             **{"precision": "float32", **theirs}, generator=1)
    other.update(x[1])
    with pytest.raises(ValueError, match=f"cannot merge: {option} "):
        mine.merge(other)
    assert mine.compute().num_examples == 8  # nothing merged
    # checked precisions decide as float32 does: they merge
    checked = TokenSensitivity(model, Patches(2), sigma=0.5, precision="bf16-checked",
                               generator=2)
    checked.update(x[1])
    assert mine.merge(checked).compute().num_examples == 16


class LazyTable(nn.Module):
    """Multiplies by a position table it builds for the longest input seen, kept as a plain
    attribute (as rotary or sinusoidal embeddings often are), not as a buffer."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim, self.table = dim, None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.table is None or self.table.shape[0] < h.shape[1]:
            pos = torch.arange(h.shape[1], dtype=torch.float32)[:, None]
            self.table = torch.cos(pos / (1 + torch.arange(self.dim)))
        return h * self.table[: h.shape[1]]


class Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.ln, self.rot = nn.Embedding(50, 8), nn.LayerNorm(8), LazyTable(8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rot(self.ln(self.emb(input_ids))).mean(1))


def test_a_lazily_built_table_does_not_break_the_next_training_step():
    """Measuring under inference mode built the table for a longer input as an inference
    tensor; the next training step's backward failed ("Inference tensors cannot be saved for
    backward"). The attribute is put back as it was; the module builds it again."""
    model = Rotary()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        x, y = torch.randint(1, 50, (4, 6), generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    before = model.rot.table
    TokenSensitivity(model, Embedding("ln"), sigma=1.0, generator=0).update(
        {"input_ids": torch.randint(1, 50, (4, 12), generator=g)})
    assert model.rot.table is before  # put back
    step()  # raised before
    assert not model.rot.table.is_inference()
    fresh = Rotary()  # no table before: none after
    token_sensitivity(fresh, {"input_ids": torch.randint(1, 50, (2, 5), generator=g)},
                      Embedding("ln"), sigma=1.0)
    assert fresh.rot.table is None


class ChannelsFirstNorm(nn.LayerNorm):
    """A LayerNorm over the channels of (B, C, H, W) maps, as ConvNeXt's or timm's
    LayerNorm2d: it permutes to channels-last, normalises, permutes back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNormNet(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.norm = ChannelsFirstNorm(channels)
        self.head = nn.Linear(channels, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("channels, width", [(4, 5), (5, 5)])
def test_a_channels_first_layernorm_is_refused_by_the_blowup(channels, width):
    """The hook read the variance over the last axis (W) of a LayerNorm that normalises C:
    6.106 against 8.065 by the definition on a toy (2, 4, 5, 5) input. Refused, also where C
    equals W (the shapes alone cannot tell)."""
    from senslab.measure.sharpness import layernorm_blowup

    x = torch.randn(2, 1, width, width, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"'norm' \(ChannelsFirstNorm\) does not normalise the "
                                         r"last axes"):
        layernorm_blowup(ConvNormNet(channels), x)


def test_a_layernorm_subclass_that_normalises_the_last_axes_is_read():
    from senslab.measure.sharpness import layernorm_factors

    class Scaled(nn.LayerNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 1.0

    def net(norm: type) -> nn.Module:
        torch.manual_seed(0)  # test-only: init
        return nn.Sequential(nn.Linear(6, 8), norm(8), nn.Linear(8, 2))

    x = torch.randn(4, 3, 6, generator=torch.Generator().manual_seed(0))
    plain, sub = layernorm_factors(net(nn.LayerNorm), x), layernorm_factors(net(Scaled), x)
    assert plain.keys() == sub.keys()
    for key in plain:
        assert torch.equal(plain[key], sub[key])


def test_auto_samples_above_the_enumeration_limit():
    """n = 23 with many samples chose enumeration (2²³ ≤ 24·400,000) and refused it, naming
    method='auto' — the method passed — as the fix."""
    from senslab.measure import boolean_sensitivity

    r = boolean_sensitivity(lambda x: x.prod(dim=1), 23, num_samples=400_000, generator=0)
    assert r.method == "sample" and r.average == pytest.approx(23.0)


def test_parameter_norm_refuses_an_exclude_entry_that_matches_nothing():
    from senslab.measure.sharpness import parameter_norm

    torch.manual_seed(0)  # test-only: init
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    with pytest.raises(ValueError, match=r"exclude entry '2.weight' is in no parameter name"):
        parameter_norm(model, exclude=("2.weight",))
    assert parameter_norm(model, exclude=("1.weight",)) < parameter_norm(model, exclude=())


def test_a_mask_that_also_marks_padding_is_said():
    """mask = ids != BOS (to keep BOS out of the noise) is also true on the right padding:
    mask= says which tokens are real, so the padding got noise and a causal LM was read at it
    (0.191 against 0.304 with mask & attention_mask on this model), without a word. Now said,
    with the fix; mask & attention_mask reads each example at its last real token."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)  # test-only: init
    config = tf.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=40, bos_token_id=1, eos_token_id=2,
                            pad_token_id=None)
    model = tf.LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(3)
    lengths = [7, 3, 10, 5]
    ids = torch.full((4, 10), 2)
    attention = torch.zeros(4, 10, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, 0] = 1
        ids[i, 1:n] = torch.randint(3, 50, (n - 1,), generator=g)
        attention[i, :n] = 1
    batch = {"input_ids": ids, "attention_mask": attention}
    tokens = Embedding("model.embed_tokens")
    options = {"sigma": 1.0, "repeats": 4, "precision": "float32", "generator": 0}
    with pytest.warns(UserWarning, match=r"mask= marks 15 positions real that the input's "
                                         r"'attention_mask' entry marks as padding \(examples "
                                         r"\[0, 1, 3\]\).*pass mask & attention_mask"):
        token_sensitivity(model, batch, tokens, mask=ids != 1, **options)
    both = (ids != 1) & attention.bool()
    with tokens.bind(model, batch, mask=both) as bound:
        assert bound.ends.tolist() == [n - 1 for n in lengths]
        assert bound.valid.sum(1).tolist() == [n - 1 for n in lengths]
