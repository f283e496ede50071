"""Corner cases of the data loaders on fixture files in the real formats: GLUE zips that cannot
be read or extracted, idx (and pickle) MNIST copies read with ``verify=False`` whose images are
not 28×28 or whose labels do not fit, and GLUE held-out files that share most of their examples
with the training file beside them."""

from __future__ import annotations

import gzip
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from unprivileged import as_ordinary_user

from senslab.data import DataUnavailableError, create_dataset

WORDS = ("the film a story was dull bright actors moving plot slow funny score "
         "quiet ending cast warm cold scenes").split()
SST2_HEADER = "sentence\tlabel"
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"


def _sentences(n: int, seed: int) -> list[str]:
    """``n`` different sentences (each ends with its own number, so none repeats by chance)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + f" {seed}-{i}"
            for i in range(n)]


def _sst2_text(sentences: list[str]) -> str:
    # GLUE's SST-2 rows end their sentence with a space before the tab
    return SST2_HEADER + "\n" + "".join(f"{s} \t{i % 2}\n" for i, s in enumerate(sentences))


def _load(name: str, root: Path, split: str = "train", **kw):  # small vocab: fast training
    return create_dataset(name, split=split, root=root, **{"vocab_size": 300, **kw})


# --------------------------------------------------------------------------- GLUE zips


def _sst2_zip(root: Path, compression: int = zipfile.ZIP_DEFLATED,
              members: tuple[str, ...] = ("SST-2/train.tsv", "SST-2/dev.tsv")) -> Path:
    """``root/SST-2.zip`` laid out as GLUE's: an ``SST-2/`` folder holding the two splits."""
    root.mkdir(parents=True, exist_ok=True)
    texts = {"train.tsv": _sst2_text(_sentences(30, 0)), "dev.tsv": _sst2_text(_sentences(8, 1))}
    path = root / "SST-2.zip"
    with zipfile.ZipFile(path, "w", compression) as z:
        for m in members:
            z.writestr(m, texts[m.rsplit("/", 1)[-1]])
    return path


def _cut(path: Path) -> None:  # an interrupted download
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _error_page(path: Path) -> None:  # what a proxy or a moved URL saves under the zip's name
    path.write_bytes(b"<html><body>404 Not Found</body></html>\n")


def _flip_in_train(path: Path) -> None:  # one damaged byte inside train.tsv's stored data
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"sentence\tlabel") + 3] ^= 0x20
    path.write_bytes(bytes(raw))


def _flip_deflated(path: Path) -> None:  # one damaged byte inside train.tsv's compressed data
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"SST-2/train.tsv") + len(b"SST-2/train.tsv") + 8] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage, compression", [
    (_cut, zipfile.ZIP_DEFLATED), (_error_page, zipfile.ZIP_DEFLATED),
    (_flip_in_train, zipfile.ZIP_STORED), (_flip_deflated, zipfile.ZIP_DEFLATED)],
    ids=["cut-short", "error-page", "bad-crc", "bad-deflate-data"])
def test_a_damaged_glue_zip_is_refused_naming_the_archive_and_the_fix(
        tmp_path: Path, damage, compression: int) -> None:
    """zipfile's bare ``BadZipFile`` ("File is not a zip file", "Bad CRC-32") named neither the
    archive nor what to do; now the error names it, says it is damaged and how to get on."""
    root = tmp_path / "sst2"
    zpath = _sst2_zip(root, compression)
    damage(zpath)
    with pytest.raises(DataUnavailableError) as info:
        _load("sst2", root, split="dev")
    msg = str(info.value)
    assert msg.startswith(f"{zpath} is not a readable zip archive"), msg
    assert f"delete {zpath} and download it again" in msg
    assert f"put GLUE's train.tsv and dev.tsv in {root} by hand" in msg
    # nothing half-extracted is left to be read as the split next time
    assert not (root / "train.tsv").exists() and not (root / "dev.tsv").exists()


@pytest.mark.parametrize("members, held", [
    (("QQP/train.tsv", "QQP/dev.tsv"), "QQP/train.tsv, QQP/dev.tsv"),  # another task's zip
    (("train.tsv", "dev.tsv"), "train.tsv, dev.tsv"),  # zipped again without its folder
    (("SST-2/train.tsv",), "SST-2/train.tsv")],  # a split missing
    ids=["another-task", "no-folder", "one-split"])
def test_a_glue_zip_without_the_tasks_files_is_refused(tmp_path: Path, members: tuple[str, ...],
                                                       held: str) -> None:
    root = tmp_path / "sst2"
    zpath = _sst2_zip(root, members=members)
    with pytest.raises(DataUnavailableError, match=f"it holds {held}\\): it is not GLUE's "
                                                   "SST-2.zip") as info:
        _load("sst2", root)
    assert str(info.value).startswith(f"{zpath} has no SST-2/")
    assert not (root / "train.tsv").exists()  # not even the member that was there


def test_a_good_glue_zip_still_extracts_and_loads(tmp_path: Path) -> None:
    root = tmp_path / "sst2"
    _sst2_zip(root)
    with pytest.warns(UserWarning, match="reference md5"):  # a fixture is not GLUE's file
        d = _load("sst2", root, split="dev")
    assert d.targets.tolist() == [i % 2 for i in range(8)]
    assert (root / "dev.tsv").read_text() == _sst2_text(_sentences(8, 1))


_LOAD_SST2 = """
import sys, warnings
from senslab.data import create_dataset
warnings.simplefilter("ignore")
try:
    create_dataset("sst2", split="dev", root=sys.argv[1], vocab_size=300)
    print("loaded")
except Exception as err:
    print(type(err).__name__, err)
"""


def test_a_glue_zip_in_a_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    """A shared, read-only data folder holding SST-2.zip gave a bare ``PermissionError`` on a
    temporary file name; now the error says what could not be done and the ways on."""
    top = Path(tempfile.mkdtemp(prefix="senslab-ro-"))  # readable by another user
    try:
        os.chmod(top, 0o755)
        zpath = _sst2_zip(top / "ro")
        os.chmod(top / "ro", 0o555)
        cmd = [sys.executable, "-c", _LOAD_SST2, str(top / "ro")]
        cmd = as_ordinary_user(cmd)  # root writes anywhere
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "SENSLAB_CACHE": str(top / "cache")})
        assert out.stdout.startswith("DataUnavailableError cannot extract SST-2/train.tsv from "
                                     f"SST-2.zip into {top / 'ro'}"), out
        assert "the folder is not writable" in out.stdout
        assert f"unzip -j {zpath} SST-2/train.tsv SST-2/dev.tsv -d {top / 'ro'}" in out.stdout
        assert "point data.root" in out.stdout and "SENSLAB_DATA" in out.stdout
    finally:
        os.chmod(top / "ro", 0o755)
        shutil.rmtree(top, ignore_errors=True)


# --------------------------------------------------------------------------- MNIST copies


def _idx(path: Path, magic: int, data: np.ndarray) -> Path:
    """An idx-gz file: big-endian magic and dims, then the uint8 bytes, gzipped."""
    header = struct.pack(f">I{data.ndim}I", magic, *data.shape)
    path.write_bytes(gzip.compress(header + data.astype(np.uint8).tobytes()))
    return path


def _idx_pair(root: Path, images: np.ndarray, labels: np.ndarray) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    return (_idx(root / "train-images-idx3-ubyte.gz", 2051, images),
            _idx(root / "train-labels-idx1-ubyte.gz", 2049, labels))


def _mnist(dataset: str, root: Path):
    kw = {"source": "idx"} if dataset == "mnist" else {}
    return create_dataset(dataset, split="train", root=root, verify=False,
                          normalize="none", **kw)


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
@pytest.mark.parametrize("hw", [(32, 32), (28, 20), (1, 784)])
def test_idx_images_that_are_not_28x28_are_refused(tmp_path: Path, dataset: str,
                                                   hw: tuple[int, int]) -> None:
    """A copy of one's own read with verify=False loaded 32×32 (or 1×784) images as they were:
    the models and patch grids then failed far from the file, or ran on the wrong grid."""
    rng = np.random.default_rng(0)
    img, _ = _idx_pair(tmp_path, rng.integers(0, 256, (6, *hw)), np.arange(6) % 10)
    with pytest.raises(DataUnavailableError) as info:
        _mnist(dataset, tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"{img} holds 6 images of {hw[0]}×{hw[1]} pixels"), msg
    assert f"where {dataset} images are 28×28" in msg and "resize your images to 28×28" in msg


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
def test_a_28x28_copy_of_ones_own_loads_image_by_image(tmp_path: Path, dataset: str) -> None:
    x = (np.arange(5)[:, None, None] * 40 + np.arange(28)[None, :, None]
         + np.arange(28)[None, None, :]) % 256
    _idx_pair(tmp_path, x, np.array([3, 1, 4, 1, 5]))
    d = _mnist(dataset, tmp_path)
    assert tuple(d.inputs.shape) == (5, 1, 28, 28)
    assert d.targets.tolist() == [3, 1, 4, 1, 5]
    assert np.array_equal((d.inputs[:, 0] * 255).round().numpy().astype(np.int64), x)


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
def test_idx_labels_that_do_not_fit_the_images_are_refused(tmp_path: Path, dataset: str) -> None:
    x = np.zeros((6, 28, 28))
    img, lab = _idx_pair(tmp_path / "count", x, np.arange(5))
    with pytest.raises(DataUnavailableError,
                       match="do not belong together.*Put the two files of one copy there") as info:
        _mnist(dataset, tmp_path / "count")
    assert str(info.value).startswith(f"{img} has 6 images but {lab} 5 labels")
    _, lab = _idx_pair(tmp_path / "range", x, np.array([0, 1, 10, 2, 255, 10]))
    with pytest.raises(DataUnavailableError) as info:  # a ValueError naming the folder before
        _mnist(dataset, tmp_path / "range")
    assert str(info.value).startswith(f"{lab} holds labels [10, 255] (3 of 6), where "
                                      f"{dataset}'s are 0..9"), info.value


def test_an_idx_file_of_another_kind_says_what_it_is(tmp_path: Path) -> None:
    """A labels file (or a float32 idx file) in the images' place: the error says what the file
    is, not only the number it starts with."""
    root = tmp_path / "swap"
    root.mkdir()
    _idx(root / "train-images-idx3-ubyte.gz", 2049, np.arange(6) % 10)
    _idx(root / "train-labels-idx1-ubyte.gz", 2049, np.arange(6) % 10)
    with pytest.raises(DataUnavailableError, match="with magic 2051 .*its magic is 2049, that of "
                                                   r"uint8 data in 1 dimension\(s\)"):
        _mnist("fashion_mnist", root)
    header = struct.pack(">IIII", 0x0D03, 2, 28, 28)  # float32 images
    (root / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(header + np.zeros((2, 28, 28), np.float32).tobytes()))
    with pytest.raises(DataUnavailableError, match="its magic is 3331, that of float32 data"):
        _mnist("fashion_mnist", root)


def test_an_mnist_pickle_whose_images_are_not_28x28_is_refused(tmp_path: Path) -> None:
    """Rows of 32×32 = 1,024 pixels were reshaped to 28×28 regardless: a bare reshape error, or
    (49 rows) 64 made-up images and a count mismatch."""
    for n in (10, 49):
        parts = tuple((np.zeros((n, 1024), np.float32), np.arange(n) % 10) for _ in range(3))
        with gzip.open(tmp_path / "mnist.pkl.gz", "wb") as f:
            pickle.dump(parts, f)
        with pytest.raises(DataUnavailableError, match=rf"training images are an array of shape "
                                                       rf"\({n}, 1024\).*\(N, 784\)"):
            create_dataset("mnist", split="test", root=tmp_path, source="pickle", verify=False)


# --------------------------------------------------------------------------- held-out overlap


def _sst2_split(root: Path, n_dev: int, shared: int) -> None:
    """train.tsv of 60 sentences and dev.tsv of ``n_dev``, whose first ``shared`` are training
    sentences (re-spaced: a copy saved with other whitespace is the same example)."""
    root.mkdir(parents=True, exist_ok=True)
    train = _sentences(60, 0)
    dev = ["  " + s.replace(" ", "  ") for s in train[:shared]] + _sentences(n_dev - shared, 1)
    (root / "train.tsv").write_text(_sst2_text(train))
    (root / "dev.tsv").write_text(_sst2_text(dev))


def test_a_dev_file_sharing_most_of_its_examples_with_train_warns(tmp_path: Path) -> None:
    """Only a byte copy of train.tsv was refused: a dev.tsv of one's own with 24 of its 40
    sentences taken from train.tsv loaded without a word, its held-out numbers then measured
    largely on training examples. It loads, with a warning naming the share and the fix."""
    _sst2_split(tmp_path, 40, 24)
    with pytest.warns(UserWarning, match=r"dev.tsv: 24 of its 40 examples \(60%\) are also in "
                                         r"train.tsv next to it .*measured on training examples"
                                         r".*remove the shared examples"):
        d = _load("sst2", tmp_path, split="dev")
    assert len(d) == 40


@pytest.mark.parametrize("n_dev, shared, warns", [
    (40, 10, False),  # 25%, but no more than 10 examples: a corpus may repeat a few sentences
    (40, 11, True),
    (200, 20, False),  # more than 10, but no more than a tenth
    (200, 21, True),
])
def test_the_overlap_warning_needs_more_than_10_examples_and_a_tenth(
        tmp_path: Path, n_dev: int, shared: int, warns: bool) -> None:
    _sst2_split(tmp_path, n_dev, shared)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _load("sst2", tmp_path, split="dev")
    overlap = [str(w.message) for w in seen if "are also in train.tsv" in str(w.message)]
    assert len(overlap) == warns, overlap
    if warns:
        assert f"{shared} of its {n_dev} examples" in overlap[0]
    # the train split itself is never checked against anything
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _load("sst2", tmp_path)
    assert not [w for w in seen if "are also in" in str(w.message)]


def test_mrpc_pairs_count_as_shared_in_either_order_and_not_by_one_sentence(
        tmp_path: Path) -> None:
    """A pair is the example: dev pairs that reuse one training sentence (as real MRPC's do) are
    no overlap; the same two sentences, in either order, are. The msr files are checked too."""
    a, b = _sentences(40, 2), _sentences(40, 3)
    train = [(str(i % 2), str(100 + i), str(200 + i), a[i], b[i]) for i in range(40)]
    one_sentence = [(str(i % 2), str(300 + i), str(400 + i), a[i], f"other {i}")
                    for i in range(20)]
    swapped = [(str(i % 2), str(500 + i), str(600 + i), b[i], a[i]) for i in range(20, 32)]
    for root, tr_name, dev_name, kw in (
            (tmp_path / "glue", "train.tsv", "dev.tsv", {}),
            (tmp_path / "msr", "msr_paraphrase_train.txt", "msr_paraphrase_test.txt",
             {"variant": "msr"})):
        root.mkdir()
        for name, rows in ((tr_name, train), (dev_name, one_sentence + swapped)):
            (root / name).write_text(MRPC_HEADER + "\n" + "".join("\t".join(r) + "\n"
                                                                  for r in rows))
        with pytest.warns(UserWarning, match=rf"{dev_name}: 12 of its 32 examples \(38%\) are "
                                             rf"also in {tr_name} next to it \(the same sentence "
                                             r"pair \(in either order\)"):
            d = _load("mrpc", root, split="dev", **kw)
        assert len(d) == 32
        (root / dev_name).write_text(MRPC_HEADER + "\n" + "".join("\t".join(r) + "\n"
                                                                  for r in one_sentence))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _load("mrpc", root, split="dev", **kw)
        assert not [w for w in seen if "are also in" in str(w.message)]


def test_a_leaky_split_in_a_zip_of_ones_own_is_caught_on_its_first_load(tmp_path: Path) -> None:
    """A split extracted from SST-2.zip was returned unchecked on the load that extracted it
    (only later loads, finding the files there, checked them): a dev.tsv copied from train.tsv
    loaded once without a word."""
    train = _sst2_text(_sentences(30, 0))
    for dev, copy in ((train, True), (_sst2_text(_sentences(30, 0)[:20]), False)):
        root = tmp_path / ("copy" if copy else "overlap")
        root.mkdir()
        with zipfile.ZipFile(root / "SST-2.zip", "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("SST-2/train.tsv", train)
            z.writestr("SST-2/dev.tsv", dev)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if copy:
                with pytest.raises(DataUnavailableError, match="byte-for-byte copy of train.tsv"):
                    _load("sst2", root, split="dev")
            else:
                _load("sst2", root, split="dev")
        said = [str(w.message) for w in seen if "are also in train.tsv" in str(w.message)]
        if copy:  # refused before any overlap is counted
            assert not said
        else:
            assert len(said) == 1 and "20 of its 20 examples (100%)" in said[0], said
