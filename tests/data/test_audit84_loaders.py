"""Audit 84 of the data loaders' integrity checks: the GLUE train/dev overlap check reading
CSV-split sentences as the loader does, and SVHN test files compared with extra_32x32.mat too.
Fixture files in the exact formats of the real ones, written in tmp_path; no shared data, no
network."""

from __future__ import annotations

import bz2
import csv
import gzip
import pickle
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
from textfiles import BOM, WORDS, sentence, write_rotten

from senslab.data import DataUnavailableError, create_dataset
from senslab.data import text as tx


def _sentences(n: int, seed: int) -> list[str]:
    """``n`` different sentences (each ends with its own number, so none repeats by chance)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + f" {seed}-{i}"
            for i in range(n)]


def _write_csv(path: Path, sentences: list[str]) -> None:
    """An SST-2 file as csv.writer (pandas' to_csv(sep="\\t")) writes it: a sentence holding a
    tab or a line end wrapped in quotes."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(BOM + "sentence\tlabel\n")
        csv.writer(f, delimiter="\t").writerows([[s, str(i % 2)] for i, s in enumerate(sentences)])


def _overlap_warnings(root: Path) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        create_dataset("sst2", split="dev", root=root, vocab_size=300)
    return [str(w.message) for w in seen if "are also in train.tsv" in str(w.message)]


@pytest.mark.parametrize("case, shared, warns", [
    # 3 more training sentences holding a tab: the loader reads 11 of 40 shared (> 10, > 10%);
    # line by line those rows split into 3 fields and gave no key: 8 counted, no warning
    ("tab", 11, True),
    # 3 different sentences sharing only their second line: the loader reads 8 shared; line by
    # line their halves 'shared tail k ."' matched: 11 counted, a warning about 11 examples
    ("line end", 8, False),
])
def test_the_overlap_check_reads_csv_split_sentences_as_the_loader_does(
        tmp_path: Path, case: str, shared: int, warns: bool) -> None:
    train, dev = _sentences(300, 0), _sentences(40, 1)
    dev[:8] = train[:8]
    for k in range(3):  # a handful of CSV-quoted rows per file: warned about, loaded
        if case == "tab":
            train[10 + k] = dev[8 + k] = f"left part {k}\tright part {k} ."
        else:
            train[10 + k] = f"train head {k}\nshared tail {k} ."
            dev[8 + k] = f"dev head {k}\nshared tail {k} ."
    _write_csv(tmp_path / "train.tsv", train)
    _write_csv(tmp_path / "dev.tsv", dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = set(tx._read(tmp_path / "train.tsv", tx.SST2_FORMAT).first)
        held = tx._read(tmp_path / "dev.tsv", tx.SST2_FORMAT).first
    assert len(held) == 40 and sum(s in loaded for s in held) == shared
    said = _overlap_warnings(tmp_path)
    assert len(said) == warns, said
    if warns:
        assert f"{shared} of its 40 examples (28%)" in said[0]


def _svhn(path: Path, x: np.ndarray) -> None:
    from scipy.io import savemat

    y = (np.arange(x.shape[3]) % 10 + 1).reshape(-1, 1).astype(np.uint8)  # 10 is the digit 0
    savemat(path, {"X": x, "y": y})


def test_an_svhn_test_file_drawn_from_extra_warns(tmp_path: Path) -> None:
    """A test_32x32.mat of one's own (verify=False) with 30 of its 40 images from the
    extra_32x32.mat beside it (training data the loader offers as split="extra") loaded without
    a word: only train_32x32.mat was compared. Images shared with either file now count, 20
    from train plus 5 from extra warn as 25; none shared with either stays silent."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (32, 32, 3, 40), dtype=np.uint8)
    extra = rng.integers(0, 256, (32, 32, 3, 60), dtype=np.uint8)
    fresh = rng.integers(0, 256, (32, 32, 3, 40), dtype=np.uint8)
    _svhn(tmp_path / "train_32x32.mat", train)
    _svhn(tmp_path / "extra_32x32.mat", extra)
    _svhn(tmp_path / "test_32x32.mat", np.concatenate([extra[..., :30], fresh[..., :10]], 3))
    with pytest.warns(UserWarning, match=r"test_32x32\.mat: 30 of its 40 images \(75%\) are "
                      r"also in train_32x32\.mat or extra_32x32\.mat next to it"):
        ds = create_dataset("svhn", split="test", root=tmp_path, verify=False)
    assert len(ds) == 40
    both = np.concatenate([train[..., :20], extra[..., 40:45], fresh[..., :15]], 3)
    _svhn(tmp_path / "test_32x32.mat", both)
    with pytest.warns(UserWarning, match=r"25 of its 40 images \(62%\)"):
        create_dataset("svhn", split="test", root=tmp_path, verify=False)
    _svhn(tmp_path / "test_32x32.mat", fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(create_dataset("svhn", split="test", root=tmp_path, verify=False)) == 40


def test_a_cut_or_uncompressed_rotten_tomatoes_file_names_the_file_and_the_fix(
        tmp_path: Path) -> None:
    """A rotten_tomatoes_corpus_full.csv.bz2 cut short (an interrupted copy) raised bz2's bare
    EOFError 'Compressed file ended before the end-of-stream marker was reached', and a CSV
    not compressed under that name a bare OSError 'Invalid data stream', neither naming the
    file or the fix. A whole file still loads, and its missing column keeps its own message."""
    rng = random.Random(0)
    path = tmp_path / "rotten_tomatoes_corpus_full.csv.bz2"
    write_rotten(path, [("fresh" if i % 2 else "rotten", sentence(rng, 10)) for i in range(400)])
    whole = path.read_bytes()
    assert len(create_dataset("rotten_tomatoes", split="validation", root=tmp_path,
                              vocab_size=300)) == 40
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataUnavailableError, match=r"csv\.bz2 cannot be read as a "
                       r"bz2-compressed UTF-8 CSV \(EOFError: .*truncated.*Copy it again"):
        create_dataset("rotten_tomatoes", split="train", root=tmp_path, vocab_size=300)
    path.write_bytes(b"category,text,movie_name\nfresh,good fun,m\n")
    with pytest.raises(DataUnavailableError, match=r"\(OSError: Invalid data stream\).*not "
                       r"compressed with bz2.*bzip2 -k"):
        create_dataset("rotten_tomatoes", split="train", root=tmp_path, vocab_size=300)
    path.write_bytes(bz2.compress(b"category,review\nfresh,good fun\n"))
    with pytest.raises(DataUnavailableError, match=r"has no 'text' column"):
        create_dataset("rotten_tomatoes", split="train", root=tmp_path, vocab_size=300)


def test_an_mnist_pickle_of_ones_own_with_held_out_training_images_warns(tmp_path: Path) -> None:
    """An mnist.pkl.gz of one's own (verify=False) whose test part held 30 of its 40 images from
    the training part loaded without a word, where idx files read so warn; so did a validation
    part (split "val10k") drawn from the training part (split "train50k"). Both warn now,
    naming the share; a pickle whose parts share no image stays silent."""
    rng = np.random.default_rng(0)

    def part(n: int) -> tuple[np.ndarray, np.ndarray]:  # Nielsen's layout: byte / 256, float32
        return rng.integers(0, 256, (n, 784)).astype(np.float32) / 256, np.arange(n) % 10

    train, val, fresh = part(60), part(20), part(40)

    def save(name: str, test_x: np.ndarray, val_x: np.ndarray) -> Path:  # a folder each
        root = tmp_path / name
        root.mkdir()
        with gzip.open(root / "mnist.pkl.gz", "wb", compresslevel=1) as f:
            pickle.dump((train, (val_x, val[1]), (test_x, fresh[1])), f)
        return root

    def load(root: Path, split: str):
        return create_dataset("mnist", split=split, root=root, source="pickle", verify=False)

    root = save("test", np.concatenate([train[0][:25], val[0][:5], fresh[0][:10]]), val[0])
    with pytest.warns(UserWarning, match=r"mnist\.pkl\.gz \(test part\): 30 of its 40 images "
                      r"\(75%\) are also in its training part or validation part \(the same "
                      r"pixels\)"):
        assert len(load(root, "test")) == 40
    root = save("val", fresh[0], np.concatenate([train[0][:15], fresh[0][:5]]))
    with pytest.warns(UserWarning, match=r"\(validation part\): 15 of its 20 images \(75%\) "
                      r"are also in its training part \(the same"):
        assert len(load(root, "val10k")) == 20
    root = save("clean", fresh[0], val[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load(root, "test")) == 40 and len(load(root, "val10k")) == 20
