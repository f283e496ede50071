"""Audit 83 of the data loaders: GLUE TSVs whose CSV-quoted sentence holds a line end, SVHN test
files sharing the training images, and seeds that are not ints. Fixture files in the exact
formats of the real ones, written in tmp_path; no shared data, no network."""

from __future__ import annotations

import csv
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from textfiles import BOM, MRPC_HEADER
from textfiles import sentence as _sentence

from senslab.data import DataUnavailableError, create_dataset
from senslab.data import text as tx
from senslab.data.base import ArrayDataset


def _write(path: Path, header: str, rows: list[list[str]], csv_quoting: bool) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(BOM + header + "\n")
        if csv_quoting:  # what pandas' to_csv(sep="\t") writes too
            csv.writer(f, delimiter="\t").writerows(rows)
        else:
            f.writelines("\t".join(r) + "\n" for r in rows)


def _sst2_rows(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[_sentence(rng, 7), str(i % 2)] for i in range(n)]


def test_a_sentence_with_a_line_end_is_not_loaded_as_its_second_half(tmp_path: Path) -> None:
    """csv.writer wraps a sentence holding a line end in quotes: read as GLUE's files are, its
    first half was a malformed row (warned as such) and its second half, with the closing quote,
    an example of its own ('and the second half ."', label 1), without a word about quoting.
    Now the row is one CSV-quoted row, warned about as the others, and loaded whole."""
    rows = _sst2_rows(200, 0)
    rows[5] = ["the first half of it\nand the second half .", "1"]
    path = tmp_path / "mine.tsv"
    _write(path, "sentence\tlabel", rows, csv_quoting=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = tx._read(path, tx.SST2_FORMAT)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "1 of its 200 rows have a sentence written with CSV quoting" in \
        said[0] and "line 7" in said[0] and "QUOTE_NONE" in said[0], said
    assert "malformed" not in said[0]
    assert len(got.labels) == 200 and got.skipped == 0
    assert not any(s.startswith("and the second half") for s in got.first)
    assert got.first[5] == '"the first half of it\nand the second half ."'
    assert got.labels == [int(r[1]) for r in rows]


def test_many_pairs_cut_at_a_line_end_are_refused(tmp_path: Path) -> None:
    """MRPC: a second sentence cut at its line end left a valid 5-field row whose #2 String was
    its first half ('"the first half'), loaded as a pair, the rest skipped as malformed. Many
    such rows refuse the file with the CSV-quoting message and fix; a handful warn."""
    rng = random.Random(1)
    rows = [[str(i % 2), str(100 + i), str(900 + i), _sentence(rng, 8), _sentence(rng, 7)]
            for i in range(60)]
    for i in range(0, 60, 6):
        rows[i][4] = "first part\nsecond part ."
    path = tmp_path / "rows.tsv"
    _write(path, MRPC_HEADER, rows, csv_quoting=True)
    with pytest.raises(DataUnavailableError, match=r"10 of its 60 rows have a #1 String or #2 "
                       r"String written with CSV quoting.*line 2, 9, 16.*QUOTE_NONE"):
        tx._read(path, tx.MRPC_FORMAT)
    few = [list(r) for r in rows]
    for i in range(6, 60, 6):
        few[i][4] = rows[i + 1][4]
    _write(path, MRPC_HEADER, few, csv_quoting=True)
    with pytest.warns(UserWarning, match=r"1 of its 60 rows .*CSV quoting.*line 2;"):
        got = tx._read(path, tx.MRPC_FORMAT)
    assert len(got.labels) == 60 and got.second[0] == '"first part\nsecond part ."'
    assert got.second[1:] == [r[4] for r in few[1:]]


def test_glue_quotes_left_open_are_text_as_before(tmp_path: Path) -> None:
    """GLUE's own files hold sentences that start with a quote closed in no later line (MRPC: 24
    of train.tsv's #2 Strings): joined by tabs, they load as they are, without a warning."""
    rng = random.Random(2)
    rows = [[str(i % 2), str(100 + i), str(900 + i), _sentence(rng, 8),
             ('" We are done , he said .' if i % 4 == 0 else _sentence(rng, 7))]
            for i in range(40)]
    rows[9][3] = 'he said . "'
    path = tmp_path / "rows.tsv"
    _write(path, MRPC_HEADER, rows, csv_quoting=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = tx._read(path, tx.MRPC_FORMAT)
    assert got.first == [r[3] for r in rows] and got.second == [r[4] for r in rows]


def _svhn(path: Path, x: np.ndarray) -> None:
    from scipy.io import savemat

    y = (np.arange(x.shape[3]) % 10 + 1).reshape(-1, 1).astype(np.uint8)  # 10 is the digit 0
    savemat(path, {"X": x, "y": y})


def test_an_svhn_test_file_sharing_the_training_images_warns(tmp_path: Path) -> None:
    """A test_32x32.mat of one's own (verify=False) with 30 of its 40 images from the training
    file beside it loaded without a word (only a byte copy was refused); it now warns, naming
    the share, as MNIST's and CIFAR-10's do. A file sharing few images stays silent."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (32, 32, 3, 40), dtype=np.uint8)
    fresh = rng.integers(0, 256, (32, 32, 3, 40), dtype=np.uint8)
    _svhn(tmp_path / "train_32x32.mat", train)
    _svhn(tmp_path / "test_32x32.mat", np.concatenate([train[..., :30], fresh[..., :10]], 3))
    with pytest.warns(UserWarning, match=r"test_32x32\.mat: 30 of its 40 images \(75%\) are "
                      r"also in train_32x32\.mat.*held-out file that shares"):
        ds = create_dataset("svhn", split="test", root=tmp_path, verify=False)
    assert len(ds) == 40
    _svhn(tmp_path / "test_32x32.mat", np.concatenate([train[..., :3], fresh[..., :37]], 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(create_dataset("svhn", split="test", root=tmp_path, verify=False)) == 40


@pytest.mark.parametrize("seed", [1.5, True, "one", None])
def test_a_data_seed_that_is_not_an_int_names_the_option(seed: object) -> None:
    """digits(seed=1.5) raised torch's 'manual_seed expected a long, but got float', naming
    neither the option nor the fix; rotten_tomatoes the same."""
    with pytest.raises(ValueError, match=rf"digits: seed={seed!r} is not an int.*pass an int"):
        create_dataset("digits", split="test", seed=seed)
    with pytest.raises(ValueError, match=r"rotten_tomatoes: seed=.* is not an int"):
        create_dataset("rotten_tomatoes", split="validation", seed=seed)


def test_numpy_integer_seeds_are_ints() -> None:
    """np.int64(3) (a seed read from an array) raised 'an integer is required'; it is seed 3."""
    a = create_dataset("digits", split="test", seed=np.int64(3))
    b = create_dataset("digits", split="test", seed=3)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_first_with_a_seed_for_its_generator_names_the_fix() -> None:
    data = ArrayDataset(torch.arange(10.0).reshape(10, 1), torch.zeros(10, dtype=torch.long), 2,
                        name="toy")
    with pytest.raises(TypeError, match=r"toy: generator=0 is not a torch\.Generator.*"
                       r"manual_seed\(seed\)"):
        data.first(3, generator=0)  # type: ignore[arg-type]
    got = data.first(3, generator=torch.Generator().manual_seed(0))
    assert len(got) == 3 and len(set(got.inputs.flatten().tolist())) == 3


def test_corrupted_refuses_a_seed_that_is_not_whole():
    from senslab.data.corruptions import corrupted

    with pytest.raises(ValueError, match=r"corrupted: seed=1.5 is not an int"):
        corrupted(base="digits", corruption="gaussian_noise", severity=1, seed=1.5)
