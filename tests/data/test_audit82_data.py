"""Audit 82 of the image loaders: copies of one's own in the real formats (idx-gz, CIFAR-10 python
batches) that were refused with advice that destroyed them, or read into held-out numbers
measured on training images, and images normalised twice without a word."""

from __future__ import annotations

import gzip
import pickle
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from senslab.data import DataUnavailableError, create_dataset
from senslab.data.images import PIXEL_STATS, normalize_images


def _idx(path: Path, magic: int, array: np.ndarray, compress: bool = True) -> Path:
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + \
        array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def _batch(path: Path, data: np.ndarray, labels: list[int], str_keys: bool = False) -> None:
    obj = {"data": data, "labels": labels} if str_keys else {b"data": data, b"labels": labels}
    path.write_bytes(pickle.dumps(obj, protocol=4 if str_keys else 2))


def test_a_cifar_batch_pickled_by_python3_loads_as_torchvision_reads_it(tmp_path: Path) -> None:
    """A batch of one's own pickled by Python 3 ({"data": …, "labels": …}, str keys) was refused
    as damaged, with the advice to delete the folder that held it (there was no tarball)."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    data = {n: rng.integers(0, 256, (3, 3072), dtype=np.uint8)
            for n in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]}
    for i, (name, d) in enumerate(data.items()):
        _batch(folder / name, d, [i, (i + 3) % 10, 9], str_keys=name != "data_batch_1")
    train = create_dataset("cifar10", root=tmp_path, normalize="none", verify=False)
    pixels = (train.inputs * 255).round().to(torch.uint8).reshape(15, 3072).numpy()
    assert np.array_equal(pixels, np.concatenate([data[f"data_batch_{i}"] for i in range(1, 6)]))
    assert train.targets.tolist()[:6] == [0, 3, 9, 1, 4, 9]
    test = create_dataset("cifar10", split="test", root=tmp_path, normalize="none", verify=False)
    assert test.targets.tolist() == [5, 8, 9]
    # a batch of another set is still refused, naming the keys a CIFAR-10 batch has
    (folder / "test_batch").write_bytes(pickle.dumps({"data": data["test_batch"],
                                                      "fine_labels": [1, 2, 3]}))
    with pytest.raises(DataUnavailableError, match=r"test_batch is not a CIFAR-10 batch.*'data'"
                                                   r".*'labels'"):
        create_dataset("cifar10", split="test", root=tmp_path, verify=False)


def test_an_uncompressed_idx_file_under_a_gz_name_is_told_to_be_compressed(
        tmp_path: Path) -> None:
    """It was "truncated or not a valid gzip file; delete it and download it again": a copy of
    one's own thrown away, where it only needed compressing."""
    rng = np.random.default_rng(1)
    _idx(tmp_path / "train-images-idx3-ubyte.gz", 2051,
         rng.integers(0, 256, (4, 28, 28)), compress=False)
    _idx(tmp_path / "train-labels-idx1-ubyte.gz", 2049, np.arange(4))
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("fashion_mnist", root=tmp_path, verify=False)
    msg = str(err.value)
    assert "train-images-idx3-ubyte.gz is not gzip-compressed" in msg
    assert "gzip -k" in msg and "verify=False" in msg and "delete" not in msg
    # a .gz that is neither gzip nor idx keeps its message
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"<html>not found</html>")
    with pytest.raises(DataUnavailableError, match="truncated or not a valid gzip"):
        create_dataset("fashion_mnist", root=tmp_path, verify=False)


def test_normalize_images_refuses_images_already_normalised(tmp_path: Path) -> None:
    """A dataset loaded with its default normalisation (minus_one_one) normalised again: MNIST's
    "standard" made [-1, 1] pixels [-3.67, 2.82] without a word."""
    ds = create_dataset("digits", split="test")  # [-1, 1]
    assert float(ds.inputs.min()) == -1.0
    stats = PIXEL_STATS["mnist"]
    with pytest.raises(ValueError, match=r"takes pixels in \[0, 1\], got values in \[-1, 1\].*"
                                         r"normalize='none'.*denormalize"):
        normalize_images(ds.inputs.clone(), "standard", stats)
    with pytest.raises(ValueError, match="NaN pixels"):
        normalize_images(torch.full((1, 1, 2, 2), float("nan")), "none", stats)
    raw = create_dataset("digits", split="test", normalize="none").inputs
    x, (mean, std) = normalize_images(raw.clone(), "standard", stats)
    assert torch.allclose(x, (raw - 0.1307) / 0.3081) and (mean, std) == stats


def test_held_out_images_shared_with_the_training_images_warn(tmp_path: Path) -> None:
    """A test file of one's own (verify=False) drawn from the training images: 15 of 20 (idx)
    or 12 of 14 (CIFAR-10) held-out images were training images, measured without a word (only
    a whole copy of the training file was refused)."""
    rng = np.random.default_rng(2)
    train = rng.integers(0, 256, (50, 28, 28), dtype=np.uint8)
    test = np.concatenate([train[:15], rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)])
    _idx(tmp_path / "train-images-idx3-ubyte.gz", 2051, train)
    _idx(tmp_path / "train-labels-idx1-ubyte.gz", 2049, rng.integers(0, 10, 50))
    _idx(tmp_path / "t10k-images-idx3-ubyte.gz", 2051, test)
    _idx(tmp_path / "t10k-labels-idx1-ubyte.gz", 2049, rng.integers(0, 10, 20))
    with pytest.warns(UserWarning, match=r"t10k-images-idx3-ubyte.gz: 15 of its 20 images "
                                         r"\(75%\) are also in train-images-idx3-ubyte.gz"):
        ds = create_dataset("fashion_mnist", split="test", root=tmp_path, verify=False)
    assert len(ds) == 20  # loaded as it is
    # 10 shared images (a corpus may repeat a few) load without a word
    _idx(tmp_path / "t10k-images-idx3-ubyte.gz", 2051,
         np.concatenate([train[:10], rng.integers(0, 256, (10, 28, 28), dtype=np.uint8)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_dataset("fashion_mnist", split="test", root=tmp_path, verify=False)

    folder = tmp_path / "c" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = [rng.integers(0, 256, (6, 3072), dtype=np.uint8) for _ in range(5)]
    for i, b in enumerate(batches, 1):
        _batch(folder / f"data_batch_{i}", b, list(range(6)))
    held = np.concatenate([batches[0], batches[3], rng.integers(0, 256, (2, 3072), np.uint8)])
    _batch(folder / "test_batch", held, [0] * 14)
    with pytest.warns(UserWarning, match=r"test_batch: 12 of its 14 images \(86%\) are also in "
                                         r"data_batch_1..5"):
        create_dataset("cifar10", split="test", root=tmp_path / "c", verify=False)
