"""Test-wide isolation: derived files (trained tokenizers) go to a per-session temporary cache,
never to the user's ~/.cache; the suite runs on a pinned torch thread count (``TEST_THREADS``),
restored after every test; SIGINT reaches the tests as in a terminal, wherever the suite was
started. Shared fixture writers: ``cifar_tarball``, ``idx_dataset``."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import signal
import struct
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

#: torch threads for the whole suite, subprocesses included (``SENSLAB_TEST_THREADS``, default 1):
#: the suite's models are small, and on a machine shared with another busy process two threads
#: wait on each other at every OpenMP barrier, which slowed the suite several-fold
TEST_THREADS = int(os.environ.get("SENSLAB_TEST_THREADS", "1"))
# the suite's helper modules (``cliproc``: senslab command processes from a fork server)
sys.path.insert(0, str(Path(__file__).parent))
os.environ["OMP_NUM_THREADS"] = str(TEST_THREADS)  # read by the subprocesses tests start
torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """Python's own SIGINT handler for the whole session. A process started in the background
    by a non-interactive shell (``nohup make test &``, some CI runners) inherits SIGINT
    ignored, and Python then keeps it ignored: the tests that send this process a real SIGINT
    would see nothing happen and fail. Put back after."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if before is not None:  # None: a handler installed outside Python, left as it was
        signal.signal(signal.SIGINT, before)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("senslab-cache")
    before = os.environ.get("SENSLAB_CACHE")
    os.environ["SENSLAB_CACHE"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("SENSLAB_CACHE", None)
    else:
        os.environ["SENSLAB_CACHE"] = before


@pytest.fixture
def gpt2_tokenizer() -> Callable[[Path, list[str]], int]:
    """Save a GPT-2-style tokenizer (byte-level BPE, ``<|endoftext|>`` as start and end, **no
    pad token**) trained on ``texts`` to ``path``; returns its vocabulary size."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def make(path: Path, texts: list[str]) -> int:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        end = "<|endoftext|>"
        hf = transformers.GPT2TokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end,
                                            unk_token=end)
        hf.save_pretrained(path)
        assert hf.pad_token_id is None
        return len(hf)

    return make


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """A test that changes torch's thread count (``--threads``, the benchmark) must not change
    the numerics of the tests after it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cifar_tarball(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path, int], dict[str, Any]]:
    """A writer of ``root/cifar-10-python.tar.gz`` laid out as the official one (5 train
    batches, a test batch, batches.meta; uint8 rows = R, G, B planes), its md5 registered for
    this test only. ``write(root, per_batch)`` returns the pickled batch dicts by name."""
    from senslab.data import images as im
    from senslab.data._download import md5sum

    def write(root: Path, per_batch: int) -> dict[str, Any]:
        root.mkdir(parents=True, exist_ok=True)
        batches: dict[str, Any] = {}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
            for i, name in enumerate(names):
                if name == "batches.meta":
                    obj: dict[bytes, Any] = {
                        b"label_names": [c.encode() for c in im.CIFAR10_CLASSES]}
                else:
                    rng = np.random.default_rng(i)
                    obj = {b"batch_label": name.encode(),
                           b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                           b"labels": [(i + j) % 10 for j in range(per_batch)],
                           b"filenames": [b"x.png"] * per_batch}
                    batches[name] = obj
                data = pickle.dumps(obj, protocol=2)
                info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        path = root / "cifar-10-python.tar.gz"
        path.write_bytes(buf.getvalue())
        monkeypatch.setitem(im.CIFAR10_FILES, path.name, md5sum(path))
        return batches

    return write


@pytest.fixture
def idx_dataset(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """A writer of the four official idx-gz files of (Fashion-)MNIST in ``root``: big-endian
    magic and dims, then uint8 bytes, gzipped; 28×28 images whose class (labels 0..9 cycling)
    brightens its own block of rows, so the classes are learnable. The files' md5s are
    registered for this test only. ``write(root, n_train, n_test, dataset="fashion_mnist")``."""
    from senslab.data import images as im
    from senslab.data._download import md5sum

    def write(root: Path, n_train: int = 20, n_test: int = 10,
              dataset: str = "fashion_mnist") -> Path:
        table = {"fashion_mnist": im.FASHION_MNIST_FILES, "mnist": im.MNIST_FILES}[dataset]
        rng = np.random.default_rng(0)
        root.mkdir(parents=True, exist_ok=True)
        for prefix, n in (("train", n_train), ("t10k", n_test)):
            y = np.arange(n) % 10
            x = rng.integers(0, 60, size=(n, 28, 28))
            for i, c in enumerate(y):
                x[i, 2 * c: 2 * c + 6] += 180
            for kind, data, magic in (("images-idx3", x, 2051), ("labels-idx1", y, 2049)):
                header = struct.pack(f">I{data.ndim}I", magic, *data.shape)
                path = root / f"{prefix}-{kind}-ubyte.gz"
                path.write_bytes(gzip.compress(header + data.astype(np.uint8).tobytes()))
                monkeypatch.setitem(table, path.name, md5sum(path))
        return root

    return write
