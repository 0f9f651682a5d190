"""The voice settings come from the environment, reach the engines, and refuse what cannot work."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CODE = (
    "import json, django; django.setup();"
    "from runtime.config import config; from django.conf import settings as s;"
    "v = config().voice; l = v.limits; h = v.hosted; e = v.espeak;"
    "print(json.dumps([s.OWLLAYER_STT, s.OWLLAYER_TTS, s.OWLLAYER_VOICE_JOBS, l.max_utterance_seconds,"
    " l.bytes_per_second, l.idle_seconds, l.server_vad, l.vad_silence_seconds, h.base_url, h.stt_model,"
    " h.tts_model, h.tts_voice, h.timeout, e.voice, e.words_per_minute,"
    " v.pocketsphinx.grammar]))"
)
POOL = (
    "import json, django; django.setup();"
    "from speech.jobs import pool_settings; from runtime.config import config;"
    "p = pool_settings();"
    "print(json.dumps([p.workers, p.queue, p.timeout, p.per_key.jobs_at_once, p.per_key.seconds_per_minute,"
    " config().voice.pocketsphinx.min_voiced_seconds]))"
)


def run_settings(code: str = CODE, **environment: str) -> subprocess.CompletedProcess:
    # Settings are read once, at start-up: a fresh interpreter reads them.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "owllayer_site.settings", "DJANGO_DEBUG": "true",
           **environment}
    for name in ("OWLLAYER_VOICE_JOBS", "OWLLAYER_VOICE_QUEUE", "OWLLAYER_VOICE_JOBS_PER_KEY",
                 "OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE", "OWLLAYER_STT_MIN_VOICED_SECONDS"):
        if name not in environment:
            env.pop(name, None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=os.getcwd(), timeout=120)


def test_the_environment_sets_every_voice_setting(tmp_path):
    grammar = tmp_path / "shop.gram"
    grammar.write_text("#JSGF V1.0;\ngrammar shop;\npublic <c> = yes | no;\n")
    done = run_settings(
        OWLLAYER_STT="openai", OWLLAYER_TTS="openai", OWLLAYER_VOICE_API_KEY="sk-voice",
        OWLLAYER_VOICE_BASE_URL="http://127.0.0.1:9/v1", OWLLAYER_STT_MODEL="whisper-1",
        OWLLAYER_TTS_MODEL="tts-1", OWLLAYER_TTS_VOICE="nova", OWLLAYER_VOICE_TIMEOUT="12.5",
        OWLLAYER_VOICE_JOBS="3", OWLLAYER_VOICE_MAX_UTTERANCE_SECONDS="20",
        OWLLAYER_VOICE_BYTES_PER_SECOND="48000", OWLLAYER_VOICE_IDLE_SECONDS="2.5",
        OWLLAYER_SERVER_VAD="true", OWLLAYER_VAD_SILENCE_SECONDS="0.5",
        OWLLAYER_ESPEAK_VOICE="en-gb", OWLLAYER_ESPEAK_WPM="140", OWLLAYER_STT_GRAMMAR=str(grammar),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "openai", "openai", 3, 20.0, 48000, 2.5, True, 0.5, "http://127.0.0.1:9/v1", "whisper-1",
        "tts-1", "nova", 12.5, "en-gb", 140, str(grammar),
    ]


def test_the_environment_sets_the_speech_workers_their_queue_and_each_keys_share():
    done = run_settings(POOL, OWLLAYER_VOICE_JOBS="3", OWLLAYER_VOICE_QUEUE="5", OWLLAYER_VOICE_TIMEOUT="12.5",
                        OWLLAYER_VOICE_JOBS_PER_KEY="4", OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE="45",
                        OWLLAYER_STT_MIN_VOICED_SECONDS="0.2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [3, 5, 12.5, 4, 45.0, 0.2]


def test_by_default_a_key_may_hold_half_the_workers_and_queue_and_hears_two_minutes_a_minute():
    done = run_settings(POOL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2, 4, 30.0, 3, 120.0, 0.08]
    bigger = run_settings(POOL, OWLLAYER_VOICE_JOBS="8", OWLLAYER_VOICE_QUEUE="16")
    assert json.loads(bigger.stdout.strip().splitlines()[-1])[3] == 12


@pytest.mark.parametrize("environment, fact", [
    ({"OWLLAYER_TTS": "openai"}, "needs OWLLAYER_VOICE_API_KEY"),
    ({"OWLLAYER_STT": "whisper"}, "OWLLAYER_STT must be one of"),
    ({"OWLLAYER_STT_GRAMMAR": "/nonexistent/shop.gram"}, "OWLLAYER_STT_GRAMMAR is not a file"),
    ({"OWLLAYER_VOICE_JOBS": "0"}, "OWLLAYER_VOICE_JOBS must be >= 1"),
    ({"OWLLAYER_VOICE_QUEUE": "-1"}, "OWLLAYER_VOICE_QUEUE must be >= 0"),
    ({"OWLLAYER_VOICE_JOBS_PER_KEY": "many"}, "OWLLAYER_VOICE_JOBS_PER_KEY must be an integer"),
    ({"OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE": "-5"}, "OWLLAYER_VOICE_SECONDS_PER_KEY_PER_MINUTE must be >= 0"),
    ({"OWLLAYER_STT_MIN_VOICED_SECONDS": "-0.1"}, "OWLLAYER_STT_MIN_VOICED_SECONDS must be >= 0"),
    ({"OWLLAYER_VOICE_BYTES_PER_SECOND": "16000"}, "OWLLAYER_VOICE_BYTES_PER_SECOND must be >= 32000"),
])
def test_a_voice_setting_that_cannot_work_stops_the_process_at_start_up(environment, fact):
    done = run_settings(OWLLAYER_VOICE_API_KEY="", **environment)
    assert done.returncode != 0
    assert fact in done.stderr
