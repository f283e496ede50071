"""Fetching official data files: checksum-verified, atomic, resumable, clear offline errors."""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class DataUnavailableError(FileNotFoundError):
    """A data file is missing and could not be downloaded; the message says where to put it."""


class DataWriteError(DataUnavailableError):
    """A download that could not be saved (a read-only folder, a full disk, a directory in the
    way): the network was not at fault, and another mirror would fail the same way."""


#: how to turn downloading on, in the terms of both ways of calling a loader
DOWNLOAD_HINT = "--set data.download=true on the command line, download=True in Python"


def cache_dir() -> Path:
    """Where derived files (trained tokenizers) are kept: ``$SENSLAB_CACHE`` or
    ``~/.cache/senslab``. Never the data directory, which may be shared or read-only."""
    return Path(os.environ.get("SENSLAB_CACHE", Path.home() / ".cache" / "senslab"))


def md5sum(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fetch(url: str, dest: Path, md5: str | None, download: bool) -> Path:
    """Return ``dest``, downloading it from ``url`` first if it is missing and ``download`` is set.

    The download goes to ``dest.part`` (resumed with an HTTP Range request if a partial file is
    there), is checked against ``md5``, and only then renamed onto ``dest``. A present file with a
    wrong checksum is an error, not silently replaced. A failure on the network side (no answer,
    a connection closed part-way) keeps the ``.part`` for the next call to resume; a failure to
    write (a read-only folder, a full disk, a directory or file in the way) is a
    :class:`DataWriteError` that says so, and leaves no partial file.
    """
    dest = Path(dest)
    if dest.is_dir():
        raise DataWriteError(_in_the_way(dest, dest, url))
    if dest.exists():
        if md5 is not None and md5sum(dest) != md5:
            raise DataUnavailableError(
                f"{dest} exists but its md5 is not {md5}: the file is corrupted or a different "
                f"version. Delete it and download again from {url}"
            )
        return dest
    if not download:
        raise DataUnavailableError(
            f"missing data file {dest}. Download it from {url} and place it at that path, "
            f"or, when online, let senslab download it ({DOWNLOAD_HINT})"
        )
    part = dest.with_name(dest.name + ".part")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _write_error(err, dest, part, url, None) from err
    if part.is_dir():
        raise DataWriteError(_in_the_way(part, dest, url))
    start = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
    try:
        resp = urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as err:
        if err.code != 416 or not start:
            raise DataUnavailableError(_http_refusal(err, url, dest, part)) from err
        # 416: nothing after byte `start` — the .part is already whole (a run stopped between
        # the last byte and the rename) or longer than the file: checked below, or restarted
        if md5 is None or md5sum(part) != md5:
            _discard(part, dest, url)
            return fetch(url, dest, md5, download)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        raise DataUnavailableError(
            f"could not download {url} ({err}). Offline? Place the file at {dest} by hand"
            + (f" (the partial download {part} is kept and resumed)" if part.exists() else "")
        ) from err
    else:
        with resp:
            _save(resp, part, dest, url, start)
    if md5 is not None and (got := md5sum(part)) != md5:
        _discard(part, dest, url)
        raise DataUnavailableError(
            f"the download of {url} has md5 {got}, expected {md5}: it is damaged or another "
            f"version of the file, and was deleted. Run again to download it anew, or place "
            f"the file at {dest} by hand")
    try:
        os.replace(part, dest)
    except OSError as err:
        _discard(part, dest, url)
        raise _write_error(err, dest, part, url, None) from err
    return dest


def _http_refusal(err: urllib.error.HTTPError, url: str, dest: Path, part: Path) -> str:
    """What an HTTP error reply means: the server was reached (so not "offline"), and whether
    trying again could help."""
    said = f"the server answered HTTP {err.code} {err.reason}".rstrip()
    if err.code in (404, 410):
        why = "the file is not at that address (moved or removed), so running again will not help"
    elif err.code in (401, 403, 407, 451):
        why = ("the server refuses this request (it may need a login, a licence accepted in a "
               "browser, or another network), so running again will not help")
    elif err.code == 429 or err.code >= 500:
        why = "the server is busy or failing: run again later"
    else:
        why = "the request was not accepted"
    kept = f" (the partial download {part} is kept and resumed)" if part.exists() else ""
    return (f"could not download {url}: {said}; {why}. Download it another way and place it at "
            f"{dest}{kept}")


def _save(resp: Any, part: Path, dest: Path, url: str, start: int) -> None:
    """Write the body of ``resp`` to ``part`` (appended to its ``start`` bytes on a 206 reply).
    The connection closing before the promised length is a download error that keeps ``part``
    to resume; a write that fails is a :class:`DataWriteError` that removes it."""
    base = start if start and resp.status == 206 else 0
    length = resp.headers.get("Content-Length", "")
    total = base + int(length) if length.isdigit() else None
    got, cut = base, None  # cut: why the body stopped short
    try:
        with open(part, "ab" if base else "wb") as f:
            while True:
                try:
                    block = resp.read(1 << 20)
                except http.client.IncompleteRead as err:  # a chunked reply cut short
                    block, cut = err.partial, "the connection closed"
                except (OSError, http.client.HTTPException) as err:  # a timeout, a reset
                    block, cut = b"", str(err) or type(err).__name__
                f.write(block)
                got += len(block)
                if cut is not None or not block:
                    break
    except OSError as err:
        _discard(part, dest, url)
        raise _write_error(err, dest, part, url, total) from err
    if cut is None and total is not None and got < total:
        cut = "the connection closed"
    if cut is not None:
        of = f" of {total:,}" if total is not None else ""
        raise DataUnavailableError(
            f"could not download {url}: it stopped after {got:,}{of} bytes ({cut}). Run again "
            f"to resume it (the partial download {part} is kept), or place the file at {dest} "
            "by hand")


def _discard(part: Path, dest: Path, url: str) -> None:
    """Remove the partial download ``part``; one that cannot be removed is a write error."""
    try:
        part.unlink(missing_ok=True)
    except OSError as err:
        raise _write_error(err, dest, part, url, None) from err


def _write_error(err: OSError, dest: Path, part: Path, url: str,
                 size: int | None) -> DataWriteError:
    """``err``, raised while saving the download of ``dest``, said as what failed and the fix."""
    folder = dest.parent
    head = f"could not save {dest.name} into {folder} ({err.strerror or err}): "

    def elsewhere(which: str) -> str:
        return (f"point data.root (root= in Python) or SENSLAB_DATA at {which} folder, or "
                f"download {url} yourself and place it at {dest}")

    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        need = f" (the file is {size:,} bytes)" if size is not None else ""
        return DataWriteError(
            f"{head}the disk holding {folder} (or your quota on it) is full{need}. The partial "
            f"download was removed. Make free space there and run again, or point data.root "
            f"(root= in Python) or SENSLAB_DATA at a folder on a disk with room")
    if part.is_dir():
        return DataWriteError(_in_the_way(part, dest, url))
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()),
                   None)
    if blocker is not None:
        return DataWriteError(
            f"{head}{blocker} is a file, not a folder. Move that file away, or "
            f"{elsewhere('another')}")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        there = next(p for p in (folder, *folder.parents) if p.exists())
        what = (f"{folder} is not writable" if there == folder else
                f"{folder} cannot be made: {there} is not writable")
        return DataWriteError(
            f"{head}{what} (a shared or read-only data folder?). Have the file placed there "
            f"once by someone who can write to it, or {elsewhere('a writable')}")
    return DataWriteError(f"{head}writing there failed. Check that disk, or {elsewhere('another')}")


def _in_the_way(path: Path, dest: Path, url: str) -> str:
    """The message for a directory at ``path``, where the file ``dest`` or its partial download
    belongs: it is never removed (it may hold someone's files)."""
    if path == dest:
        return (f"{dest} is a directory, where the data file {dest.name} belongs. Move it away "
                f"(it is left as it is), then place the file there by hand (from {url}) or let "
                f"senslab download it ({DOWNLOAD_HINT})")
    return (f"could not save {dest.name} into {dest.parent}: {path} is a directory, where its "
            f"partial download belongs. Move it away (it is left as it is) and run again, or "
            f"download {url} yourself and place it at {dest}")
