"""``fetch`` against a local HTTP server that answers Range requests as standard servers do
(206 for a range inside the file, 416 past its end)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from senslab.data._download import fetch

BODY = bytes(range(256)) * 300
MD5 = hashlib.md5(BODY).hexdigest()


class _Ranges(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        spec = self.headers.get("Range")
        start = int(spec.split("=")[1].rstrip("-")) if spec else 0
        if start >= len(BODY):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(BODY)}")
            self.end_headers()
            return
        self.send_response(206 if spec else 200)
        self.send_header("Content-Length", str(len(BODY) - start))
        self.end_headers()
        self.wfile.write(BODY[start:])


@pytest.fixture
def url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ranges)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/file.bin"
    server.shutdown()
    server.server_close()  # the listening socket: left open, it warns in a later test


@pytest.mark.parametrize("kept", [7_000, len(BODY), len(BODY) + 10],
                         ids=["partial", "whole", "longer"])
def test_a_kept_part_file_is_resumed_accepted_or_restarted(tmp_path: Path, url: str,
                                                          kept: int) -> None:
    """A partial .part is resumed; a whole one (the run stopped before the md5 check and the
    rename) is accepted, and one longer than the file restarted: both were asked for the bytes
    past the end, and the server's 416 failed every later try with "Offline?"."""
    dest = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes((BODY + b"x" * 10)[:kept])
    assert fetch(url, dest, MD5, True) == dest
    assert dest.read_bytes() == BODY and not (tmp_path / "file.bin.part").exists()
