"""Data of one's own disk read image by image and label by label (fixtures in the real formats,
each image encoding its index), and the refusals that name the problem and the fix."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from unprivileged import as_ordinary_user

from senslab.data import DataUnavailableError, create_dataset


def _image(n: int) -> np.ndarray:
    """(3, 32, 32) uint8 whose every pixel tells its image, channel, row and column apart."""
    c, h, w = np.meshgrid(np.arange(3), np.arange(32), np.arange(32), indexing="ij")
    return ((n * 7 + c * 50 + h * 3 + w) % 256).astype(np.uint8)


def _bytes(ds) -> np.ndarray:
    return (ds.inputs * 255).round().to(torch.uint8).numpy()


def test_cifar10_and_svhn_images_come_out_in_order_orientation_channels_and_scale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scipy.io import savemat

    buf, start = io.BytesIO(), 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, n in [(f"data_batch_{i}", 3) for i in range(1, 6)] + [("test_batch", 2)]:
            idx = range(start, start + n)
            start += n
            obj = {b"data": np.stack([_image(j).reshape(-1) for j in idx]),
                   b"labels": [j * 3 % 10 for j in idx]}
            data = pickle.dumps(obj, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(buf.getvalue())
    train = create_dataset("cifar10", root=tmp_path, normalize="none", verify=False)
    assert train.inputs.dtype == torch.float32 and float(train.inputs.max()) == 1.0
    assert all(np.array_equal(x, _image(j)) for j, x in enumerate(_bytes(train)))
    assert train.targets.tolist() == [j * 3 % 10 for j in range(15)]
    test = create_dataset("cifar10", split="test", root=tmp_path, normalize="none",
                          verify=False)
    assert np.array_equal(_bytes(test)[1], _image(16)) and test.targets.tolist() == [5, 8]

    svhn = tmp_path / "svhn"
    svhn.mkdir()
    x = np.stack([_image(j).transpose(1, 2, 0) for j in range(3)], axis=-1)  # (32, 32, 3, N)
    for split in ("train", "test"):
        savemat(svhn / f"{split}_32x32.mat", {"X": x, "y": np.array([[10], [1], [9]], np.uint8)})
    ds = create_dataset("svhn", root=svhn, normalize="none", verify=False)
    assert all(np.array_equal(b, _image(j)) for j, b in enumerate(_bytes(ds)))
    assert ds.targets.tolist() == [0, 1, 9]  # digit 0 stored as 10


def test_mnist_50k_10k_split_of_a_copy_without_60000_images_is_refused(
        tmp_path: Path, idx_dataset) -> None:
    # a 20-image training copy: "val10k" was every image past the 50,000th (none), without a
    # word, and "train50k" all 20
    idx_dataset(tmp_path, n_train=20, n_test=10, dataset="mnist")
    for split in ("train50k", "val10k"):
        with pytest.raises(DataUnavailableError, match=r"60,000 training images.*hold 20"):
            create_dataset("mnist", split=split, root=tmp_path)
    assert len(create_dataset("mnist", root=tmp_path)) == 20  # all of them, as asked


def test_fashion_mnist_pointed_at_mnist_files_names_them_and_never_says_delete(
        tmp_path: Path, idx_dataset) -> None:
    # the fixture's md5s stand in for MNIST's official ones; Fashion-MNIST keeps its own
    idx_dataset(tmp_path, dataset="mnist")
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("fashion_mnist", root=tmp_path)
    msg = str(err.value)
    assert "is mnist's train-images-idx3-ubyte.gz" in msg and "Delete" not in msg
    assert (tmp_path / "train-images-idx3-ubyte.gz").exists()


def test_a_held_out_file_that_is_a_copy_of_the_training_file_is_refused(tmp_path: Path) -> None:
    rows = [f"words number {i}\t{i % 2}\n" for i in range(30)]
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(rows))
    shutil.copy(tmp_path / "train.tsv", tmp_path / "dev.tsv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's row counts are not SST-2's
        with pytest.raises(DataUnavailableError, match="byte-for-byte copy of train.tsv"):
            create_dataset("sst2", split="validation", root=tmp_path, vocab_size=300)
        (tmp_path / "dev.tsv").write_text("sentence\tlabel\n" + "".join(rows[:15]))
        assert len(create_dataset("sst2", split="validation", root=tmp_path,
                                  vocab_size=300)) == 15


def test_a_root_that_is_close_says_where_the_files_are(tmp_path: Path) -> None:
    batches = tmp_path / "cifar" / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    with pytest.raises(DataUnavailableError, match=f"data.root={tmp_path / 'cifar'}\\)"):
        create_dataset("cifar10", root=batches)
    raw = tmp_path / "tv" / "FashionMNIST" / "raw"  # torchvision's layout
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        (raw / name).write_bytes(b"")
        (tmp_path / name[:-3]).write_bytes(b"")
    with pytest.raises(DataUnavailableError, match=f"they are in {raw}: pass that folder"):
        create_dataset("fashion_mnist", root=tmp_path / "tv")
    with pytest.raises(DataUnavailableError, match="uncompressed.*verify=False"):
        create_dataset("fashion_mnist", root=tmp_path)


_LOAD = """
import sys
from senslab.data import create_dataset
try:
    create_dataset("cifar10", root=sys.argv[1], verify=False)
except Exception as err:
    print(type(err).__name__, err)
"""


def test_a_tarball_in_a_read_only_folder_is_a_clear_error(cifar_tarball) -> None:
    # a folder of its own under /tmp that another user can read (tmp_path's parents cannot be)
    top = Path(tempfile.mkdtemp(prefix="senslab-ro-"))
    try:
        os.chmod(top, 0o755)
        cifar_tarball(top / "ro", 2)
        os.chmod(top / "ro", 0o555)
        cmd = [sys.executable, "-c", _LOAD, str(top / "ro")]
        cmd = as_ordinary_user(cmd)  # root writes anywhere
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "SENSLAB_CACHE": str(top / "cache")})
        assert out.stdout.startswith("DataUnavailableError cannot extract"), out
        assert "not writable" in out.stdout and "tar -xf" in out.stdout
    finally:
        os.chmod(top / "ro", 0o755)
        shutil.rmtree(top, ignore_errors=True)

