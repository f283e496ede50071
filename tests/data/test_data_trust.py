"""Data read wrong without a word: fixture files in the exact official formats (GLUE .tsv,
idx-gz, CIFAR-10 python batches) with the faults an audit found, each refused or warned about."""

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

SST2_ROWS = ["sentence\tlabel", "it 's a charming and often affecting journey . \t1",
             "unflinchingly bleak and desperate \t0", "the acting is \"astounding\" \t1"]


#: the fixtures are small copies, which the loaders rightly say are not the reference files
pytestmark = pytest.mark.filterwarnings("ignore:.*but sst2's reference:UserWarning")


def _sst2(root: Path, dev: bytes) -> Path:
    """An sst2 folder: a good train.tsv (LF line ends, as GLUE's) and ``dev`` as dev.tsv."""
    root.mkdir()
    (root / "train.tsv").write_bytes(("\n".join(SST2_ROWS) + "\n").encode())
    (root / "dev.tsv").write_bytes(dev)
    return root


def test_a_tsv_that_is_not_utf8_names_the_file_and_the_fix(tmp_path: Path) -> None:
    """A Latin-1 or UTF-16 copy of a GLUE file raised Python's bare UnicodeDecodeError, naming
    neither the file nor the fix."""
    latin = _sst2(tmp_path / "latin", "sentence\tlabel\nun caf\u00e9 amer \t0\n".encode("latin-1"))
    with pytest.raises(DataUnavailableError, match=r"latin/dev.tsv is not UTF-8 text \(byte "
                                                   r"\d+.*save it as UTF-8"):
        create_dataset("sst2", split="dev", root=latin, vocab_size=300)
    wide = _sst2(tmp_path / "wide", ("\n".join(SST2_ROWS) + "\n").encode("utf-16"))
    with pytest.raises(DataUnavailableError, match=r"wide/dev.tsv is not UTF-8 text \(byte 0"):
        create_dataset("sst2", split="dev", root=wide, vocab_size=300)


def test_classic_mac_line_ends_are_named_as_such_not_fixed_by_merging_rows(
        tmp_path: Path) -> None:
    """A file whose every line ends in a bare CR was called a CR "inside a field", with the
    advice to replace it by a space — which would merge the whole file into one line."""
    root = _sst2(tmp_path / "sst2", ("\r".join(SST2_ROWS) + "\r").encode())
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("sst2", split="dev", root=root, vocab_size=300)
    msg = str(err.value)
    assert "dev.tsv: its lines end in bare carriage returns" in msg
    assert "convert the line ends to \\n" in msg and "replace it with a space" not in msg
    # the same rows with CRLF or LF line ends load, in file order, labels as written
    (root / "dev.tsv").write_bytes(("\r\n".join(SST2_ROWS) + "\r\n").encode())
    ds = create_dataset("sst2", split="dev", root=root, vocab_size=300)
    assert ds.targets.tolist() == [1, 0, 1]


@pytest.mark.parametrize("n", [-2, 4, 2.0, True])
def test_first_n_outside_the_dataset_is_refused(n) -> None:
    """``first(n)`` with n past the end gave fewer examples than asked, a negative n all but the
    last -n (``slice(0, -2)``, ``randperm(...)[:-2]``), without a word."""
    ds = create_dataset("sparse_parity", split="test", test_size=3, n_bits=4, k=2)
    with pytest.raises(ValueError, match=r"asked for n=.* examples of 3; pass a whole number "
                                         r"in 0\.\.3"):
        ds.first(n)
    with pytest.raises(ValueError, match="examples of 3"):
        ds.first(n, generator=torch.Generator().manual_seed(0))
    picked = [ds.first(3, generator=torch.Generator().manual_seed(5)).inputs for _ in range(2)]
    assert torch.equal(*picked) and len(ds.first(np.int64(2))) == 2 and len(ds.first(0)) == 0


@pytest.mark.parametrize("fraction", [-0.1, 0.0, 1.0, 1.5])
def test_digits_test_fraction_outside_0_1_is_refused(fraction: float) -> None:
    """test_fraction=-0.1 sent ``perm[:-k]`` of each class to "test": 1,618 test images and 179
    training ones, unsaid; 0 and 1 left a split empty."""
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\)"):
        create_dataset("digits", split="test", test_fraction=fraction)
    assert len(create_dataset("digits", split="test", test_fraction=0.2)) == 359


def test_an_idx_file_cut_inside_its_header_is_a_clear_error(tmp_path: Path) -> None:
    """An idx file shorter than its own header raised struct's bare error (verify=False copies
    are not md5-checked first)."""
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(struct.pack(">II", 2051, 60_000)))
    with pytest.raises(DataUnavailableError, match=r"ends inside its header \(8 bytes, the "
                                                   r"header alone has 16\).*truncated"):
        im.read_idx(path, 2051)


CIFAR_BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _cifar_folder(root: Path, per_batch: int) -> dict[str, bytes]:
    """An extracted ``cifar-10-batches-py`` as the official tarball holds it (pickled dicts of
    uint8 rows R, G, B planes and labels); returns each batch's bytes."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    out = {}
    for i, name in enumerate(CIFAR_BATCHES):
        rng = np.random.default_rng(i)
        obj = {b"batch_label": name.encode(),
               b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
               b"labels": [(i + j) % 10 for j in range(per_batch)],
               b"filenames": [b"x.png"] * per_batch}
        out[name] = pickle.dumps(obj, protocol=2)
        (folder / name).write_bytes(out[name])
    return out


def test_a_cifar_batch_changed_since_extraction_warns(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The extracted folder was never checked: a batch whose pixels changed (one byte), another
    batch's copy, or one of fewer images than the official 10,000 loaded without a word."""
    raw = _cifar_folder(tmp_path, 3)
    folder = tmp_path / "cifar-10-batches-py"
    # these fixture batches stand in for the reference files
    monkeypatch.setattr(im, "CIFAR10_BATCH_MD5S", {n: md5sum(folder / n) for n in raw},
                        raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the batches as extracted: no warning
        clean = create_dataset("cifar10", split="test", root=tmp_path, normalize="none")
    batch = pickle.loads(raw["test_batch"], encoding="bytes")
    batch[b"data"][1, 5] ^= 0xFF  # one pixel byte changed: the batch still loads
    (folder / "test_batch").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.warns(UserWarning, match=r"test_batch does not have CIFAR-10's reference md5 "
                                         r"\(3 test images read, CIFAR-10 has 10,000\).*Delete "
                                         r".*cifar-10-batches-py.*verify=False"):
        bad = create_dataset("cifar10", split="test", root=tmp_path, normalize="none")
    assert not torch.equal(bad.inputs, clean.inputs)  # read as it is, but not unsaid
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # verify=False: a copy of one's own, no check
        create_dataset("cifar10", split="test", root=tmp_path, verify=False)
    with pytest.warns(UserWarning, match=r"data_batch_1, data_batch_5 do not have"):
        (folder / "data_batch_1").write_bytes(raw["data_batch_1"].replace(b"x.png", b"y.png"))
        (folder / "data_batch_5").write_bytes(raw["data_batch_2"])  # another batch's copy
        create_dataset("cifar10", split="train", root=tmp_path)
