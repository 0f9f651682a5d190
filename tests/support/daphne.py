"""Run the real server in a real ``daphne`` process for end-to-end tests.

The process is started as ``python -m owllayer_site.serve`` (daphne with the
project's WebSocket frame ceiling), on a free 127.0.0.1 port.

The process is a separate interpreter, so it sees only committed rows:
tests that use it need ``@pytest.mark.django_db(transaction=True)`` and must
point it at the test database (the ``live_db_url`` fixture).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The project's daphne launcher: daphne plus the frame ceiling from settings,
# so tests run the server exactly as `make run` and deployments do.
SERVE_COMMAND = (sys.executable, "-m", "owllayer_site.serve")
# Django set-up plus the first import of the consumer; generous because CI
# machines are slow, bounded so a broken server fails the test instead of
# hanging it.
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
# A free port can be taken by someone else between our probe and daphne's
# bind; that race is retried this many times.
BIND_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class DaphneStartError(RuntimeError):
    pass


class DaphneServer:
    """One running daphne process on 127.0.0.1."""

    def __init__(self, process: subprocess.Popen, port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, path: str = "/owllayer", api_key: str | None = None) -> str:
        url = f"ws://127.0.0.1:{self.port}{path}"
        if api_key is not None:
            url += f"?apiKey={quote(api_key, safe='')}"
        return url

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def logs(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then SIGKILL if it has not exited after ``timeout``; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        return self.process.returncode

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited {self.process.returncode}"
        return f"<DaphneServer 127.0.0.1:{self.port} pid={self.process.pid} {state}>"


def start_daphne(
    env: Mapping[str, str],
    log_dir: Path,
    *,
    port: int | None = None,
    startup_timeout: float = STARTUP_TIMEOUT,
) -> DaphneServer:
    """Start daphne with exactly ``env`` and wait until it accepts connections.

    On a free port, or on ``port`` (to restart a server where its clients
    expect it; a taken port is then an error, not retried elsewhere).
    """
    last_error: DaphneStartError | None = None
    for _ in range(1 if port else BIND_ATTEMPTS):
        listen_on = port or free_port()
        # A restart on the same port keeps the earlier process's log.
        log_path = log_dir / f"daphne-{listen_on}-{time.monotonic_ns()}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*SERVE_COMMAND, "--bind", "127.0.0.1", "--port", str(listen_on)],
                cwd=PROJECT_ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = DaphneServer(process, listen_on, log_path)
        try:
            _wait_until_listening(server, startup_timeout)
            return server
        except DaphneStartError as exc:
            server.stop()
            last_error = exc
            if "Address already in use" not in server.logs():
                raise
    assert last_error is not None
    raise last_error


def _wait_until_listening(server: DaphneServer, timeout: float) -> None:
    """Until this process says it listens on its port and the port accepts.

    A connection alone is not proof: the test passes share the machine and
    run at the same time, so another pass's server may hold the port while
    this one is still starting (and about to fail its bind). A client would
    then talk to a server on another database. Daphne writes its "Listening
    on TCP address" line only once its own bind succeeded."""
    deadline = time.monotonic() + timeout
    listening = f"Listening on TCP address 127.0.0.1:{server.port}"
    while True:
        if not server.running:
            raise DaphneStartError(
                f"daphne exited with {server.process.returncode} before listening:\n{server.logs()}"
            )
        if listening in server.logs():
            try:
                with socket.create_connection(("127.0.0.1", server.port), timeout=1.0):
                    return
            except OSError:
                pass  # not accepting yet: poll again until the deadline
        if time.monotonic() > deadline:
            raise DaphneStartError(f"daphne not listening after {timeout}s:\n{server.logs()}")
        time.sleep(0.05)


class DaphneFactory:
    """Starts daphne processes for one test and stops them all at the end."""

    def __init__(self, base_env: Mapping[str, str], log_dir: Path) -> None:
        self.base_env = dict(base_env)
        self.log_dir = log_dir
        self.servers: list[DaphneServer] = []

    def __call__(
        self, env: Mapping[str, str | None] | None = None, *, port: int | None = None,
        **overrides: str | int | float | None,
    ) -> DaphneServer:
        """Start one server; ``env`` and keyword overrides are added to the base
        environment (a value of None removes the variable). ``port``: listen
        there instead of on a free port."""
        full_env = dict(self.base_env)
        for name, value in {**(env or {}), **overrides}.items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = str(value)
        server = start_daphne(full_env, self.log_dir, port=port)
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()


def server_env(database_url: str) -> dict[str, str]:
    """The environment for a test server: ours, pointed at the test database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url
    env["DJANGO_SETTINGS_MODULE"] = "owllayer_site.settings"
    env["PYTHONUNBUFFERED"] = "1"
    # Each test server's figures on a port of its own (the default is one per host).
    env.setdefault("OWLLAYER_METRICS_ADDRESS", "127.0.0.1:0")
    # The child must import this checkout, whatever the caller's cwd was.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return env
