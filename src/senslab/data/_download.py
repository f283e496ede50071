"""Fetching official data files: checksum-verified, atomic, resumable, clear offline errors."""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path


class DataUnavailableError(FileNotFoundError):
    """A data file is missing and could not be downloaded; the message says where to put it."""


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
    wrong checksum is an error, not silently replaced.
    """
    dest = Path(dest)
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
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            mode = "ab" if start and resp.status == 206 else "wb"
            with open(part, mode) as f:
                while block := resp.read(1 << 20):
                    f.write(block)
    except urllib.error.HTTPError as err:
        if err.code != 416 or not start:
            raise DataUnavailableError(
                f"could not download {url} ({err}). Offline? Place the file at {dest} by hand"
            ) from err
        # 416: nothing after byte `start` — the .part is already whole (a run stopped between
        # the last byte and the rename) or longer than the file: checked below, or restarted
        if md5 is None or md5sum(part) != md5:
            part.unlink()
            return fetch(url, dest, md5, download)
    except (urllib.error.URLError, OSError) as err:
        raise DataUnavailableError(
            f"could not download {url} ({err}). Offline? Place the file at {dest} by hand"
            + (f" (the partial download {part} is kept and resumed)" if part.exists() else "")
        ) from err
    if md5 is not None and (got := md5sum(part)) != md5:
        part.unlink()
        raise DataUnavailableError(f"download of {url} has md5 {got}, expected {md5}; try again")
    os.replace(part, dest)
    return dest
