"""Audit 77 of the text sets (senslab.data.text): small fixture files in the exact GLUE
formats, written in tmp_path; tokenizers built locally (no network, no shared data)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from textfiles import MRPC_HEADER
from textfiles import sentence as _sentence

from senslab.data import DataUnavailableError, create_dataset


def _bert_tokenizer(path: Path) -> None:
    """Save a BERT-style tokenizer (WordPiece, ``[CLS] A [SEP] B [SEP]`` with token types 1 on
    B): three special tokens in a pair."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    texts = [_sentence(random.Random(i), 10) for i in range(100)]
    tok.train_from_iterator(texts, trainer=trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    transformers.BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
        cls_token="[CLS]", mask_token="[MASK]").save_pretrained(path)


def test_tokenizer_pairs_with_no_room_for_both_sentences_are_refused(tmp_path: Path) -> None:
    """pair_encoding='tokenizer' with a max_len that leaves no room for a token of each
    sentence after the template's specials encoded every pair without its text, without a word:
    BERT's pairs at max_len=3 were all ``[CLS] [SEP] [SEP]``, at max_len=4 ``[CLS] A₁ [SEP]
    [SEP]`` (B gone from every pair). senslab's own pair layout and the tokenizer's single
    sentences refuse such a max_len; now these pairs do too, and max_len=5 keeps a token of
    each sentence."""
    from senslab.data.text import encode, pretrained_tokenizer

    _bert_tokenizer(tmp_path / "bert")
    tok = pretrained_tokenizer(str(tmp_path / "bert"))
    first = ["the market said shares rose", "profit fell"]
    second = ["fell percent company", "analysts expected"]
    for max_len in (3, 4):
        with pytest.raises(ValueError, match=f"max_len={max_len} leaves no room.*each sentence"):
            encode(tok, first, second, max_len=max_len, own_pairs=True)
    out = encode(tok, first, second, max_len=5, own_pairs=True)
    sep = tok.special_ids["[SEP]"]
    for row, types in zip(out["input_ids"], out["token_type_ids"], strict=True):
        k = row.tolist().index(sep)
        assert k == 2 and row[3] != sep and row[4] == sep  # one token of A, one of B
        assert types.tolist() == [0, 0, 0, 1, 1]


def _sst2_root(tmp_path: Path, sentences: list[str]) -> Path:
    root = tmp_path / "sst2"
    root.mkdir()
    rng = random.Random(0)
    rows = [f"{_sentence(rng, rng.randint(3, 9))}\t{i % 2}\n" for i in range(40)]
    rows += [f"{s}\t1\n" for s in sentences]
    (root / "train.tsv").write_text("sentence\tlabel\n" + "".join(rows), encoding="utf-8")
    (root / "dev.tsv").write_text("sentence\tlabel\n" + "".join(rows[:6]), encoding="utf-8")
    return root


def test_special_token_text_in_a_sentence_is_encoded_as_text(tmp_path: Path) -> None:
    """senslab's BPE matched its special tokens inside the sentences' text: a sentence with the
    literal text "<pad>" got the padding id 1 among its real tokens, "</s>" the end id 2 in the
    middle of the sentence (in a pair: a fake separator). The layout's special tokens are
    senslab's to place; text is now encoded as text (as RoBERTa's own BPE does), and a sentence
    without such text keeps its ids."""
    sentences = ["html <pad> tags and </s> or <s> here", "the market rose"]
    d = create_dataset("sst2", split="train", root=_sst2_root(tmp_path, sentences),
                       vocab_size=300, max_len=128)
    ids, mask = d.inputs["input_ids"], d.inputs["attention_mask"]
    specials = set(d.meta["special_ids"].values())
    for i in (40, 41):
        n = int(mask[i].sum())
        assert ids[i, 0] == d.meta["special_ids"]["<s>"]
        assert ids[i, n - 1] == d.meta["special_ids"]["</s>"]
        inner = ids[i, 1: n - 1].tolist()
        assert not specials & set(inner), inner  # no <pad>, <s>, </s> inside the text
    assert d.meta["truncated_per_row"][40:].tolist() == [0, 0]
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(d.meta["tokenizer"]).encode(sentences[1], add_special_tokens=False)
    assert ids[41, 1: int(mask[41].sum()) - 1].tolist() == plain.ids  # plain text: unchanged


def test_an_mrpc_variant_that_does_not_exist_is_named_before_any_file_is_looked_for(
        tmp_path: Path) -> None:
    """variant='MSR' (or any misspelling) with Microsoft's files in root was answered "no mrpc
    files ... expected train.tsv or msr_paraphrase_train.txt + dev_ids.tsv" — the files of the
    glue variant, never the option at fault (and with download=True GLUE's files were fetched
    before the variant was refused)."""
    root = tmp_path / "mrpc"
    root.mkdir()
    rng = random.Random(1)
    rows = "".join(f"{i % 2}\t{i}\t{100 + i}\t{_sentence(rng, 6)}\t{_sentence(rng, 5)}\n"
                   for i in range(20))
    (root / "msr_paraphrase_train.txt").write_text(MRPC_HEADER + "\n" + rows, encoding="utf-8")
    for variant in ("MSR", "msr ", "paper"):
        with pytest.raises(ValueError, match=f"variant must be 'glue' or 'msr', got {variant!r}"):
            create_dataset("mrpc", split="train", root=root, variant=variant, vocab_size=300)
    with pytest.warns(UserWarning):  # 20 rows, not the reference file's 4,076
        d = create_dataset("mrpc", split="train", root=root, variant="msr", vocab_size=300)
    assert len(d) == 20 and torch.equal(d.targets, torch.arange(20) % 2)
    with pytest.raises(DataUnavailableError, match="train.tsv"):
        create_dataset("mrpc", split="train", root=root, vocab_size=300)  # glue: no dev_ids


def test_a_rotten_tomatoes_row_without_its_text_names_the_file_and_line(tmp_path: Path) -> None:
    """A CSV of one's own with a row cut before its text column ("fresh" alone) raised a bare
    AttributeError ('NoneType' object has no attribute 'split'), naming neither the file nor
    the row; the complete rows load as before."""
    import bz2

    from senslab.data.text import RT_FILE, _rotten_rows

    rows = "".join(f"fresh,good film {i}\nrotten,bad film {i}\n" for i in range(20))
    (tmp_path / RT_FILE).write_bytes(bz2.compress(("category,text\n" + rows).encode()))
    assert len(_rotten_rows("train", "sentiment", 0.1, 0, tmp_path).first) == 36
    (tmp_path / RT_FILE).write_bytes(bz2.compress(("category,text\n" + rows + "fresh\n").encode()))
    with pytest.raises(DataUnavailableError, match=rf"{RT_FILE}, line 42: the row ends before "
                       r"its text column \(1 of 2 fields\)"):
        _rotten_rows("train", "sentiment", 0.1, 0, tmp_path)
