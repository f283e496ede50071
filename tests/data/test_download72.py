"""Downloads that fail on the writing side (a read-only data folder, a full disk, a directory or
a file in the way) named as such rather than as "Offline?", and downloads cut short or damaged
on the way, all against a local HTTP server: no file is left under its final name, and the
next call retries."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from unprivileged import as_ordinary_user

from senslab.data import DataUnavailableError, create_dataset, fetch

BODY = bytes(range(256)) * 300
MD5 = hashlib.md5(BODY).hexdigest()


class _Server(http.server.ThreadingHTTPServer):
    # "whole", "cut" (closes half-way), "cut-chunked" (the same, chunked), "status-N" (HTTP N)
    mode = "whole"
    requests: list[tuple[str, str | None]]  # (path, Range header) of every GET


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        spec = self.headers.get("Range")
        self.server.requests.append((self.path, spec))
        if self.server.mode.startswith("status-"):  # the server answers with an error
            self.send_error(int(self.server.mode.removeprefix("status-")))
            return
        start = int(spec.split("=")[1].rstrip("-")) if spec else 0
        if start >= len(BODY):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(BODY)}")
            self.end_headers()
            return
        body = BODY[start:]
        self.send_response(206 if spec else 200)
        if self.server.mode == "cut-chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = body[: len(body) // 2]
            self.wfile.write(f"{len(half):x}\r\n".encode() + half + b"\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if self.server.mode == "cut" else body)
        self.close_connection = True


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.requests = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _base(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/"


def _leftovers(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.name.endswith(".part"))


# --------------------------------------------------------------------------- read-only folder

_RUN = """
import sys, warnings
import senslab.data.images as images, senslab.data.text as text
from senslab.data import DataUnavailableError, create_dataset, fetch
warnings.simplefilter("ignore")
how, base, folder = sys.argv[1:]
try:
    if how == "mnist":  # two mirrors: a folder that refuses the first refuses the second too
        images.MNIST_MIRRORS = (base + "a/", base + "b/")
        create_dataset("mnist", split="test", root=folder, download=True, source="idx")
    elif how == "sst2":
        text.GLUE_ZIPS["sst2"] = (base + "SST-2.zip", *text.GLUE_ZIPS["sst2"][1:])
        create_dataset("sst2", split="train", root=folder, download=True, vocab_size=300)
    else:
        fetch(base + "file.bin", folder + "/file.bin", None, True)
    print("downloaded")
except DataUnavailableError as err:
    print("DataUnavailableError", err)
"""


@pytest.mark.parametrize(("how", "sub", "name"), [
    ("fetch", "", "file.bin"), ("fetch", "new/folder", "file.bin"),
    ("mnist", "", "t10k-images-idx3-ubyte.gz"), ("sst2", "", "SST-2.zip")],
    ids=["fetch", "fetch-new-folder", "mnist", "sst2"])
def test_a_read_only_data_folder_is_named_not_writable_not_offline(
        server: _Server, how: str, sub: str, name: str) -> None:
    """A shared, read-only data folder (or one that cannot be made inside it) with download=True
    said "could not download … Offline?", or gave a bare PermissionError from mkdir: the
    network was fine. Now the error names the file, the folder, that it is not writable and the
    ways on, leaves no .part behind, and tries no second mirror (it would fail the same way)."""
    top = Path(tempfile.mkdtemp(prefix="senslab-ro-"))  # readable by another user
    ro = top / "ro"
    try:
        os.chmod(top, 0o755)
        ro.mkdir(mode=0o555)
        os.chmod(ro, 0o555)
        folder = ro / sub if sub else ro
        cmd = as_ordinary_user([sys.executable, "-c", _RUN, how, _base(server), str(folder)])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "SENSLAB_CACHE": str(top / "cache")})
        msg = out.stdout
        assert msg.startswith(f"DataUnavailableError could not save {name} into {folder}"), out
        assert "not writable" in msg and "Offline" not in msg
        assert "data.root" in msg and "SENSLAB_DATA" in msg
        assert "when online" not in msg  # download was on: the loader's offline advice is wrong
        assert _leftovers(top) == [] and not (folder / name).exists()
        # none where the folder cannot even be made: that fails before asking
        assert len(server.requests) == (0 if sub else 1), server.requests
    finally:
        os.chmod(ro, 0o755)
        shutil.rmtree(top, ignore_errors=True)


# --------------------------------------------------------------------------- full disk


def _full_disk_part(part: Path) -> None:
    """``part`` as a link to /dev/full: every write to it fails with ENOSPC, as on a full disk."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here to stand for a full disk")
    part.parent.mkdir(parents=True, exist_ok=True)
    part.symlink_to("/dev/full")


def test_a_full_disk_is_named_with_the_size_and_leaves_no_part_file(
        tmp_path: Path, server: _Server) -> None:
    """ENOSPC half-way said "Offline?" and kept the partial file; now it says the disk is full,
    how much was to be written and where to free or find space, and removes the partial file."""
    dest = tmp_path / "file.bin"
    _full_disk_part(tmp_path / "file.bin.part")
    with pytest.raises(DataUnavailableError) as info:
        fetch(_base(server) + "file.bin", dest, MD5, True)
    msg = str(info.value)
    assert msg.startswith(f"could not save file.bin into {tmp_path}"), msg
    assert "is full" in msg and f"the file is {len(BODY):,} bytes" in msg and "free space" in msg
    assert "data.root" in msg and "SENSLAB_DATA" in msg and "Offline" not in msg
    assert not dest.exists() and not (tmp_path / "file.bin.part").is_symlink()
    assert fetch(_base(server) + "file.bin", dest, MD5, True) == dest  # space again: it works
    assert dest.read_bytes() == BODY


def test_a_full_disk_under_a_glue_loader_is_not_wrapped_in_offline_advice(
        tmp_path: Path, server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GLUE loader wrapped every download error in "let senslab fetch it (download=true)":
    wrong advice when downloading was on and the disk was full."""
    import senslab.data.text as text

    monkeypatch.setitem(text.GLUE_ZIPS, "sst2",
                        (_base(server) + "SST-2.zip", *text.GLUE_ZIPS["sst2"][1:]))
    _full_disk_part(tmp_path / "sst2" / "SST-2.zip.part")
    with pytest.raises(DataUnavailableError) as info:
        create_dataset("sst2", split="train", root=tmp_path / "sst2", download=True,
                       vocab_size=300)
    msg = str(info.value)
    assert msg.startswith(f"could not save SST-2.zip into {tmp_path / 'sst2'}"), msg
    assert "is full" in msg and "when online" not in msg
    assert _leftovers(tmp_path) == [] and not (tmp_path / "sst2" / "SST-2.zip").exists()


# --------------------------------------------------------------------------- things in the way


@pytest.mark.parametrize("md5", [MD5, None], ids=["md5", "no-md5"])
def test_a_directory_under_the_files_name_is_named(tmp_path: Path, server: _Server,
                                                   md5: str | None) -> None:
    """A directory where the file belongs was returned as the file (no md5) or failed with a
    bare IsADirectoryError (md5); now it is named, and kept (it may be someone's)."""
    (tmp_path / "file.bin" / "inner").mkdir(parents=True)
    with pytest.raises(DataUnavailableError) as info:
        fetch(_base(server) + "file.bin", tmp_path / "file.bin", md5, True)
    msg = str(info.value)
    assert f"{tmp_path / 'file.bin'} is a directory" in msg and "Move it away" in msg, msg
    assert "Offline" not in msg and (tmp_path / "file.bin" / "inner").is_dir()


def test_a_directory_under_the_partial_files_name_is_named(tmp_path: Path,
                                                           server: _Server) -> None:
    """A directory named file.bin.part was "resumed" from its size and then said "Offline?"."""
    (tmp_path / "file.bin.part").mkdir()
    with pytest.raises(DataUnavailableError) as info:
        fetch(_base(server) + "file.bin", tmp_path / "file.bin", MD5, True)
    msg = str(info.value)
    assert msg.startswith(f"could not save file.bin into {tmp_path}"), msg
    assert f"{tmp_path / 'file.bin.part'} is a directory" in msg and "Offline" not in msg
    assert server.requests == [] and not (tmp_path / "file.bin").exists()


@pytest.mark.parametrize("depth", ["folder", "above"])
def test_a_file_where_the_data_folder_belongs_is_named(tmp_path: Path, server: _Server,
                                                       depth: str) -> None:
    """A file where the data folder (or a folder above it) should be gave a bare
    FileExistsError or NotADirectoryError from mkdir; now the file in the way is named."""
    (tmp_path / "data").write_text("not a folder")
    folder = tmp_path / "data" if depth == "folder" else tmp_path / "data" / "mnist"
    with pytest.raises(DataUnavailableError) as info:
        fetch(_base(server) + "file.bin", folder / "file.bin", MD5, True)
    msg = str(info.value)
    assert msg.startswith(f"could not save file.bin into {folder}"), msg
    assert f"{tmp_path / 'data'} is a file, not a folder" in msg and "Offline" not in msg
    assert (tmp_path / "data").read_text() == "not a folder" and server.requests == []


# --------------------------------------------------------------------------- network side


@pytest.mark.parametrize("md5", [MD5, None], ids=["md5", "no-md5"])
@pytest.mark.parametrize("mode", ["cut", "cut-chunked"])
def test_an_interrupted_download_leaves_nothing_under_its_name_and_is_retried(
        tmp_path: Path, server: _Server, mode: str, md5: str | None) -> None:
    """A connection closed half-way: without an md5 (the GLUE zips) the half file was renamed
    onto the final name, and read later as a damaged zip; a chunked reply gave a bare
    IncompleteRead; with an md5 the half was deleted as "wrong md5". Now it is a download
    error, nothing is under the final name, and the next call resumes (or restarts) it."""
    dest, url = tmp_path / "file.bin", _base(server) + "file.bin"
    server.mode = mode
    with pytest.raises(DataUnavailableError) as info:
        fetch(url, dest, md5, True)
    msg = str(info.value)
    assert msg.startswith(f"could not download {url}") and "connection" in msg, msg
    half = len(BODY) // 2
    assert "md5" not in msg and f"{half:,}" in msg and not dest.exists()
    if mode == "cut":  # the promised length is known
        assert f"{half:,} of {len(BODY):,} bytes" in msg
    assert (tmp_path / "file.bin.part").stat().st_size == half  # kept, to be resumed
    server.mode = "whole"
    assert fetch(url, dest, md5, True) == dest
    assert dest.read_bytes() == BODY and _leftovers(tmp_path) == []
    assert server.requests[-1][1] == f"bytes={half}-"


def test_a_download_with_the_wrong_md5_is_deleted_and_says_so(tmp_path: Path,
                                                              server: _Server) -> None:
    """The message said "try again" without saying the bad file was gone."""
    dest, url = tmp_path / "file.bin", _base(server) + "file.bin"
    with pytest.raises(DataUnavailableError) as info:
        fetch(url, dest, "0" * 32, True)
    msg = str(info.value)
    assert f"has md5 {MD5}, expected {'0' * 32}" in msg and "deleted" in msg, msg
    assert not dest.exists() and _leftovers(tmp_path) == []


def test_a_network_failure_still_says_offline(tmp_path: Path) -> None:
    """Nothing listening on the port: the network side failed, and the message stays as it was."""
    with socket.socket() as s:  # a port just free, so that nothing answers on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/file.bin"
    with pytest.raises(DataUnavailableError) as info:
        fetch(url, tmp_path / "file.bin", MD5, True)
    msg = str(info.value)
    assert msg.startswith(f"could not download {url}") and "Offline?" in msg, msg
    assert f"Place the file at {tmp_path / 'file.bin'} by hand" in msg
    assert not (tmp_path / "file.bin").exists()


@pytest.mark.parametrize(("code", "said"), [
    (404, "not at that address"), (403, "refuses this request"), (503, "run again later")])
def test_an_http_error_reply_is_not_called_offline(tmp_path: Path, server: _Server, code: int,
                                                     said: str) -> None:
    """A 404 or a 403 said "Offline?" although the server had answered: the user checked the
    network instead of the address. The message now gives the reply and whether a retry helps."""
    server.mode = f"status-{code}"
    try:
        dest, url = tmp_path / "file.bin", _base(server) + "file.bin"
        with pytest.raises(DataUnavailableError) as info:
            fetch(url, dest, MD5, True)
    finally:
        server.mode = "whole"
    msg = str(info.value)
    assert msg.startswith(f"could not download {url}: the server answered HTTP {code}"), msg
    assert said in msg and "Offline" not in msg and f"place it at {dest}" in msg, msg
    assert not dest.exists() and _leftovers(tmp_path) == []
