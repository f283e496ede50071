"""``senslab`` command processes without paying for ``import torch`` each time: a fork server.

``python -m senslab.cli …`` spends about 2 s of CPU importing torch and senslab before it reads
its arguments; the suite's forty-odd command processes paid a sixth of its CPU for that. Here a
server process imports the command's modules once, then forks one child per command. The child
is a real, separate process: its own pid, exit status, signals (SIGINT, SIGKILL), working
directory, environment and stdin/stdout/stderr; it runs ``senslab.cli.main`` with ``sys.argv`` as
``python -m senslab.cli`` sets it, and ends through the interpreter's normal exit (atexit
handlers, flushing stdout). What it does not exercise, the interpreter's own start and ``-m``,
stays with the tests that start ``python -m senslab.cli`` themselves (the closed pipe,
``SENSLAB_DEBUG``).

A server is started per environment (the environment is read at import time too, e.g.
``OMP_NUM_THREADS``), with the caller's ``PYTHONPATH``, so ``tests/badinput/record_before.py``
still runs an older senslab. No torch operation runs in the server before it forks: forking a
process whose OpenMP pool has started is not safe.

    proc = start(["train", ...], cwd=tmp, env=ENV, stdout=PIPE, stderr=PIPE)   # ~ Popen
    done = run(["measure", ...], cwd=tmp, env=ENV)                             # ~ subprocess.run
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

PIPE = subprocess.PIPE
#: the shortest ``senslab train``, for tests of what the command does around training: one step
#: of one epoch, on one thread
QUICK_TRAIN = ("--set", "train.epochs=1", "--set", "train.max_steps=1", "--threads", "1")
#: imported by the server before it forks: the command, then what nearly every command loads
#: (the digits need scikit-learn) where it can be imported
PRELOAD = ("senslab.cli",)
PRELOAD_IF_PRESENT = ("senslab.train.loop", "sklearn.datasets")


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="senslab-cliproc-")
        self.path = os.path.join(self.dir, "s")
        log = os.path.join(self.dir, "stderr")
        try:
            with open(log, "w") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, __file__, self.path], env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=err, text=True)
        except OSError:  # e.g. an environment too large to start a process with
            shutil.rmtree(self.dir)
            raise
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            said = Path(log).read_text()
            self.close()
            raise RuntimeError(f"the senslab fork server did not start:\n{said}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:  # left to the garbage collector, it warns in a later test
            self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: dict[tuple[tuple[str, str], ...], _Server] = {}
_lock = threading.Lock()


def _server(env: dict[str, str]) -> _Server:
    key = tuple(sorted(env.items()))
    with _lock:
        if key not in _servers or _servers[key].proc.poll() is not None:
            if key in _servers:
                _servers[key].close()
            _servers[key] = _Server(env)
        return _servers[key]


@atexit.register
def _close_all() -> None:
    for server in _servers.values():
        server.close()
    _servers.clear()


class Process:
    """A running ``senslab`` command: the parts of :class:`subprocess.Popen` the tests use."""

    def __init__(self, args: list[str], *, cwd: Path | str, env: dict[str, str],
                 stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None
                 ) -> None:
        self.args = ["senslab", *args]
        self.returncode: int | None = None
        self.stdout: IO[str] | None = None
        self.stderr: IO[str] | None = None
        devnull = os.open(os.devnull, os.O_RDONLY)
        ends, close = [devnull], [devnull]
        for name, target in (("stdout", stdout), ("stderr", stderr)):
            if target == PIPE:
                r, w = os.pipe()
                setattr(self, name, open(r, encoding="utf-8", errors="replace"))  # noqa: SIM115
                ends.append(w)
                close.append(w)
            elif target is None:
                ends.append(1 if name == "stdout" else 2)
            else:
                ends.append(target.fileno())  # type: ignore[union-attr]
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_server(env).path)
        request = json.dumps({"args": list(args), "cwd": str(cwd), "env": env}).encode() + b"\n"
        socket.send_fds(self._conn, [request[:1]], ends)  # the descriptors with the first byte
        self._conn.sendall(request[1:])
        for fd in close:  # the child holds its own copies: EOF comes when it ends
            os.close(fd)
        self._buf = b""
        self.pid = int(self._line(None))

    def _line(self, timeout: float | None) -> str | None:
        """The server's next line (the child's pid, then its exit status); None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                return None
            if not chunk:
                raise RuntimeError("the senslab fork server went away")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status (``-N`` for signal N, as Popen); None if ``timeout=0`` and running,
        :class:`subprocess.TimeoutExpired` for another timeout."""
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = int(line)
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Read stdout and stderr (where piped) to their end, then wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        streams = [s for s in (self.stdout, self.stderr) if s is not None]
        data: dict[int, list[bytes]] = {s.fileno(): [] for s in streams}
        with selectors.DefaultSelector() as sel:
            for s in streams:
                sel.register(s.fileno(), selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        data[key.fd].append(chunk)
                    else:
                        sel.unregister(key.fd)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        texts = {fd: b"".join(parts).decode("utf-8", "replace") for fd, parts in data.items()}
        out, err = (None if s is None else texts[s.fileno()] for s in (self.stdout, self.stderr))
        for s in streams:
            s.close()
        return out, err


def start(args: list[str], *, cwd: Path | str, env: dict[str, str],
          stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None) -> Process:
    """Start ``senslab ARGS`` (as :class:`subprocess.Popen`, text mode)."""
    return Process(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr)


def run(args: list[str], *, cwd: Path | str, env: dict[str, str], timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    """Run ``senslab ARGS`` to its end (as ``subprocess.run(..., capture_output=True,
    text=True)``); the command is killed and TimeoutExpired raised after ``timeout`` s."""
    proc = start(args, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    assert proc.returncode is not None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out or "", err or "")


# -- the server ---------------------------------------------------------------------------------


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python -m senslab.cli ARGS``, and end as the interpreter
    ends a process (exit status, atexit handlers, flushed stdout) but without tearing down the
    modules it inherited, which would cost a second of CPU per command."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    cli = sys.modules["senslab.cli"]
    sys.argv = [cli.__file__, *request["args"]]
    try:
        code: Any = cli.main()
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:  # as the interpreter: die of the signal
        atexit._run_exitfuncs()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception as err:  # as the interpreter: report, and exit 120
            print(f"Exception ignored on flushing {stream.name}: {err!r}", file=sys.__stderr__)
            code = 120
    os._exit(code & 0xFF)


def _serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_IF_PRESENT:
        try:
            importlib.import_module(name)
        except ImportError:  # the command imports it, and fails as it would, if it needs it
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    parent = os.getppid()
    conns: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    print("ready", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    while os.getppid() == parent:
        listener.settimeout(0.02)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            conn = None
        if conn is not None:
            conn.settimeout(None)
            msg, fds, _, _ = socket.recv_fds(conn, 1, 3)
            while not msg.endswith(b"\n"):  # the request, to its end
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                msg += chunk
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in conns.values():
                    other.close()
                conn.close()
                _child(json.loads(msg), fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            conns[pid] = conn
        while conns:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            code = os.waitstatus_to_exitcode(status)
            done = conns.pop(pid, None)
            if done is not None:
                try:
                    done.sendall(f"{code}\n".encode())
                except OSError:
                    pass
                done.close()
    for pid in conns:  # the tests are gone: so are their commands
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    _serve(sys.argv[1])
