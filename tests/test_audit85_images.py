"""audit85 / images: the image loaders on damaged files, another set's files, and the layout of
what they return; ``normalize_images`` and ``denormalize`` on images of other shapes.

* An SVHN .mat file that is empty or cut inside its header failed with scipy's bare
  "MatReadError: Mat file appears to be truncated", naming no file; an empty training file
  beside a good test file stopped the test split's load so, where a damaged one is skipped.
* A CIFAR-10 batch with one damaged byte failed with a raw MemoryError or OverflowError.
* With ``verify=False``, MNIST's official files in a Fashion-MNIST folder (the two share their
  file names) loaded as Fashion-MNIST, unsaid; with ``verify`` they were named.
* SVHN's and CIFAR-10-C's images were transposed views (not contiguous), unlike the other sets'.
* ``normalize_images`` read one (C, H, W) image as C images of H channels and (N, H, W, C)
  images as W channels (normalize="none" returned 32 channels' statistics for CIFAR images);
  ``denormalize`` failed on channels-last images, and on grey images repeated to three channels,
  with a bare "shape '[3, 1, 1]' is invalid".

Fixture files in the exact formats of the real ones, written in tmp_path; no shared data, no
network.
"""

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
from senslab.data import images as im
from senslab.data._download import md5sum


def _pixels(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def _svhn_file(path: Path, n: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An SVHN .mat file as the official ones: X (32, 32, 3, N) uint8, y (N, 1), 0 stored as 10."""
    from scipy.io import savemat

    x = _pixels((32, 32, 3, n), seed)
    y = (np.arange(n) % 10 + 1).astype(np.uint8)[:, None]
    savemat(path, {"X": x, "y": y})
    return x, y


def test_an_empty_svhn_file_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "test_32x32.mat").write_bytes(b"")
    with pytest.raises(DataUnavailableError, match=r"test_32x32\.mat is truncated or not an SVHN "
                       r"\.mat file \(MatReadError.*download it again"):
        create_dataset("svhn", split="test", root=tmp_path, verify=False)


def test_an_svhn_test_split_loads_beside_an_empty_training_file(tmp_path: Path) -> None:
    x, y = _svhn_file(tmp_path / "test_32x32.mat")
    (tmp_path / "train_32x32.mat").write_bytes(b"")  # a copy that failed: skipped, as a damaged one
    ds = create_dataset("svhn", split="test", root=tmp_path, verify=False, normalize="none")
    assert ds.targets.tolist() == [int(v) % 10 for v in y.ravel()]
    want = torch.from_numpy(x.transpose(3, 2, 0, 1).astype(np.float32))
    assert torch.equal(ds.inputs * 255, want)


def _cifar_folder(root: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        obj = {b"batch_label": name.encode(), b"data": _pixels((4, 3072), i),
               b"labels": [(i + j) % 10 for j in range(4)], b"filenames": [b"x.png"] * 4}
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))
    return folder


def test_a_cifar_batch_with_a_damaged_byte_is_named_with_the_fix(tmp_path: Path) -> None:
    folder = _cifar_folder(tmp_path)
    good = (folder / "test_batch").read_bytes()
    refused = 0
    for at in range(64):  # the pickle's opcodes and lengths: MemoryError at byte 3 before
        damaged = bytearray(good)
        damaged[at] ^= 0xFF
        (folder / "test_batch").write_bytes(bytes(damaged))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                create_dataset("cifar10", split="test", root=tmp_path, verify=False)
        except DataUnavailableError as err:
            assert str(folder / "test_batch") in str(err)
            refused += 1
    assert refused > 0


def _idx_files(root: Path, table: dict[str, str], monkeypatch: pytest.MonkeyPatch,
               seed: int = 0) -> None:
    """The four idx-gz files, registered as ``table``'s official ones (their md5s)."""
    root.mkdir(parents=True)
    for prefix, n in (("train", 20), ("t10k", 10)):
        x, y = _pixels((n, 28, 28), seed + n), (np.arange(n) + seed) % 10
        for kind, data, magic in (("images-idx3", x, 2051), ("labels-idx1", y, 2049)):
            path = root / f"{prefix}-{kind}-ubyte.gz"
            header = struct.pack(f">I{data.ndim}I", magic, *data.shape)
            path.write_bytes(gzip.compress(header + data.astype(np.uint8).tobytes()))
            monkeypatch.setitem(table, path.name, md5sum(path))


@pytest.mark.parametrize("split", ["train", "test"])
def test_mnists_files_are_not_read_as_fashion_mnist_without_verify(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str) -> None:
    _idx_files(tmp_path / "m", im.MNIST_FILES, monkeypatch)
    with pytest.raises(DataUnavailableError, match=r"is mnist's .*use dataset mnist"):
        create_dataset("fashion_mnist", split=split, root=tmp_path / "m", verify=False)
    # the files' own set, and another copy of the other set, still load without verify
    assert len(create_dataset("mnist", split=split, root=tmp_path / "m", verify=False)) > 0
    _idx_files(tmp_path / "f", {}, monkeypatch, seed=1)
    assert len(create_dataset("fashion_mnist", split=split, root=tmp_path / "f",
                              verify=False)) > 0


def test_svhn_and_cifar10c_images_are_contiguous(tmp_path: Path) -> None:
    x, _ = _svhn_file(tmp_path / "test_32x32.mat")
    svhn = create_dataset("svhn", split="test", root=tmp_path, verify=False, normalize="none")
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    c = _pixels((10, 32, 32, 3), 3)
    np.save(folder / "snow.npy", c)
    np.save(folder / "labels.npy", np.tile(np.arange(2), 5).astype(np.uint8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a partial copy: 2 images per severity
        c10c = create_dataset("cifar10c", split="test", root=tmp_path, corruption="snow",
                              severity=2, normalize="none")
    for ds, want in ((svhn, x.transpose(3, 2, 0, 1)), (c10c, c[2:4].transpose(0, 3, 1, 2))):
        assert ds.inputs.is_contiguous()
        flat = ds.inputs.view(len(ds), -1) * 255  # failed on the transposed views
        assert torch.equal(flat, torch.from_numpy(want.reshape(len(ds), -1).astype(np.float32)))


STATS3 = im.PIXEL_STATS["cifar10"]


@pytest.mark.parametrize("mode", im.NORMALIZE_MODES)
@pytest.mark.parametrize("shape, fix", [((3, 32, 32), r"x\.unsqueeze\(0\)"),
                                        ((5, 32, 32), r"x\.unsqueeze\(1\)"),
                                        ((2, 32, 32, 3), r"x\.permute\(0, 3, 1, 2\)")])
def test_normalize_images_refuses_one_image_and_channels_last(mode: str, shape, fix) -> None:
    x = torch.rand(shape)
    before = x.clone()
    with pytest.raises(ValueError, match=fix):
        im.normalize_images(x, mode, STATS3)
    assert torch.equal(x, before)  # refused before the in-place change


def test_normalize_images_still_takes_batches_and_grey_repeated_to_rgb() -> None:
    x = torch.rand(2, 3, 8, 8)
    out, (mean, std) = im.normalize_images(x.clone(), "standard", STATS3)
    m, s = torch.tensor(STATS3[0]).view(1, 3, 1, 1), torch.tensor(STATS3[1]).view(1, 3, 1, 1)
    assert torch.allclose(out, (x - m) / s) and mean == STATS3[0] and std == STATS3[1]
    grey = torch.rand(2, 1, 8, 8).repeat(1, 3, 1, 1)  # MNIST's one-channel stats, minus_one_one
    out, _ = im.normalize_images(grey.clone(), "minus_one_one", im.PIXEL_STATS["mnist"])
    assert torch.allclose(out, grey * 2 - 1)


def test_denormalize_names_channels_last_and_takes_grey_stats_on_rgb() -> None:
    meta3 = {"mean": STATS3[0], "std": STATS3[1]}
    with pytest.raises(ValueError, match=r"x\.permute\(0, 3, 1, 2\)"):
        im.denormalize(torch.rand(2, 32, 32, 3), meta3)
    with pytest.raises(ValueError, match=r"x\.permute\(2, 0, 1\)"):
        im.denormalize(torch.rand(32, 32, 3), meta3)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        im.denormalize(torch.rand(2, 3072), meta3)
    with pytest.raises(ValueError, match="images have 2 channels .* meta 3"):
        im.denormalize(torch.rand(2, 2, 8, 8), meta3)
    grey = torch.rand(2, 1, 8, 8).repeat(1, 3, 1, 1) * 2 - 1
    meta1 = {"mean": im.PIXEL_STATS["mnist"][0], "std": im.PIXEL_STATS["mnist"][1]}
    out = im.denormalize(grey, meta1)
    assert torch.allclose(out, grey * 0.3081 + 0.1307)
    one = torch.rand(3, 4, 4)  # one (C, H, W) image, as before
    want = one * torch.tensor(STATS3[1]).view(3, 1, 1) + torch.tensor(STATS3[0]).view(3, 1, 1)
    assert torch.allclose(im.denormalize(one, meta3), want)
