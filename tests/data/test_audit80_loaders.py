"""Audit 80 of the file loaders (senslab.data.text, senslab.data.images): fixture files in the
exact formats of the real ones (GLUE MRPC/SST-2 TSVs, Microsoft's msr files, CIFAR-10-C's
.npy), written in tmp_path; no shared data, no network."""

from __future__ import annotations

import csv
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from textfiles import BOM, MRPC_HEADER
from textfiles import sentence as _sentence

from senslab.data import DataUnavailableError, create_dataset
from senslab.data import text as tx

#: MRPC rows as GLUE writes them: quotes are text, never doubled (MRPC's own sentences hold them)
QUOTED = ('Amrozi said " the witness " lied .', '" We are done , " he said .')


def _mrpc_rows(n: int, seed: int, quotes_every: int = 3) -> list[list[str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = _sentence(rng, 8), _sentence(rng, 7)
        if i % quotes_every == 0:
            a = QUOTED[i % 2] + " " + a
        rows.append([str(i % 2), str(1000 + 2 * i + seed), str(1001 + 2 * i + seed), a, b])
    return rows


def _write_tsv(path: Path, header: str, rows: list[list[str]], csv_quoting: bool) -> None:
    """``rows`` under ``header``: joined by tabs as GLUE's files are, or by a CSV writer
    (``csv.writer`` with a tab delimiter: what pandas' ``to_csv(sep='\\t')`` writes too)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(BOM + header + "\n")
        if csv_quoting:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows(rows)
        else:
            f.writelines("\t".join(r) + "\n" for r in rows)


def test_a_glue_tsv_written_with_csv_quoting_is_refused(tmp_path: Path) -> None:
    """MRPC's train.tsv saved by pandas or csv.writer wraps every sentence that holds a quote in
    quotes and doubles its own: read as GLUE's files are (quotes are text), 769 of the real
    file's 3,668 pairs loaded as '"Amrozi … called "" the witness "" , …"', without a word. The
    same rows joined by tabs, GLUE's format, load with their quotes as they are."""
    rows = _mrpc_rows(60, 0)
    for name, seed in (("train.tsv", 0), ("dev.tsv", 7)):
        _write_tsv(tmp_path / name, MRPC_HEADER, _mrpc_rows(60, seed), csv_quoting=True)
    with pytest.raises(DataUnavailableError, match=r"train\.tsv: 20 of its 60 rows have a #1 "
                       r"String or #2 String written with CSV quoting.*line 2, 5, 8.*"
                       r"QUOTE_NONE, quotechar=None"):
        create_dataset("mrpc", root=tmp_path, vocab_size=300)
    plain = tmp_path / "plain"
    plain.mkdir()
    _write_tsv(plain / "rows.tsv", MRPC_HEADER, rows, csv_quoting=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = tx._read(plain / "rows.tsv", tx.MRPC_FORMAT)
    assert got.first == [r[3] for r in rows] and got.second == [r[4] for r in rows]
    assert got.first[0].startswith(QUOTED[0]) and got.labels == [int(r[0]) for r in rows]


def test_a_few_csv_quoted_sentences_warn_and_load_as_they_are(tmp_path: Path) -> None:
    """A handful of such rows (≤ 3, or ≤ 1 %) warn, naming them, and are read as they are."""
    rows = _mrpc_rows(40, 1, quotes_every=1000)  # row 0 alone holds quotes
    path = tmp_path / "rows.tsv"
    _write_tsv(path, MRPC_HEADER, rows, csv_quoting=True)
    with pytest.warns(UserWarning, match=r"1 of its 40 rows have a #1 String or #2 String "
                      r"written with CSV quoting, .*\(line 2; .*read as they are"):
        got = tx._read(path, tx.MRPC_FORMAT)
    assert len(got.labels) == 40
    assert got.first[0] == '"' + rows[0][3].replace('"', '""') + '"'


def test_csv_quoted_fields_are_told_from_glue_quotes() -> None:
    assert tx._csv_quoted('"he said "" hi "" ."')
    assert tx._csv_quoted('""""')  # a lone quote, CSV-written
    # GLUE's own: a sentence that starts and ends with its quotes, none doubled
    assert not tx._csv_quoted('" The result is an overall package . "')
    assert not tx._csv_quoted('" We are done , " he said .')
    assert not tx._csv_quoted('"a "" b" and " c "')  # a lone inner quote: not a CSV field
    assert not tx._csv_quoted('""')


@pytest.mark.filterwarnings("ignore:.*reference (md5|dev.tsv|train.tsv)")
def test_mrpc_built_from_msr_files_that_are_not_utf8_names_the_file(tmp_path: Path) -> None:
    """GLUE's split is built from msr_paraphrase_train.txt + dev_ids.tsv; a copy re-saved as
    Windows-1252 (Microsoft's files hold ’) failed with a bare UnicodeDecodeError naming no
    file. Now it is refused, naming the file and the fix, and nothing is written."""
    rows = _mrpc_rows(12, 0)
    rows[3][3] = "the president ’ s appearance"
    text = BOM + MRPC_HEADER + "\n" + "".join("\t".join(r) + "\n" for r in rows)
    (tmp_path / "msr_paraphrase_train.txt").write_bytes(text.encode("cp1252", "replace"))
    (tmp_path / "dev_ids.tsv").write_text(f"{rows[0][1]}\t{rows[0][2]}\n", encoding="utf-8")
    with pytest.raises(DataUnavailableError, match=r"msr_paraphrase_train\.txt is not UTF-8 text "
                       r"\(byte \d+: invalid start byte\).*save it as UTF-8.*nothing was "
                       r"written"):
        create_dataset("mrpc", root=tmp_path, vocab_size=300)
    assert not (tmp_path / "train.tsv").exists() and not (tmp_path / "dev.tsv").exists()
    # the same rows in UTF-8 build GLUE's split: the pair listed in dev_ids goes to dev
    (tmp_path / "msr_paraphrase_train.txt").write_text(text, encoding="utf-8")
    assert sorted(tx.build_mrpc_glue(tmp_path)) == ["dev.tsv", "train.tsv"]
    assert len(tx._read(tmp_path / "dev.tsv", tx.MRPC_FORMAT).labels) == 1
    assert len(tx._read(tmp_path / "train.tsv", tx.MRPC_FORMAT).labels) == 11


def _write_cifar10c(root: Path, n: int) -> np.ndarray:
    folder = root / "CIFAR-10-C"
    folder.mkdir(parents=True)
    images = np.random.default_rng(0).integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8)
    np.save(folder / "fog.npy", images)
    np.save(folder / "labels.npy", np.tile(np.arange(n) % 10, 5).astype(np.uint8))
    return images


def test_a_run_on_cifar10c_warns_that_its_train_split_is_the_test_images(tmp_path: Path) -> None:
    """CIFAR-10-C has test images only; split "train" (the registry's default, and a run's
    data.train_split) reads them too. A run with data.name=cifar10c trained on the test images
    and reported its test accuracy on the very same images, unsaid. It warns now; split "test"
    does not."""
    from senslab.train.config import RunConfig
    from senslab.train.loop import load_data

    _write_cifar10c(tmp_path, 4)
    cfg = RunConfig(name="c10c")
    cfg.data.name, cfg.data.root = "cifar10c", str(tmp_path)
    cfg.data.options = {"corruption": "fog", "severity": 2}
    with pytest.warns(UserWarning) as caught:
        train, test = load_data(cfg)
    ours = [str(w.message) for w in caught if "no training images" in str(w.message)]
    assert len(ours) == 1  # the train split only
    assert ours[0].startswith("cifar10c has no training images: split='train' reads the same 4 "
                              "corrupted CIFAR-10 test images as split='test' (fog, severity 2)")
    assert "Train on cifar10 and measure on cifar10c" in ours[0]
    assert torch.equal(train.inputs, test.inputs)  # what the warning is about
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        create_dataset("cifar10c", split="test", root=tmp_path, corruption="fog", severity=1)
    assert not [w for w in rec if "no training images" in str(w.message)]
