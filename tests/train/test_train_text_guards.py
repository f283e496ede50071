"""``fit`` on text: the cut of long sentences to ``max_len`` is said and recorded (it was silent),
and a noise regularizer on token ids is refused naming the real problem (the advice was
``.float()``), before anything is written."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest
import torch

from senslab.data import create_dataset
from senslab.data import text as text_data
from senslab.train.config import RunConfig
from senslab.train.loop import fit
from senslab.train.regularize import gaussian_noise_augment, sensitivity_penalty

WORDS = "the film was good bad long short funny dull warm cold bright plot actors".split()


@pytest.fixture
def sst2_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SST-2 files of 40 / 12 sentences of 2 to 12 words (the row-count check pointed at them)."""
    rng = random.Random(3)
    root = tmp_path / "sst2"
    root.mkdir()
    for name, n in (("train.tsv", 40), ("dev.tsv", 12)):
        rows = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) + f"\t{i % 2}"
                for i in range(n)]
        (root / name).write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    monkeypatch.setitem(text_data.REFERENCE_ROWS, "sst2", {"train.tsv": 40, "dev.tsv": 12})
    return root


def _config(root: Path, max_len: int, **train: object) -> RunConfig:
    cfg = RunConfig(name="textguard", device="cpu")
    cfg.model.name = "lstm"
    cfg.model.overrides = {"dim": 16, "layers": 1}
    cfg.data.name, cfg.data.root, cfg.data.test_split = "sst2", str(root), "validation"
    cfg.data.options = {"max_len": max_len, "vocab_size": 300}
    cfg.data.train_subset = 24
    cfg.train.epochs, cfg.train.batch_size = 1, 12
    cfg.track.num_examples = 8
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def _lost(root: Path, split: str, max_len: int) -> torch.Tensor:
    """Tokens each example loses when cut to ``max_len``, from its uncut length."""
    whole = create_dataset("sst2", split, root=root, max_len=128, vocab_size=300)
    assert whole.meta["truncated_rows"] == 0  # 128 holds every sentence
    return (whole.inputs["attention_mask"].sum(1) - max_len).clamp(min=0)


def test_fit_says_and_records_how_much_the_cut_to_max_len_removed(sst2_root: Path,
                                                                   tmp_path: Path) -> None:
    """Sentences longer than max_len were cut without a word: the run trained and was measured
    on cut text and nothing said how many examples lost how much. The counts are of the examples
    the run uses (the seeded train_subset, not the whole split)."""
    cfg = _config(sst2_root, max_len=10)
    # the examples load_data keeps (its seeded subset), and what each of them loses
    keep = torch.randperm(40, generator=torch.Generator().manual_seed(cfg.seed + 12345))[:24]
    train_lost, test_lost = _lost(sst2_root, "train", 10)[keep], _lost(sst2_root, "dev", 10)
    assert 0 < int((train_lost > 0).sum()) < 24  # some cut, some whole: a subset's own count
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = fit(cfg, tmp_path / "run", progress=False)
    said = [str(w.message) for w in caught if "cut to max_len=10" in str(w.message)]
    assert len(said) == 1
    rows, tokens = int((train_lost > 0).sum()), int(train_lost.sum())
    assert f"{rows:,} of the 24 training examples lost tokens ({tokens:,} in all)" in said[0]
    longest = 10 + int(max(train_lost.max(), test_lost.max()))
    assert f"data.options.max_len={longest}" in said[0]
    expected = {"max_len": 10,
                "train": {"examples": 24, "truncated_rows": rows, "truncated_tokens": tokens,
                          "longest": 10 + int(train_lost.max())},
                "test": {"examples": 12, "truncated_rows": int((test_lost > 0).sum()),
                         "truncated_tokens": int(test_lost.sum()),
                         "longest": 10 + int(test_lost.max())}}
    assert summary["truncated"] == expected
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["truncated"] == expected


def test_fit_without_a_cut_records_zero_and_says_nothing(sst2_root: Path, tmp_path: Path) -> None:
    cfg = _config(sst2_root, max_len=128)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = fit(cfg, tmp_path / "run", progress=False)
    assert not [w for w in caught if "cut to max_len" in str(w.message)]
    assert summary["truncated"]["train"]["truncated_rows"] == 0
    assert summary["truncated"]["test"]["truncated_tokens"] == 0


@pytest.mark.parametrize("train", [{"regularizer": "noise"},
                                   {"regularizer": "patch_mse", "reg_patch": 2}])
def test_a_noise_regularizer_on_a_text_set_is_refused_before_anything_is_written(
        sst2_root: Path, tmp_path: Path, train: dict[str, object]) -> None:
    """Both regularizers failed in the first step, after the run directory was set up, with
    advice that does not apply to token ids ("convert with .float()", "Patches tokens need an
    image tensor")."""
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"sst2 holds token ids.*train\.regularizer=none"
                                         r".*tokens=Embedding") as err:
        fit(_config(sst2_root, max_len=16, **train), out, progress=False)
    assert ".float()" not in str(err.value)
    assert not out.exists()


def test_noise_on_integer_ids_of_a_synthetic_task_is_refused(tmp_path: Path) -> None:
    """modular_addition holds int64 ids (no text kind by name): refused once loaded, naming the
    ids, not with "convert with .float()" from the first step."""
    cfg = RunConfig(name="modadd", device="cpu")
    cfg.model.name, cfg.data.name = "modadd_transformer", "modular_addition"
    cfg.model.overrides = {"dim": 16, "heads": 2, "mlp_dim": 32}
    cfg.train.epochs, cfg.train.max_steps, cfg.train.regularizer = 1, 1, "noise"
    with pytest.raises(ValueError, match="modular_addition holds token ids") as err:
        fit(cfg, tmp_path / "run", progress=False)
    assert ".float()" not in str(err.value)
    assert not (tmp_path / "run" / "config.json").exists()


def test_patch_regularizer_on_inputs_without_patches_is_refused(tmp_path: Path) -> None:
    """(N, n) bit strings have no image patch: the first step's error advised adding a channel
    axis for grayscale images."""
    cfg = RunConfig(name="parity", device="cpu")
    cfg.model.name, cfg.data.name = "parity_transformer", "sparse_parity"
    cfg.train.epochs, cfg.train.max_steps, cfg.train.regularizer = 1, 1, "patch_mse"
    with pytest.raises(ValueError, match=r"holds inputs of shape \(\d+, \d+\), which have no "
                                         r"patches: use train\.regularizer=noise") as err:
        fit(cfg, tmp_path / "run", progress=False)
    assert "unsqueeze" not in str(err.value)


def test_the_regularizer_functions_name_token_ids_and_the_embedding_fix() -> None:
    """Called directly on token ids, the noise functions advised ``.float()``."""
    ids = torch.randint(0, 50, (3, 7))
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(TypeError, match=r"torch\.int64 values \(token ids.*tokens=Embedding"):
        gaussian_noise_augment(ids, 0.1, gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones(3, 7, dtype=torch.bool)}
    with pytest.raises(TypeError, match=r"dict of model inputs.*tokens=Embedding") as err:
        gaussian_noise_augment(batch, 0.1, gen)
    assert ".float()" not in str(err.value)
    model = torch.nn.Linear(7, 2)
    with pytest.raises(TypeError, match=r"Patches tokens need an image tensor, got dict.*"
                                        r"tokens=Embedding"):
        sensitivity_penalty(model, batch, generator=gen)
    with pytest.raises(TypeError, match=r"torch\.int64 values \(token ids"):
        sensitivity_penalty(model, ids, patch=1, generator=gen)


@pytest.mark.parametrize(("key", "value", "own"), [
    ("root", "/nowhere", "data.root"), ("download", True, "data.download"),
    ("split", "test", "data.train_split and data.test_split")])
def test_data_options_that_data_fields_set_are_refused(tmp_path: Path, key: str, value: object,
                                                       own: str) -> None:
    """``data.options.root`` was replaced by ``data.root`` without a word (the run trained on
    the default copy of the data); ``data.options.split`` failed with "got multiple values for
    argument 'split'"."""
    cfg = RunConfig(name="opts", device="cpu")
    cfg.train.epochs, cfg.train.max_steps = 1, 1
    cfg.data.options = {key: value}
    with pytest.raises(ValueError, match=rf"data\.options\.{key}=.*set {own} instead"):
        fit(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
