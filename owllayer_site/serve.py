"""Serve OwlLayer with daphne, with the WebSocket frame ceiling taken from settings.

    python -m owllayer_site.serve [--bind 127.0.0.1] [--port 8000] [daphne options...]

daphne closes a connection with 1009 on a frame over its own limit, and the
deployed client answers 1009 by reconnecting and resending the same frame.
So daphne's ceiling sits well above OWLLAYER_MAX_MESSAGE_BYTES: a frame over
our limit but under the ceiling gets a readable ``too_large`` error event and
the connection stays; only absurd frames hit the ceiling.

The process registers itself (``aitp.processes``), sweeps what processes
that are gone left open before it serves, and stops cleanly on SIGTERM or
SIGINT: open pages get ``SYSTEM_EVENT disconnect`` and close 1001 (they
reconnect, to another process behind the proxy), running turns are
cancelled, rows are closed, all within OWLLAYER_SHUTDOWN_DRAIN seconds.

Before anything else it checks that the port is free (``--check-port`` only
checks, for ``make run`` to fail before it migrates), that the settings can
be used, and that the database and Redis answer: each failure is one
paragraph naming what to fix (owllayer_site/startup_errors.py), exit code 2.

Then, with the Anthropic backend, it checks the model key with one cheap
request (``check_access``: the list of models, within
OWLLAYER_MODEL_CHECK_TIMEOUT seconds) and says in its banner and its log
whether the key was accepted, refused (naming ANTHROPIC_API_KEY, the
variable to fix) or could not be checked because the API did not answer. It
serves in every case; what it found is the admin's banner
(``runtime.model_access``) until a turn finds otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import io
import logging
import os
import sys

# Allocations between two collections of the youngest generation (Python's default: 700).
GC_YOUNG_THRESHOLD = 20_000

logger = logging.getLogger("owllayer_site.serve")


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "owllayer_site.settings")
    from owllayer_site import startup_errors

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", "-b", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", "-p", type=_port, default=os.environ.get("PORT") or "8000")
    parser.add_argument("--check-port", action="store_true",
                        help="only check that the port is free; exit 1 when it is not")
    args, extra = parser.parse_known_args(argv)
    busy = startup_errors.port_in_use(args.bind, args.port)
    if busy is not None:
        _exit(busy, 1)
    if args.check_port:
        return
    try:
        _set_up(startup_errors)
    except Exception as exc:
        message = None if startup_errors.wants_traceback() else startup_errors.explain(exc)
        if message is None:
            raise
        _exit(message, 2)
    _serve(args, extra)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the port must be a number, got {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"the port must be between 1 and 65535, got {port}")
    return port


def _exit(message: str, code: int) -> None:
    print(f"owllayer_site.serve: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _set_up(startup_errors) -> None:
    """Django, then the database (it must answer before we serve) and Redis (a warning)."""
    import django

    django.setup()
    problem = startup_errors.database_unreachable()
    if problem is not None:
        raise startup_errors.StartupError(problem)
    # Without Redis a process can still start: the channel layer keeps
    # retrying and pages connect once Redis answers. Said once, plainly.
    redis_problem = startup_errors.redis_unreachable()
    if redis_problem is not None:
        print(f"owllayer_site.serve: warning: {redis_problem}", file=sys.stderr, flush=True)
    from django.core.management import call_command

    from aitp import processes
    from runtime.config import config

    processes.register()
    # Rows left open by processes that are gone (this one's previous run,
    # killed, say): swept before serving, so a key's cap is free at once.
    if config().site.log_format == "json":
        # Its summary as a JSON log line like every other, not the command's own line.
        swept = io.StringIO()
        call_command("sweep", stdout=swept)
        logger.info("sweep: %s", swept.getvalue().strip())
    else:
        call_command("sweep")


def _raise_open_files_limit() -> None:
    """Every page holds a socket: the soft open-files limit (often 1,024) is
    raised to the hard one, so thousands of pages are not refused by the
    kernel. Left as it is where that is not allowed."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _load_engines_early() -> None:
    """Load the model's backend (the anthropic SDK takes a second of CPU to
    import) before serving, and check the speech engines while daphne starts
    (in a speech worker process, waited for on a thread of their own): the
    first pages would otherwise wait for both."""
    import llm
    from runtime.config import config

    llm.get_backend()
    if not config().voice.enabled:
        return
    import threading

    import speech

    threading.Thread(target=speech.audio_available, name="owllayer-voice-check",
                     daemon=True).start()


def _serve_metrics() -> None:
    """The figures for a host's monitoring, on their own address (the log says where)."""
    from runtime import metrics, metrics_server

    if metrics_server.start() is not None:
        metrics.draining(False)  # this process's line, from its start


DEFAULT_API_URL = "https://api.anthropic.com"


def _check_model_key() -> None:
    """Ask the model API once whether it accepts the key; say what it
    answered. Only for a backend that can check (the Anthropic one)."""
    import llm
    from runtime import model_access
    from runtime.config import config

    check = getattr(llm.get_backend(), "check_access", None)
    timeout = config().llm.check_timeout
    if check is None or timeout <= 0:
        return
    error = check(timeout)
    where = config().llm.base_url or DEFAULT_API_URL
    if error is None:
        model_access.record(model_access.ACCEPTED, found_by="the start-up check")
        _announce(logging.INFO, f"model: {config().agent.model} at {where}, key accepted "
                                "(ANTHROPIC_API_KEY)")
    elif error.code == "auth_failed":
        model_access.record(model_access.REFUSED, error.detail, found_by="the start-up check")
        _announce(logging.ERROR,
                  f"the model API at {where} refused the key in ANTHROPIC_API_KEY "
                  f"({error.detail}). Every turn fails (auth_failed) until ANTHROPIC_API_KEY "
                  "holds a valid key: set it and restart the server.")
    elif error.code in ("unreachable", "timeout"):
        model_access.record(model_access.UNREACHABLE, error.detail, found_by="the start-up check")
        _announce(logging.WARNING,
                  f"the model API at {where} is unreachable ({error.code}: {error.detail}); "
                  "the key in ANTHROPIC_API_KEY was not checked. Serving anyway: turns fail "
                  "until the API answers (check the network, or ANTHROPIC_BASE_URL).")
    else:
        _announce(logging.WARNING,
                  f"the model key could not be checked at {where} "
                  f"({error.code}: {error.detail}). Serving anyway.")


def _announce(level: int, message: str) -> None:
    """A line of the start banner (standard error, for people; not in JSON
    logs, which carry it as their own line) and the same in the log."""
    from runtime.config import config

    if config().site.log_format == "text":
        label = {logging.ERROR: "error: ", logging.WARNING: "warning: "}.get(level, "")
        print(f"owllayer_site.serve: {label}{message}", file=sys.stderr, flush=True)
    logger.log(level, "%s", message)


def _warm_up_when_serving() -> None:
    """As the serving loop starts: the channel layer loaded and the model's
    client made (``warm_up`` of the backend, where it has one), then what was
    loaded since start-up (the application daphne imported, the layer, the
    client) frozen with the rest. The first page and the first turn would
    otherwise load them on the loop every page's frames wait for."""
    from channels.layers import get_channel_layer
    from twisted.internet import reactor

    import llm

    async def warm_up() -> None:
        get_channel_layer()
        prepare = getattr(llm.get_backend(), "warm_up", None)
        if prepare is not None:
            try:
                await prepare()
            except Exception:
                logger.warning("could not prepare the model's client; the first turn will",
                               exc_info=True)
        _quiet_garbage_collector()

    def start() -> None:
        # The loop holds its tasks weakly: this one is held until it is done.
        task = asyncio.ensure_future(warm_up())
        _warming.add(task)
        task.add_done_callback(_warming.discard)

    reactor.callWhenRunning(start)


_warming: set[asyncio.Future] = set()


def _quiet_garbage_collector() -> None:
    """What start-up loaded (Django, the apps, the SDKs: most of the heap)
    lives as long as the process: frozen, the collector stops walking it on
    every full collection. Frames, frames' JSON and rows are short-lived
    and mostly acyclic: collections of the youngest generation are made
    rarer, each still cheap."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _serve(args: argparse.Namespace, extra: list[str]) -> None:
    from django.db import DatabaseError, connections

    from aitp import processes
    from runtime import tracing
    from runtime.config import config
    from speech import jobs

    _raise_open_files_limit()
    # The speech workers stop with the drain, once the turns that used them are over.
    processes.stop_after_drain(jobs.shutdown)
    # The spans of the turns the drain ended go to the collector before the process does.
    processes.stop_after_drain(tracing.flush)
    _install_graceful_shutdown()
    ceiling = str(config().protocol.frame_ceiling_bytes)
    from daphne.cli import CommandLineInterface

    from owllayer_site import access_log
    # No ?apiKey= value in daphne's access log; JSON lines when the log's are.
    access_log.install(json_lines=config().site.log_format == "json")
    _serve_metrics()
    _load_engines_early()
    _check_model_key()
    _quiet_garbage_collector()
    _warm_up_when_serving()

    try:
        CommandLineInterface().run(
            [
                "-b", args.bind,
                "-p", str(args.port),
                "--websocket-max-message-size", ceiling,
                "--websocket-max-frame-size", ceiling,
                *extra,
                "owllayer_site.asgi:application",
            ]
        )
    finally:
        # The drain did this already unless daphne stopped some other way;
        # done again it changes nothing.
        jobs.shutdown()
        try:
            connections.close_all()
            processes.mark_stopped()
        except DatabaseError:
            logger.exception("could not record this process's stop")


def _install_graceful_shutdown() -> None:
    """Drain before daphne cancels its applications.

    Twisted stops the reactor on SIGTERM and SIGINT and runs the "before
    shutdown" triggers together; daphne's cancels every application at
    once. Ours must finish first, so it wraps daphne's: drain (the Deferred
    keeps the reactor running until it fires), then let daphne cancel
    whatever is left."""
    from daphne.server import Server  # installs Twisted's asyncio reactor
    from twisted.internet import defer, reactor

    from aitp import processes

    if getattr(Server, "_owllayer_drain_installed", False):
        return
    kill_all_applications = Server.kill_all_applications

    def drain_then_kill_all_applications(self):
        drained = defer.Deferred.fromFuture(asyncio.ensure_future(processes.drain()))
        drained.addErrback(lambda failure: logger.error("drain failed: %s", failure.getTraceback()))
        drained.addCallback(lambda _: kill_all_applications(self))
        return drained

    Server.kill_all_applications = drain_then_kill_all_applications
    Server._owllayer_drain_installed = True
    reactor.callWhenRunning(processes.start_timers)


if __name__ == "__main__":
    main(sys.argv[1:])
