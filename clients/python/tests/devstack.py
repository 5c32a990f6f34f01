"""Starts a real `planex dev` for the client tests.

The planex binary is $PLANEX_BINARY, else one built from this repository
once per test process (`go build -trimpath ./cmd/planex`, CGO off: the same
build settings as CI's release binary, so the Go build cache is shared).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def planex_binary(workdir: str) -> str:
    """$PLANEX_BINARY or a fresh build of ./cmd/planex into workdir."""
    given = os.environ.get("PLANEX_BINARY")
    if given:
        path = os.path.abspath(given)
        if not os.path.isfile(path):
            raise RuntimeError(f"PLANEX_BINARY {given}: no such file")
        return path
    out = os.path.join(workdir, "planex")
    env = dict(os.environ, CGO_ENABLED="0")
    subprocess.run(["go", "build", "-trimpath", "-o", out, "./cmd/planex"], cwd=REPO, env=env, check=True)
    return out


def free_address() -> str:
    """A loopback address with a port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class DevStack:
    """One `planex dev` process on a fresh data directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="planex-python-")
        self.data_dir = os.path.join(self.dir, "data")
        self.address = free_address()
        self.log_path = os.path.join(self.dir, "planex-dev.log")
        self.proc = None

    @property
    def ca(self) -> str:
        """The dev stack's CA bundle."""
        return os.path.join(self.data_dir, "credentials", "ca.pem")

    @property
    def token(self) -> str:
        """The dev CLI's API key (an admin)."""
        with open(os.path.join(self.data_dir, "credentials", "cli.token")) as f:
            return f.read().strip()

    def start(self, timeout: float = 120.0) -> None:
        """Starts planex dev and waits until its supervisor answers."""
        binary = planex_binary(self.dir)
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(self.dir, "cache"), XDG_CONFIG_HOME=os.path.join(self.dir, "config"))
        env.pop("PLANEX_TOKEN", None)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "dev", "--data-dir", self.data_dir, "--grpc-addr", self.address],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.dir,
        )
        log.close()
        from planex import Client, PlanexError  # after the path is set up by the caller

        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"planex dev exited with {self.proc.returncode}:\n{self.logs()}")
            if os.path.exists(self.ca) and os.path.exists(os.path.join(self.data_dir, "credentials", "cli.token")):
                try:
                    with Client(self.address, token=self.token, ca=self.ca, timeout=2) as c:
                        if c.list_tools():
                            return
                except PlanexError as e:
                    last = e
            time.sleep(0.2)
        raise RuntimeError(f"planex dev at {self.address} not serving within {timeout}s ({last}):\n{self.logs()}")

    def logs(self, tail: int = 60) -> str:
        """The last lines of planex dev's output."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-tail:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stops planex dev (SIGTERM, then SIGKILL) and removes its data."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
