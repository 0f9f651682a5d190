"""A fake of OpenAI's audio endpoints that speaks their real HTTP API, on 127.0.0.1.

- POST /v1/audio/transcriptions: multipart/form-data with `file` (an audio
  file), `model` and optional `response_format` (json, text or verbose_json);
  answers {"text": ...}. What it "hears" is the next queued transcript, else
  `default_transcript`.
- POST /v1/audio/speech: JSON {model, input, voice, response_format}; answers
  raw 24 kHz 16-bit mono PCM for "pcm" and a WAV file for "wav" (a tone as
  long as the text, 50 ms per character), and refuses other formats it does
  not fake, as the real API refuses unknown ones.
- Errors as the real API sends them: an HTTP status with
  {"error": {"message", "type", "param", "code"}}: 401 for a wrong key, 400
  for missing fields, 413 for a file over 25 MB; fail_next() queues any other.

    with FakeSpeechServer(api_key="sk-test") as server:
        server.transcripts.append("add two headphones")
        ...  # OWLLAYER_VOICE_BASE_URL = server.base_url
        assert server.requests[0].fields["model"] == "gpt-4o-mini-transcribe"
"""
from __future__ import annotations

import io
import json
import math
import struct
import threading
import time
import wave
from collections import deque
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPEECH_RATE = 24000
MAX_FILE_BYTES = 25 * 1024 * 1024
MAX_INPUT_CHARS = 4096
SECONDS_PER_CHAR = 0.05
SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    # Form fields of a transcription (file excluded) or the JSON body of a speech request.
    fields: dict = field(default_factory=dict)
    # The uploaded file of a transcription: name, content type, bytes.
    file_name: str = ""
    file_type: str = ""
    file_bytes: bytes = b""

    @property
    def api_key(self) -> str | None:
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" and token else None


@dataclass
class Failure:
    status: int
    type: str
    message: str
    code: str | None = None


class FakeSpeechServer:
    def __init__(self, *, api_key: str | None = None, default_transcript: str = "hello",
                 delay: float = 0.0) -> None:
        self.api_key = api_key
        self.default_transcript = default_transcript
        # Seconds to wait before answering (for timeouts and concurrency tests).
        self.delay = delay
        self.transcripts: deque[str] = deque()
        self._failures: deque[Failure] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeSpeechServer:
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True,
                                        name="fake-speech")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> FakeSpeechServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "fake speech server is not running"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def fail_next(self, status: int, type: str, message: str, code: str | None = None) -> None:
        """The next request gets this error instead of an answer."""
        with self._lock:
            self._failures.append(Failure(status, type, message, code))

    # used by the handler
    def _record(self, request: RecordedRequest) -> Failure | None:
        with self._lock:
            self._requests.append(request)
            return self._failures.popleft() if self._failures else None

    def _next_transcript(self) -> str:
        with self._lock:
            return self.transcripts.popleft() if self.transcripts else self.default_transcript


def tone(seconds: float, rate: int = SPEECH_RATE) -> bytes:
    """A 440 Hz tone as 16-bit mono PCM."""
    count = int(seconds * rate)
    return struct.pack(f"<{count}h", *(int(8000 * math.sin(2 * math.pi * 440 * i / rate))
                                       for i in range(count)))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeSpeechServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: object) -> None:
        return  # keep test output clean

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        headers = {key.lower(): value for key, value in self.headers.items()}
        request = RecordedRequest(self.path, headers)
        if self.path == "/v1/audio/transcriptions":
            self._parse_form(request, body)
        elif self.path == "/v1/audio/speech":
            try:
                request.fields = json.loads(body or b"null")
            except ValueError:
                request.fields = None
        failure = fake._record(request)
        if fake.delay:
            time.sleep(fake.delay)
        if fake.api_key is not None and request.api_key != fake.api_key:
            return self._error(401, "invalid_request_error",
                               "Incorrect API key provided.", code="invalid_api_key")
        if failure is not None:
            return self._error(failure.status, failure.type, failure.message, failure.code)
        if self.path == "/v1/audio/transcriptions":
            return self._transcription(request, length)
        if self.path == "/v1/audio/speech":
            return self._speech(request)
        return self._error(404, "invalid_request_error", f"Invalid URL (POST {self.path})")

    def _parse_form(self, request: RecordedRequest, body: bytes) -> None:
        content_type = self.headers.get("content-type", "")
        if not content_type.startswith("multipart/form-data"):
            return
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body)
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            filename = part.get_filename()
            payload = part.get_payload(decode=True) or b""
            if filename is not None:
                request.file_name, request.file_type, request.file_bytes = (
                    filename, part.get_content_type(), payload)
            elif name:
                request.fields[name] = payload.decode("utf-8")

    def _transcription(self, request: RecordedRequest, length: int) -> None:
        if length > MAX_FILE_BYTES:
            return self._error(413, "invalid_request_error", "Maximum content size limit exceeded.")
        if not self.headers.get("content-type", "").startswith("multipart/form-data"):
            return self._error(400, "invalid_request_error",
                               "Invalid Content-Type header, expected multipart/form-data.")
        if not request.fields.get("model"):
            return self._error(400, "invalid_request_error", "you must provide a model parameter",
                               param="model")
        if not request.file_name:
            return self._error(400, "invalid_request_error", "you must provide a file", param="file")
        if request.file_bytes[:4] != b"RIFF" or request.file_bytes[8:12] != b"WAVE":
            # The real service reads many formats; this fake reads WAV only.
            return self._error(400, "invalid_request_error",
                               "Invalid file format. Supported formats: ['wav']", param="file")
        text = self.server.fake._next_transcript()
        response_format = request.fields.get("response_format", "json")
        if response_format == "text":
            return self._send(200, "text/plain; charset=utf-8", text.encode("utf-8"))
        if response_format == "verbose_json":
            with wave.open(io.BytesIO(request.file_bytes)) as reader:
                duration = reader.getnframes() / reader.getframerate()
            return self._json(200, {"task": "transcribe", "language": "english",
                                    "duration": duration, "text": text, "segments": []})
        if response_format != "json":
            return self._error(400, "invalid_request_error",
                               f"Invalid response_format: {response_format}", param="response_format")
        return self._json(200, {"text": text})

    def _speech(self, request: RecordedRequest) -> None:
        body = request.fields
        if not isinstance(body, dict):
            return self._error(400, "invalid_request_error", "We could not parse the JSON body.")
        for name in ("model", "input", "voice"):
            if not body.get(name):
                return self._error(400, "invalid_request_error",
                                   f"Missing required parameter: '{name}'.", param=name)
        text = body["input"]
        if len(text) > MAX_INPUT_CHARS:
            return self._error(400, "invalid_request_error",
                               f"'input' is too long: at most {MAX_INPUT_CHARS} characters.",
                               param="input")
        response_format = body.get("response_format", "mp3")
        if response_format not in SPEECH_FORMATS:
            return self._error(400, "invalid_request_error",
                               f"Invalid value for 'response_format': {response_format!r}.",
                               param="response_format")
        pcm = tone(SECONDS_PER_CHAR * len(text))
        if response_format == "pcm":
            return self._send(200, "audio/pcm", pcm)
        if response_format == "wav":
            buffer = io.BytesIO()
            with wave.open(buffer, "wb") as writer:
                writer.setnchannels(1)
                writer.setsampwidth(2)
                writer.setframerate(SPEECH_RATE)
                writer.writeframes(pcm)
            return self._send(200, "audio/wav", buffer.getvalue())
        return self._error(400, "invalid_request_error",
                           f"this fake does not encode {response_format}", param="response_format")

    def _error(self, status: int, type: str, message: str, code: str | None = None,
               param: str | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": type, "param": param, "code": code}})

    def _json(self, status: int, data: dict) -> None:
        self._send(status, "application/json", json.dumps(data).encode("utf-8"))

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The client stopped waiting (a timeout test): nothing to answer.
            self.close_connection = True
