"""The process's pool of speech worker processes: engines never run on the serving interpreter.

PocketSphinx holds the GIL for the whole utterance, and eSpeak NG's output is
resampled in Python: on the serving process, even on a thread of it, one
page's long utterance would hold up every other page's frames. So every
offline speech job runs in a worker process (worker.py); the serving process
only waits for the answer.

- OWLLAYER_VOICE_JOBS workers, started from multiprocessing's forkserver,
  never forked from the serving process: it has threads and an event loop,
  which a fork would copy half-way. The forkserver is a fresh interpreter
  that preloads the engines' modules, so a worker is a cheap fork of it.
  Each worker first loads the configured PocketSphinx decoder (warm_up) and
  keeps it across jobs.
- OWLLAYER_VOICE_QUEUE jobs may wait for a worker; with every worker busy
  and the queue full, a job is refused at once with ``speech_busy``.
- Per API key (a job's ``owner``), the bounds of allowance.py: jobs at once
  and seconds of speech per minute, refused with ``speech_rate_limited``.
- A job has OWLLAYER_VOICE_TIMEOUT to run, plus the length of the speech it
  transcribes: a worker that takes longer is killed (the job fails with
  ``speech_timeout``), one that dies mid-job fails it with ``speech_failed``;
  either is replaced at once. A caller waits at most that plus the timeout
  again (for a worker, then for the answer).
- Each worker is driven by a thread of the serving process that waits on the
  worker's socket with the GIL released: the event loop only awaits a future.

shutdown() stops the pool and its workers (the process's drain, its exit).
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import multiprocessing
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aitp.voice.base import ERROR_MESSAGES, SpeechError
from runtime.config import config, derived

from . import worker
from .allowance import KeyLimits, SpeechAllowance

T = TypeVar("T")

logger = logging.getLogger(__name__)

START_METHOD = "forkserver"
# Imported once by the forkserver, so that each worker starts with them loaded.
PRELOAD = ["speech.offline", "pocketsphinx"]
# Between two attempts to start a worker that would not start.
RESTART_PAUSE = 1.0
# How long a stopping worker may take to exit before it is killed.
STOP_GRACE = 2.0


@dataclass(frozen=True)
class PoolSettings:
    workers: int
    queue: int
    timeout: float
    per_key: KeyLimits = field(default_factory=KeyLimits)
    # (function, args) each new worker runs before its first job (loading an engine).
    warm_up: tuple | None = None


@derived
def pool_settings() -> PoolSettings:
    """The pool the configuration asks for (made once; again after it was rebuilt)."""
    from django.utils.module_loading import import_string

    voice = config().voice
    warm_up = None
    if import_string(voice.stt_backend).name == "pocketsphinx":
        from .sphinx import prepare

        warm_up = (prepare, (voice.pocketsphinx,))
    pool = voice.pool
    return PoolSettings(
        workers=pool.workers,
        queue=pool.queue,
        timeout=pool.timeout,
        per_key=KeyLimits(jobs_at_once=pool.jobs_per_key,
                          seconds_per_minute=pool.seconds_per_key_per_minute),
        warm_up=warm_up,
    )


class WorkerLost(Exception):
    """The worker process ended (or its socket closed) before it answered."""


class WorkerHung(Exception):
    """The worker did not answer within the job's time."""


_context_lock = threading.Lock()
_context = None


def worker_context():
    """The multiprocessing context workers start from (the forkserver, preloaded)."""
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context(START_METHOD)
            context.set_forkserver_preload(PRELOAD)
            _context = context
        return _context


class Worker:
    """One worker process and the serving process's end of its socket."""

    def __init__(self, process, sock: socket.socket) -> None:
        self.process = process
        self.sock = sock

    @classmethod
    def start(cls) -> Worker:
        ours, theirs = socket.socketpair()
        try:
            process = worker_context().Process(target=worker.serve, args=(theirs,),
                                               name="owllayer-speech-worker", daemon=True)
            process.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(process, ours)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.exitcode is None

    def call(self, request: bytes, timeout: float) -> tuple:
        """The worker's answer to one job (a pickled frame of worker.pack)."""
        deadline = time.monotonic() + timeout
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(request)
            header = self._read(worker.HEADER.size, deadline)
            body = self._read(worker.HEADER.unpack(header)[0], deadline)
        except TimeoutError:
            raise WorkerHung() from None
        except OSError as exc:
            raise WorkerLost(str(exc)) from None
        return pickle.loads(body)

    def _read(self, size: int, deadline: float) -> bytes:
        data = bytearray()
        while len(data) < size:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            piece = self.sock.recv(min(size - len(data), 1 << 20))
            if not piece:
                raise WorkerLost("the worker closed its socket")
            data += piece
        return bytes(data)

    def hang_up(self) -> None:
        """Close our end for reading and writing: an idle worker then exits,
        and a thread waiting on the socket wakes up."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.process.kill()

    def stop(self) -> None:
        """Let the worker exit (killed if it will not), and reap it."""
        self.hang_up()
        self.sock.close()
        with contextlib.suppress(ValueError, AssertionError):
            self.process.join(STOP_GRACE)
            if self.process.is_alive():
                self.kill()
                self.process.join(STOP_GRACE)


class _Job:
    __slots__ = ("future", "limit", "owner", "request")

    def __init__(self, request: bytes, owner: Hashable | None, limit: float) -> None:
        self.request = request
        self.owner = owner
        self.limit = limit  # seconds it may run
        self.future: concurrent.futures.Future = concurrent.futures.Future()


class SpeechPool:
    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self._lock = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._running = 0
        self._allowance = SpeechAllowance(settings.per_key)
        self._closed = False
        self._workers: set[Worker] = set()  # started and not yet stopped
        self._busy: set[Worker] = set()
        self._threads = [threading.Thread(target=self._slot, name=f"owllayer-speech-{n}", daemon=True)
                         for n in range(settings.workers)]
        for thread in self._threads:
            thread.start()

    # --- the serving side ----------------------------------------------------

    def submit(self, function: Callable[..., Any], args: tuple, *, owner: Hashable | None = None,
               seconds: float = 0.0) -> concurrent.futures.Future:
        """function(*args) in a worker, or a SpeechError at once when it may not wait for one."""
        request = worker.pack((function, args))
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise SpeechError("speech_unavailable", detail="the speech workers are stopped")
            refusal = self._allowance.refusal(owner, seconds, now)
            if refusal is not None:
                raise refusal
            if self._running + len(self._queue) >= self.settings.workers + self.settings.queue:
                raise SpeechError("speech_busy", detail=f"{self._running} speech jobs running and "
                                                        f"{len(self._queue)} waiting")
            self._allowance.take(owner, seconds, now)
            job = _Job(request, owner, self.run_limit(seconds))
            self._queue.append(job)
            self._lock.notify()
        job.future.add_done_callback(lambda future: self._cancelled(job) if future.cancelled() else None)
        return job.future

    def run_limit(self, seconds: float) -> float:
        """How long a job may run: the timeout, plus the length of the speech
        it hears (a long utterance takes the full model a while on a busy machine)."""
        return self.settings.timeout + seconds

    def load(self) -> tuple[int, int]:
        """(jobs running, jobs waiting) now."""
        with self._lock:
            return self._running, len(self._queue)

    def jobs_of(self, owner: Hashable) -> int:
        """Jobs of this owner waiting or running (until their worker is done with them)."""
        with self._lock:
            return self._allowance.jobs(owner)

    def pids(self) -> list[int]:
        """The process ids of the workers running now."""
        with self._lock:
            return [w.pid for w in self._workers if w.pid is not None and w.alive]

    def _cancelled(self, job: _Job) -> None:
        """Its caller stopped waiting: a job still in the queue leaves it (one
        already running keeps its worker, and its place, until it is done)."""
        with self._lock:
            try:
                self._queue.remove(job)
            except ValueError:
                return  # a worker took it, or the pool closed
            self._allowance.release(job.owner)

    # --- the worker threads ------------------------------------------------------

    def _slot(self) -> None:
        current: Worker | None = None
        try:
            while True:
                if current is None:
                    current = self._start_worker()
                    if current is None:
                        return
                job = self._next_job()
                if job is None:
                    return
                if not current.alive:
                    # It died while idle: the job goes to its replacement.
                    logger.warning("a speech worker (pid %s) stopped while idle (exit code %s); "
                                   "it is replaced", current.pid, current.process.exitcode)
                    self._forget(current)
                    current.stop()
                    current = self._start_worker()
                    if current is None:
                        self._give_back(job)
                        return
                if not self._run(current, job):
                    self._forget(current)
                    current.stop()
                    current = None
        finally:
            if current is not None:
                self._forget(current)
                current.stop()

    def _start_worker(self) -> Worker | None:
        """A new worker, ready for jobs (None once the pool is closed)."""
        while True:
            with self._lock:
                if self._closed:
                    return None
            try:
                started = Worker.start()
            except Exception:
                logger.exception("could not start a speech worker; trying again in %g s", RESTART_PAUSE)
            else:
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._workers.add(started)
                if closed:
                    started.stop()
                    return None
                if self._warm_up(started):
                    return started
                self._forget(started)
                started.stop()
            with self._lock:
                if not self._closed:
                    self._lock.wait(RESTART_PAUSE)

    def _warm_up(self, started: Worker) -> bool:
        function, args = self.settings.warm_up or (worker.ready, ())
        try:
            reply = started.call(worker.pack((function, args)), self.settings.timeout)
        except (WorkerLost, WorkerHung) as exc:
            if not self._closed:
                logger.warning("a speech worker (pid %s) failed to start: %s", started.pid,
                               type(exc).__name__)
            return False
        if reply[0] != "ok":
            # The engine cannot load: jobs will say so; the worker itself is fine.
            logger.warning("a speech worker could not prepare its engine: %s", reply[2])
        with self._lock:
            return not self._closed

    def _next_job(self) -> _Job | None:
        with self._lock:
            while not self._closed:
                while self._queue:
                    job = self._queue.popleft()
                    if job.future.set_running_or_notify_cancel():
                        self._running += 1
                        return job
                    self._allowance.release(job.owner)  # its caller left while it waited
                self._lock.wait()
            return None

    def _run(self, current: Worker, job: _Job) -> bool:
        """One job on `current`; False when the worker is gone or was killed."""
        with self._lock:
            self._busy.add(current)
        usable = True
        try:
            reply = current.call(job.request, job.limit)
        except WorkerHung:
            logger.warning("a speech worker (pid %s) took longer than %g s; it is replaced",
                           current.pid, job.limit)
            current.kill()
            usable = False
            outcome: object = SpeechError("speech_timeout", detail=f"no answer in {job.limit:g} s")
        except WorkerLost as exc:
            usable = False
            if self._closed:
                outcome = SpeechError("speech_unavailable", detail="the speech workers are stopping")
            else:
                logger.warning("a speech worker (pid %s) stopped during a job (%s); it is replaced",
                               current.pid, exc)
                outcome = SpeechError("speech_failed", detail="the speech worker stopped")
        else:
            outcome = _outcome(reply)
        with self._lock:
            self._busy.discard(current)
            self._running -= 1
            self._allowance.release(job.owner)
            self._lock.notify_all()
        # Outside the lock: the future's callbacks run in this thread.
        if isinstance(outcome, SpeechError):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)
        return usable

    def _give_back(self, job: _Job) -> None:
        """A job taken when the pool closed: it fails as the waiting ones did."""
        with self._lock:
            self._running -= 1
            self._allowance.release(job.owner)
        job.future.set_exception(SpeechError("speech_unavailable", detail="the speech workers are stopping"))

    def _forget(self, gone: Worker) -> None:
        with self._lock:
            self._workers.discard(gone)
            self._busy.discard(gone)

    # --- stopping ------------------------------------------------------------------

    def close(self, timeout: float = STOP_GRACE) -> None:
        """Stop: waiting jobs fail with speech_unavailable, running ones are
        cut short, every worker exits (killed if it must be) and is reaped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting, self._queue = list(self._queue), deque()
            for job in waiting:
                self._allowance.release(job.owner)
            idle = self._workers - self._busy
            busy = set(self._busy)
            self._lock.notify_all()
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(SpeechError("speech_unavailable", detail="the speech workers are stopping"))
        for each in idle:
            each.hang_up()
        for each in busy:
            each.kill()
            each.hang_up()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout + STOP_GRACE)


def _outcome(reply: tuple) -> object:
    if reply[0] == "ok":
        return reply[1]
    code, detail = reply[1], reply[2]
    return SpeechError(code if code in ERROR_MESSAGES else "speech_failed", detail=detail)


# --- the process's pool -----------------------------------------------------------

_lock = threading.Lock()
_pool: SpeechPool | None = None


def get_pool() -> SpeechPool:
    """The process's pool, as the settings ask for it (a new one when they changed)."""
    global _pool
    wanted = pool_settings()
    with _lock:
        if _pool is not None and _pool.settings == wanted:
            return _pool
        old, _pool = _pool, SpeechPool(wanted)
    if old is not None:
        threading.Thread(target=old.close, name="owllayer-speech-retire", daemon=True).start()
    return _pool


async def run(function: Callable[..., T], *args, owner: Hashable | None = None, seconds: float = 0.0) -> T:
    """function(*args) in a speech worker; awaiting it leaves the event loop
    free. `owner` (an API key) and the `seconds` of speech the job hears count
    against the owner's allowance. SpeechError for every refusal and failure."""
    pool = get_pool()
    future = pool.submit(function, args, owner=owner, seconds=seconds)
    try:
        # A worker's wait, then its run: each bounded, so a turn never hangs on speech.
        return await asyncio.wait_for(asyncio.wrap_future(future),
                                      pool.settings.timeout + pool.run_limit(seconds))
    except TimeoutError:
        raise SpeechError("speech_timeout", detail="no speech worker answered in time") from None


def shutdown() -> None:
    """Stop the process's pool and its workers (blocking, briefly: a few seconds at most)."""
    global _pool
    with _lock:
        current, _pool = _pool, None
    if current is not None:
        current.close()


atexit.register(shutdown)
