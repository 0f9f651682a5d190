"""Start and stop the two daphne processes the benchmark measures.

Both listen on 127.0.0.1 only, on a free port each, and write their output
to a log file in the run's scratch directory (shown when one fails).
"""
from __future__ import annotations

import logging
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
# Django set-up and the first imports; bounded so a broken server ends the
# run with its log instead of hanging it.
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
# Another process can take a probed free port before daphne binds it.
BIND_ATTEMPTS = 3
LOG_TAIL_CHARS = 4000

CommandForPort = Callable[[int], list[str]]


class ServerStartError(RuntimeError):
    pass


def raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (``ulimit -n``): thousands of
    sockets are held at once. Called in the bench and, through preexec_fn,
    in every server it starts."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def product_command(port: int) -> list[str]:
    return [sys.executable, "-m", "owllayer_site.serve", "-b", HOST, "-p", str(port)]


def baseline_command(port: int) -> list[str]:
    return [sys.executable, "-m", "daphne", "-b", HOST, "-p", str(port),
            "bench.baseline_asgi:application"]


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    port: int
    log_path: Path
    # Set by stop(): a server the run stopped did not die.
    stopped: bool = False

    def ws_url(self, path: str) -> str:
        return f"ws://{HOST}:{self.port}{path}"

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def died(self) -> bool:
        """It exited without being stopped (a crash, the OOM killer)."""
        return not self.stopped and not self.running

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text[-LOG_TAIL_CHARS:]

    def stop(self) -> int:
        """SIGTERM, then SIGKILL when it is still running after STOP_TIMEOUT."""
        self.stopped = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                logger.warning("%s server ignored SIGTERM; killing pid %s", self.name,
                               self.process.pid)
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)
        return self.process.returncode


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def spawn(name: str, command_for_port: CommandForPort, env: Mapping[str, str],
          log_dir: Path) -> Server:
    """Start the process; does not wait for it to listen (see wait_listening)."""
    port = free_port()
    log_path = log_dir / f"{name}-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command_for_port(port),
            cwd=PROJECT_ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=raise_open_files_limit,
        )
    return Server(name, process, port, log_path)


def wait_listening(server: Server, timeout: float = STARTUP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not server.running:
            raise ServerStartError(
                f"{server.name} server exited with {server.process.returncode} before "
                f"listening:\n{server.log_tail()}"
            )
        try:
            with socket.create_connection((HOST, server.port), timeout=1.0):
                return
        except OSError:
            pass  # not listening yet: poll again until the deadline
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"{server.name} server not listening after {timeout}s:\n{server.log_tail()}"
            )
        time.sleep(0.05)


class ServerSet:
    """The run's servers; ``stop_all()`` stops every one ever started."""

    def __init__(self, env: Mapping[str, str], log_dir: Path) -> None:
        self.env = dict(env)
        self.log_dir = log_dir
        self.started: list[Server] = []

    def start(self, specs: Mapping[str, CommandForPort],
              env: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Server]:
        """Start ``{name: command_for_port}`` side by side, then wait for each.

        Both start at once: Django's set-up takes seconds and the two do not
        depend on each other. A lost port race is retried on a new port.
        """
        pending = dict(specs)
        ready: dict[str, Server] = {}
        for attempt in range(1, BIND_ATTEMPTS + 1):
            launched = {name: self._spawn(name, command, (env or {}).get(name, {}))
                        for name, command in pending.items()}
            lost_race: list[str] = []
            for name, server in launched.items():
                try:
                    wait_listening(server)
                except ServerStartError as exc:
                    server.stop()
                    if "Address already in use" not in str(exc) or attempt == BIND_ATTEMPTS:
                        raise
                    lost_race.append(name)
                else:
                    ready[name] = server
            if not lost_race:
                break
            pending = {name: pending[name] for name in lost_race}
            logger.info("port taken before bind; retrying %s", ", ".join(lost_race))
        return ready

    def _spawn(self, name: str, command: CommandForPort, extra_env: Mapping[str, str]) -> Server:
        server = spawn(name, command, {**self.env, **extra_env}, self.log_dir)
        self.started.append(server)
        return server

    def stop(self, names: list[str]) -> None:
        """Stop the servers of these names (a phase's own servers)."""
        for server in self.started:
            if server.name in names:
                server.stop()

    def stop_all(self) -> None:
        for server in self.started:
            code = server.stop()
            logger.debug("%s server (pid %s) exited with %s", server.name, server.process.pid,
                         code)
