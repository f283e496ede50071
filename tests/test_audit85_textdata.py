"""Audit 85 of the text loaders (senslab.data.text): fixture files in the exact GLUE formats,
written in tmp_path; no shared data, no network."""

from __future__ import annotations

import bz2
import random
import warnings
from pathlib import Path

import pytest
import torch
from textfiles import BOM, MRPC_HEADER, write_rotten
from textfiles import sentence as _sentence

from senslab.data import create_dataset
from senslab.data import text as tx


def _mrpc_rows(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[str(i % 2), str(100 + i), str(900 + i), _sentence(rng, 8), _sentence(rng, 7)]
            for i in range(n)]


def _write_glue(path: Path, header: str, rows: list[list[str]]) -> None:
    """As GLUE writes its files: fields joined by tabs, no quoting."""
    path.write_text(BOM + header + "\n" + "".join("\t".join(r) + "\n" for r in rows),
                    encoding="utf-8")


def test_glue_rows_between_an_open_quote_and_a_closing_one_are_not_swallowed(
        tmp_path: Path) -> None:
    """GLUE's MRPC rows re-ordered (a shuffled split of one's own, the msr test file reversed):
    a #2 String that opens a quote it never closes (24 of train.tsv's), a few rows later one
    that ends with its only quote. The rows from the first to the second were read as one
    CSV-quoted pair — three examples became one whose #2 String held the other two rows — with
    a warning that the file was written by a CSV writer. Every row is its own example now."""
    rows = _mrpc_rows(40, 0)
    rows[10][4] = '" This is an extremely heartrending time for the community .'
    rows[12][4] = 'it was a heartrending time for all of us . "'
    path = tmp_path / "train.tsv"
    _write_glue(path, MRPC_HEADER, rows)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = tx._read(path, tx.MRPC_FORMAT)
    assert not [w for w in caught if "CSV quoting" in str(w.message)]
    assert len(got.labels) == 40 and got.skipped == 0
    assert got.first == [r[3] for r in rows] and got.second == [r[4] for r in rows]
    assert got.labels == [int(r[0]) for r in rows]
    # the overlap check reads the rows as the loader does: all 40 keys, none merged
    assert len(tx._example_keys(path, tx.MRPC_FORMAT)) == 40


def test_a_rotten_tomatoes_csv_with_a_bom_loads(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts with a BOM, which stuck to the first column's name: the file
    was refused as having no 'category' column, while the message listed its columns as
    'category, text, movie_name'. It loads now, as the same CSV without the BOM does."""
    rng = random.Random(0)
    rows = [("fresh" if i % 2 else "rotten", _sentence(rng, 6)) for i in range(40)]
    plain, bom = tmp_path / "plain", tmp_path / "bom"
    plain.mkdir()
    bom.mkdir()
    write_rotten(plain / tx.RT_FILE, rows)
    data = bz2.decompress((plain / tx.RT_FILE).read_bytes())
    (bom / tx.RT_FILE).write_bytes(bz2.compress(BOM.encode("utf-8") + data))
    for split in ("train", "validation"):
        want = tx._rotten_rows(split, "sentiment", 0.25, 3, plain)
        got = tx._rotten_rows(split, "sentiment", 0.25, 3, bom)
        assert got.first == want.first and got.labels == want.labels and got.skipped == 0
    assert len(want.labels) == 10 and set(want.labels) == {0, 1}


@pytest.mark.parametrize("option", [{"max_len": 32.0}, {"vocab_size": 300.0}])
def test_a_whole_float_max_len_or_vocab_size_loads_as_its_int(tmp_path: Path,
                                                                option: dict) -> None:
    """max_len=32.0 (a config's float) failed after the files were read and the BPE trained,
    with numpy's bare "'float' object cannot be interpreted as an integer"; vocab_size=300.0 so
    too, inside the trainer. A whole float now loads exactly as its int does."""
    _write_glue(tmp_path / "train.tsv", MRPC_HEADER, _mrpc_rows(30, 0))
    kw = {"vocab_size": 300, "max_len": 32}
    want = create_dataset("mrpc", root=tmp_path, **kw)
    got = create_dataset("mrpc", root=tmp_path, **{**kw, **option})
    assert torch.equal(got.inputs["input_ids"], want.inputs["input_ids"])
    assert got.meta["vocab_size"] == want.meta["vocab_size"] and got.meta["max_len"] == 32


@pytest.mark.parametrize("option", [{"max_len": 32.5}, {"max_len": True}, {"vocab_size": 299.5},
                                    {"vocab_size": "many"}])
def test_a_max_len_or_vocab_size_that_is_not_whole_names_the_option(tmp_path: Path,
                                                                    option: dict) -> None:
    _write_glue(tmp_path / "train.tsv", MRPC_HEADER, _mrpc_rows(30, 0))
    name = next(iter(option))
    with pytest.raises(ValueError, match=rf"mrpc: {name}=.* is not a whole number.*pass an int"):
        create_dataset("mrpc", root=tmp_path, **{"vocab_size": 300, **option})


def test_a_cache_folder_that_cannot_be_written_keeps_the_trained_tokenizer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SENSLAB_CACHE that cannot be written (here a file in the folder's place; a read-only
    home alike) failed the load after the BPE was trained, with a bare NotADirectoryError naming
    no fix. The load now goes on with the tokenizer it trained — the same one a writable cache
    gets, so the same ids — and warns that it is not saved, naming SENSLAB_CACHE."""
    root = tmp_path / "mrpc"
    root.mkdir()
    _write_glue(root / "train.tsv", MRPC_HEADER, _mrpc_rows(30, 0))
    kw = {"vocab_size": 300, "max_len": 32}
    monkeypatch.setenv("SENSLAB_CACHE", str(tmp_path / "cache"))
    want = create_dataset("mrpc", root=root, **kw)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("SENSLAB_CACHE", str(blocked))
    with pytest.warns(UserWarning, match=r"cannot be saved to .*blocked.*SENSLAB_CACHE"):
        got = create_dataset("mrpc", root=root, **kw)
    assert torch.equal(got.inputs["input_ids"], want.inputs["input_ids"])
    assert got.meta["vocab_size"] == want.meta["vocab_size"] and got.meta["tokenizer_trained"]
    assert "not saved" in got.meta["tokenizer"]


def test_a_split_file_with_only_its_header_says_so(tmp_path: Path) -> None:
    """A dev.tsv holding its header line and no row was refused as 'not in sst2's format' with
    '0 rows skipped as malformed' — the one thing right about the file. Now the message says
    that the file holds no example, only its header."""
    (tmp_path / "train.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"a b c {i}\t{i % 2}\n" for i in range(30)))
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference row count of dev.tsv
        with pytest.raises(tx.DataUnavailableError, match=r"sst2 \(validation\): the validation "
                           r"file in .* holds no example, only its header line"):
            create_dataset("sst2", split="validation", root=tmp_path, vocab_size=300)
