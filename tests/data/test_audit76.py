"""Data-layer faults of audit 76 (REPORT.md 1.1–1.9), each on small fixture files in the
official formats: a user's MRPC file replaced by a build, empty splits from a fraction, a
held-out image file that is the training file, labels cut to integers, options accepted and
ignored — each now refused (or kept) with an error that names the option or file and the fix."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from senslab.data import DataUnavailableError, create_dataset
from senslab.data.text import RT_FILE

from .test_data_trust import _cifar_folder
from .test_images import pixels, write_cifar10c, write_idx_gz
from .test_text import MRPC_HEADER, _load, _pair_rows, _write_tsv

#: the fixtures are small copies, which the loaders rightly say are not the reference files
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*reference:UserWarning", "ignore:.*images per severity:UserWarning")


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- 1.1 MRPC build


def _msr_sources(root: Path) -> list[tuple[str, ...]]:
    """Microsoft's two source files in ``root``: 30 pairs, of which dev_ids lists 6."""
    root.mkdir()
    msr = [(str(i % 2), str(1000 + i), str(6000 + i), *r[3:])
           for i, r in enumerate(_pair_rows(30, 0))]
    _write_tsv(root / "msr_paraphrase_train.txt", MRPC_HEADER, msr)
    (root / "dev_ids.tsv").write_text("".join(f"{r[1]}\t{r[2]}\n" for r in msr[:6]))
    return msr


def _own(n: int, seed: int, id0: int) -> list[tuple[str, ...]]:
    """``n`` pairs of one's own, with ids no msr pair has."""
    return [(r[0], str(id0 + i), str(id0 + 5000 + i), *r[3:])
            for i, r in enumerate(_pair_rows(n, seed))]


@pytest.mark.parametrize("own", ["train.tsv", "dev.tsv"])
def test_mrpc_build_writes_only_the_missing_file_and_never_replaces_the_users(
        tmp_path: Path, own: str) -> None:
    """1.1: a validation load beside one's own train.tsv rewrote it (50 rows → GLUE's rule's 24)
    and encoded validation with a BPE of that rebuilt file; one's own dev.tsv was rewritten by
    the tokenizer's training load. Now only the missing file is written, both loads keep the
    user's file, and validation uses the tokenizer of the train.tsv on disk."""
    root = tmp_path / "mrpc"
    _msr_sources(root)
    mine = _own(50 if own == "train.tsv" else 12, 7, 90000)
    _write_tsv(root / own, MRPC_HEADER, mine)
    before = _md5(root / own)
    first = _load("mrpc", root, split="train" if own == "train.tsv" else "validation")
    other = _load("mrpc", root, split="validation" if own == "train.tsv" else "train")
    again = _load("mrpc", root, split="train" if own == "train.tsv" else "validation")
    assert _md5(root / own) == before  # the user's file, kept
    assert len(first) == len(again) == len(mine)
    assert len(other) == (6 if own == "train.tsv" else 24)  # the missing file, by GLUE's rule
    # one tokenizer: trained on the train.tsv on disk, for every load
    assert first.meta["tokenizer"] == other.meta["tokenizer"] == again.meta["tokenizer"]


@pytest.mark.parametrize("own", ["train.tsv", "dev.tsv"])
def test_mrpc_build_beside_a_file_sharing_its_pairs_is_refused(tmp_path: Path, own: str) -> None:
    """1.1: where the user's file holds pairs that the missing file would hold too (all 30 msr
    pairs as one's train.tsv; a dev.tsv of one's own drawn from GLUE's training pairs), a build
    cannot make a split: refused, naming the file and the fix, and nothing written."""
    root = tmp_path / "mrpc"
    msr = _msr_sources(root)
    _write_tsv(root / own, MRPC_HEADER, msr if own == "train.tsv" else msr[10:20])
    before = _md5(root / own)
    missing = "dev.tsv" if own == "train.tsv" else "train.tsv"
    with pytest.raises(DataUnavailableError) as err:
        _load("mrpc", root, split="validation" if own == "train.tsv" else "train")
    msg = str(err.value)
    assert msg.startswith(f"{root / own}, a {own} of your own"), msg
    assert f"holds {6 if own == 'train.tsv' else 10} of the" in msg
    assert f"Put your own {missing} there" in msg and f"move {own} away" in msg
    assert not (root / missing).exists() and _md5(root / own) == before


# --------------------------------------------------------------------------- 1.2 digits


@pytest.mark.parametrize(("fraction", "empty"), [(0.001, "test"), (0.999, "train")])
def test_digits_test_fraction_that_empties_a_split_is_refused(fraction: float, empty: str) -> None:
    """1.2: 0.001 gave an empty test split and 0.999 an empty training split (its all-NaN
    "standard" stats made every test image NaN), each without a senslab word."""
    for split in ("train", "test"):
        with pytest.raises(ValueError) as err:
            create_dataset("digits", split=split, test_fraction=fraction, normalize="standard")
        msg = str(err.value)
        assert msg.startswith(f"digits: test_fraction={fraction}"), msg
        assert f"leaves the {empty} split without class" in msg
        assert "between 1/174 (0.0057) and 173/174 (0.9943)" in msg
    for fraction in (1 / 174, 173 / 174):  # the range named: every class on both sides
        test = create_dataset("digits", split="test", test_fraction=fraction)
        train = create_dataset("digits", split="train", test_fraction=fraction)
        assert set(test.targets.tolist()) == set(train.targets.tolist()) == set(range(10))


# --------------------------------------------------------------------------- 1.3 held-out copies


def _idx_copy(root: Path, recompress: bool) -> Path:
    """train and t10k idx pairs holding the same 12 images (the t10k pair gzipped again with
    other settings where ``recompress``: other bytes, the same data)."""
    root.mkdir()
    x, y = pixels((12, 28, 28), 1), np.arange(12, dtype=np.uint8) % 10
    write_idx_gz(root / "train-images-idx3-ubyte.gz", x, 2051)
    write_idx_gz(root / "train-labels-idx1-ubyte.gz", y, 2049)
    for kind in ("images-idx3", "labels-idx1"):
        src, dest = root / f"train-{kind}-ubyte.gz", root / f"t10k-{kind}-ubyte.gz"
        if recompress:
            dest.write_bytes(gzip.compress(gzip.decompress(src.read_bytes()), compresslevel=1,
                                           mtime=12345))
        else:
            shutil.copy(src, dest)
    return root / "t10k-images-idx3-ubyte.gz"


@pytest.mark.parametrize("case", ["fashion_mnist", "mnist", "fashion_mnist-regzipped",
                                  "cifar10", "svhn"])
def test_a_held_out_image_file_that_is_the_training_file_is_refused(tmp_path: Path,
                                                                   case: str) -> None:
    """1.3: with verify=False (a copy of one's own) a t10k idx pair equal to the train pair, a
    CIFAR-10 test_batch copied from data_batch_3 and an SVHN test file copied from the training
    file loaded silently: every held-out number was a training number. A test split that only
    has as many images as the training one still loads."""
    root = tmp_path / "data"
    name = case.split("-")[0]
    kw = {"source": "idx"} if name == "mnist" else {}
    if name in ("fashion_mnist", "mnist"):
        test_file = _idx_copy(root, recompress=case.endswith("regzipped"))
        copy_of = "train-images-idx3-ubyte.gz"
    elif name == "cifar10":
        raw = _cifar_folder(root, 3)
        test_file = root / "cifar-10-batches-py" / "test_batch"
        test_file.write_bytes(raw["data_batch_3"])
        copy_of = "data_batch_3"
    else:
        from scipy.io import savemat

        root.mkdir()
        savemat(root / "train_32x32.mat", {"X": pixels((32, 32, 3, 4)),
                                           "y": np.array([[10], [1], [9], [10]], np.uint8)})
        test_file = root / "test_32x32.mat"
        shutil.copy(root / "train_32x32.mat", test_file)
        copy_of = "train_32x32.mat"
    assert len(create_dataset(name, split="train", root=root, verify=False, **kw)) > 0
    with pytest.raises(DataUnavailableError) as err:
        create_dataset(name, split="test", root=root, verify=False, **kw)
    msg = str(err.value)
    assert msg.startswith(str(test_file)) and copy_of in msg, msg
    assert "training" in msg and "put " in msg
    if name == "fashion_mnist":  # same count, other images: a test split of one's own loads
        write_idx_gz(test_file, pixels((12, 28, 28), 2), 2051)
        assert len(create_dataset(name, split="test", root=root, verify=False)) == 12


# --------------------------------------------------------------------------- Rotten Tomatoes


def _rt_csv(root: Path, header: str, rows: list[str]) -> Path:
    root.mkdir()
    with bz2.open(root / RT_FILE, "wt", encoding="utf-8", newline="") as f:
        f.write(header + "\n" + "".join(r + "\n" for r in rows))
    return root


@pytest.mark.parametrize(("fraction", "split", "empty"),
                         [(0.01, "validation", "validation"), (0.99, "train", "training")])
def test_rotten_tomatoes_val_fraction_that_empties_a_split_is_refused(
        tmp_path: Path, fraction: float, split: str, empty: str) -> None:
    """1.4: val_fraction=1e-5 on the corpus (here 0.01 of 20 fresh and 15 rotten rows) left the
    validation split empty, reported as a malformed file (its plot rows counted as skipped)
    with the advice to replace the corpus."""
    rows = ([f"fresh,a fine film number {i}" for i in range(20)]
            + [f"rotten,a dull film number {i}" for i in range(15)]
            + [f'plot,"a story, told {i}"' for i in range(3)])
    root = _rt_csv(tmp_path / "rt", "category,text", rows)
    with pytest.raises(ValueError) as err:
        _load("rotten_tomatoes", root, split=split, val_fraction=fraction)
    msg = str(err.value)
    assert msg.startswith(f"rotten_tomatoes: val_fraction={fraction:g} sends"), msg
    assert f"leaves the {empty} split empty" in msg and "between 1/20" in msg
    assert "malformed" not in msg
    assert len(_load("rotten_tomatoes", root, split="validation", val_fraction=0.1)) == 2 + 2


def test_rotten_tomatoes_csv_without_its_columns_names_the_file_and_the_columns(
        tmp_path: Path) -> None:
    """1.8: a CSV of one's own with the columns review,label gave a bare KeyError: 'text'."""
    root = _rt_csv(tmp_path / "rt", "review,label", [f"nice film {i},fresh" for i in range(20)])
    with pytest.raises(DataUnavailableError) as err:
        _load("rotten_tomatoes", root)
    msg = str(err.value)
    assert msg.startswith(f"{root / RT_FILE} has no 'text' and no 'category' column"), msg
    assert "its columns: review, label" in msg and "columns text, category" in msg


# --------------------------------------------------------------------------- single images


def test_mnist_pickle_labels_that_are_not_whole_are_refused(tmp_path: Path) -> None:
    """1.5: a mnist.pkl.gz whose labels are 2.7, 3.2, … loaded as 2, 3, … (cut by an int64 cast
    before the label check); whole float labels still load as their ints."""
    def write(root: Path, labels: list[float]) -> Path:
        parts = tuple(((pixels((5, 784), i) / 256).astype(np.float32), np.array(labels))
                      for i in range(3))
        root.mkdir()
        with gzip.open(root / "mnist.pkl.gz", "wb") as f:
            pickle.dump(parts, f)
        return root

    cut = write(tmp_path / "cut", [2.7, 3.2, 1.9, 0.5, 4.4])
    with pytest.raises(ValueError, match=r"mnist.pkl.gz: labels must be whole numbers in 0..9 "
                                         r".*found \[0.5, 1.9, 2.7, 3.2, 4.4\]"):
        create_dataset("mnist", split="train50k", root=cut, source="pickle", verify=False)
    whole = write(tmp_path / "whole", [2.0, 3.0, 1.0, 0.0, 4.0])
    d = create_dataset("mnist", split="train50k", root=whole, source="pickle", verify=False)
    assert d.targets.tolist() == [2, 3, 1, 0, 4]


@pytest.mark.parametrize("severity", [True, 2.0, 0, "3"])
def test_cifar10c_severity_must_be_an_int_from_1_to_5(tmp_path: Path, severity: object) -> None:
    """1.6: severity=True loaded severity 1 (meta["severity"] = True) and 2.0 failed with a bare
    slice TypeError; numpy's integers still pass, recorded as an int."""
    write_cifar10c(tmp_path, "fog", 2)
    with pytest.raises(ValueError, match=r"cifar10c: severity must be one of 1, 2, 3, 4, 5, an "
                                         rf"int .*; got {severity!r}"):
        create_dataset("cifar10c", root=tmp_path, corruption="fog", severity=severity)
    d = create_dataset("cifar10c", root=tmp_path, corruption="fog", severity=np.int64(2))
    assert type(d.meta["severity"]) is int and d.meta["severity"] == 2


def test_svhn_mat_saved_as_v73_names_the_file_and_the_fix(tmp_path: Path) -> None:
    """1.7: an HDF5 (MATLAB -v7.3) .mat file reached the user as scipy's bare
    NotImplementedError ("Please use HDF reader …"), naming neither the file nor the fix."""
    head = (b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 "
            b"HDF5 schema 1.00 .").ljust(116, b" ") + b"\x00" * 8 + b"\x00\x02" + b"IM"
    (tmp_path / "test_32x32.mat").write_bytes(head + b"\x89HDF\r\n\x1a\n" + b"\x00" * 200)
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("svhn", split="test", root=tmp_path, verify=False)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'test_32x32.mat'} is a MATLAB v7.3 (HDF5)"), msg
    assert "'-v7'" in msg and "scipy.io.savemat" in msg and "official test_32x32.mat" in msg


# --------------------------------------------------------------------------- 1.9 generated sets


#: (dataset, options, what the error says) of options a generated set would have ignored
IGNORED = [
    ("boolean", {"n_bits": 10, "sampling": "fresh", "train_size": 128},
     "train_size=128 does not apply to sampling='fresh'.*pass size=128"),
    ("boolean", {"n_bits": 10, "sampling": "subset", "train_size": 128, "size": 50},
     "size=50 does not apply to sampling='subset'"),
    ("boolean", {"n_bits": 4, "sampling": "cube", "size": 16},
     "size=16 does not apply to sampling='cube'"),
    ("sparse_parity", {"n_bits": 10, "k": 5, "subset": [0, 1]},
     r"k=5 and subset=\[0, 1\] \(2 bits\) disagree.*pass k=2"),
    ("modular_addition", {"p": 7, "seed": 1.7}, "modular_addition: seed=1.7 is not an int"),
    ("boolean", {"n_bits": 4, "sampling": "cube", "seed": True}, "seed=True is not an int"),
    ("boolean", {"n_bits": 4, "function": "random", "function_seed": 0.5},
     "function_seed=0.5 is not an int"),
    ("sparse_frequent", {"seed": 2.5}, "sparse_frequent: seed=2.5 is not an int"),
]


def test_generated_sets_refuse_options_they_would_ignore() -> None:
    """1.9: train_size with fresh sampling trained on 1,024 strings, size with "subset" and k
    with a subset changed nothing, and seed=1.7 gave seed 1's data, each without a word. The
    options left out keep their meaning (None defaults), and whole seeds of any integer type
    give the int's data."""
    for name, options, named in IGNORED:
        with pytest.raises(ValueError, match=named):
            create_dataset(name, "train", **options)
    assert len(create_dataset("boolean", n_bits=10)) == 1024
    assert len(create_dataset("boolean", n_bits=10, sampling="subset")) == 256
    assert len(create_dataset("boolean", n_bits=10, sampling="subset", train_size=128)) == 128
    assert len(create_dataset("boolean", n_bits=10, size=64)) == 64
    assert create_dataset("sparse_parity", n_bits=10).meta["subset"] == \
        create_dataset("sparse_parity", n_bits=10, k=3).meta["subset"]
    assert create_dataset("sparse_parity", n_bits=10, k=2, subset=[4, 1]).meta["subset"] == [1, 4]
    base = create_dataset("modular_addition", p=7, seed=3).inputs
    for seed in (np.int64(3), torch.tensor(3), 3.0):
        assert torch.equal(create_dataset("modular_addition", p=7, seed=seed).inputs, base)


def test_boolean_function_seed_is_refused_without_a_random_table():
    """function_seed seeds the random table only: with parity it changed nothing."""
    from senslab.data.synthetic import boolean

    with pytest.raises(ValueError, match="function_seed seeds a random table"):
        boolean(function="parity", n_bits=4, sampling="cube", function_seed=3)
    a = boolean(function="random", n_bits=4, sampling="cube", function_seed=3)
    b = boolean(function="random", n_bits=4, sampling="cube", function_seed=4)
    assert not torch.equal(a.targets, b.targets)


@pytest.mark.parametrize("loader,options", [
    ("boolean", {"size": 0}), ("sparse_parity", {"test_size": 0}),
    ("sparse_parity", {"train_size": True}), ("sparse_frequent", {"num_samples": 0}),
])
def test_a_generated_set_of_no_examples_is_refused(loader, options):
    """A size of 0 gave an empty split without a word (no accuracy, no sensitivity)."""
    with pytest.raises(ValueError, match=r"must be an int ≥ 1 \(a number of examples\)"):
        create_dataset(loader, split="test", **options)
