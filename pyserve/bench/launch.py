"""A real `pyserve serve` on a free loopback port, as a subprocess: for the tests and scripts that need one
(`pyserve bench` itself takes any server's URL).

    with ServerProcess("--max-num-seqs", "4") as srv:   # started, then ready (or RuntimeError)
        httpx.get(srv.url + "/health")
    # stopped: SIGTERM, then a bounded wait (srv.returncode)

It runs the pyserve that imports this module (installed, or a checkout built in place): its folder goes first
on the child's PYTHONPATH and is its working directory.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import httpx

PYSERVE_HOME = str(Path(__file__).resolve().parents[2])  # the folder holding this pyserve package
READY = re.compile(r"pyserve: serving (\S+) on (http://\S+)")  # stdout, once the model is loaded
LISTENING = re.compile(r"Running on (http://\S+)")  # Hypercorn's log line (stderr): bound, model maybe loading


class ServerProcess:
    """Starts `python -m pyserve serve --host 127.0.0.1 --port 0 --threads N ARGS...` at once; `wait_ready`
    waits for its ready line (the URL and port) and a 200 from /health. `stderr` keeps every line the server
    logged; `listening` is set (and `listen_url` known) as soon as Hypercorn is bound, before the model loads."""

    def __init__(self, *args: str, threads: int = 2):
        env = dict(os.environ, PYTHONPATH=PYSERVE_HOME + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "pyserve", "serve", "--host", "127.0.0.1", "--port", "0",
               "--threads", str(threads), *args]
        self.proc = subprocess.Popen(cmd, cwd=PYSERVE_HOME, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.url = self.model = self.listen_url = ""
        self.port = 0
        self.returncode: Optional[int] = None
        self.listening = threading.Event()
        self._ready_line = threading.Event()  # the ready line came, or stdout closed without it
        self._readers = [threading.Thread(target=f, daemon=True) for f in (self._read_stdout, self._read_stderr)]
        for t in self._readers:
            t.start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self.stdout.append(line)
            m = READY.search(line)
            if m and not self._ready_line.is_set():
                self.model, self.url = m.group(1), m.group(2)
                self.port = int(self.url.rsplit(":", 1)[1])
                self._ready_line.set()
        self._ready_line.set()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)
            m = LISTENING.search(line)
            if m and not self.listening.is_set():
                self.listen_url = m.group(1)
                self.listening.set()

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        """Returns once the server answers /health with 200; else stops it and raises RuntimeError."""
        deadline = time.monotonic() + timeout
        if not self._ready_line.wait(timeout):
            self._fail(f"no ready line within {timeout:g} s")
        if not self.url:
            self._fail("its stdout closed before the ready line")
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                self._fail("it exited before /health answered 200")
            if time.monotonic() > deadline:
                self._fail(f"/health not 200 within {timeout:g} s")
            time.sleep(0.05)

    def _fail(self, why: str) -> None:
        code = self.stop(signal.SIGKILL, timeout=10)  # (if it still runs) and all of its stderr read
        raise RuntimeError(f"pyserve serve did not start ({why}; exit code {code}):\n{''.join(self.stderr)[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Sends `sig` (SIGTERM: drain, then exit 0), waits up to `timeout` s, then kills; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait()
        for t in self._readers:  # the pipes are closed: the last lines are on their way into stdout/stderr
            t.join(5)
        return self.returncode

    def __enter__(self) -> "ServerProcess":
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()
