"""Jobs the speech pool's tests send to its worker processes (which import
this module by name, as they import the engines'). Each is plain blocking
work, as an engine's is; the test process steers them through files."""
from __future__ import annotations

import os
import time
from pathlib import Path

from aitp.voice.base import SpeechError

PATIENCE = 120  # seconds a held job waits for the test's go before it gives up


def pid() -> int:
    return os.getpid()


def hold(folder: str, name: str) -> int:
    """Say it started (a file `<name>.started`), then wait for `<name>.go`."""
    Path(folder, f"{name}.started").write_text(str(os.getpid()))
    deadline = time.monotonic() + PATIENCE
    while not Path(folder, f"{name}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def crash() -> None:
    os._exit(3)


def hang() -> None:
    time.sleep(3600)


def refuse() -> None:
    raise SpeechError("speech_rejected", detail="scripted refusal")


def break_down() -> None:
    raise ValueError("scripted bug")


def decoder_id(config) -> tuple[int, int]:
    """(this worker's pid, the identity of its decoder for `config`)."""
    from speech.sphinx import load_decoder

    return os.getpid(), id(load_decoder(config))
