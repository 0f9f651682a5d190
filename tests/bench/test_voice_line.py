"""The voice line's pure parts: its concurrency steps, the doubling point, its
rows, the microphone chunks and what one voice turn times (fakes, no servers,
no timing assertions)."""
from __future__ import annotations

import base64
import json

import pytest

from bench import lines, measure, report
from bench.measure import BenchError, Observations
from bench.stats import doubling_point, latency_summary
from tests.bench.test_measurement import PRODUCT, FakeClient, FakeClock, FakeSocket, peer


def frame(frame_type: str, payload: dict) -> str:
    return json.dumps({"id": "s", "type": frame_type, "payload": payload})


TRANSCRIPT = frame("SYSTEM_EVENT", {"kind": "transcript",
                                    "data": {"role": "user", "text": "what is in my cart"}})
DELTA = frame("AGENT_RESPONSE", {"chunk": "Sure. ", "done": False})
AUDIO = frame("AUDIO_STREAM", {"data": "AAAA", "mimeType": "audio/pcm;rate=24000"})
COMPLETE = frame("VOICE_STATE_EVENT", {"event": "turn_complete"})
DONE = frame("AGENT_RESPONSE", {"chunk": "Sure.", "done": True})


# --- the steps and the doubling point ------------------------------------------------


def test_the_concurrency_steps_double_up_to_the_cap_and_end_on_it():
    assert lines.concurrency_steps(8) == [1, 2, 4, 8]
    assert lines.concurrency_steps(6) == [1, 2, 4, 6]
    assert lines.concurrency_steps(1) == [1]


def test_a_cap_below_one_session_is_refused():
    with pytest.raises(ValueError, match=">= 1"):
        lines.concurrency_steps(0)


def test_each_step_runs_the_samples_asked_for_and_every_session_at_least_two_turns():
    assert lines.voice_turns_per_session(8, 1) == 8
    assert lines.voice_turns_per_session(8, 3) == 3
    assert lines.voice_turns_per_session(8, 8) == lines.MIN_VOICE_TURNS == 2


def test_the_doubling_point_is_the_first_step_at_twice_the_single_session_time():
    held, doubled_at = doubling_point([(1, 100.0), (2, 150.0), (4, 250.0), (8, 900.0)])

    assert (held, doubled_at) == (2, 4)


def test_exactly_twice_the_single_session_time_counts_as_doubled():
    assert doubling_point([(1, 100.0), (2, 200.0)]) == (1, 2)


def test_a_faster_step_after_the_doubling_does_not_move_it():
    assert doubling_point([(1, 100.0), (2, 210.0), (4, 190.0)]) == (1, 2)


def test_a_line_that_never_doubles_holds_its_largest_step_and_names_no_doubling():
    assert doubling_point([(1, 100.0), (2, 120.0), (4, 199.0)]) == (4, None)


def test_steps_out_of_order_or_missing_are_refused():
    with pytest.raises(ValueError, match="no steps"):
        doubling_point([])
    with pytest.raises(ValueError, match="ever more sessions"):
        doubling_point([(2, 100.0), (1, 300.0)])
    with pytest.raises(ValueError, match="positive"):
        doubling_point([(1, 0.0), (2, 1.0)])


# --- the line's rows -------------------------------------------------------------------


def step(p50_seconds: float, p99_seconds: float) -> dict:
    return {"latency_ms": latency_summary([p50_seconds] * 99 + [p99_seconds] * 2),
            "count": 101}


def voice_line() -> dict:
    return report.voice_measure("voice", "voice", [
        (1, step(0.100, 0.120)), (2, step(0.150, 0.200)), (4, step(0.300, 0.480))])


def test_each_step_is_compared_with_one_session_of_the_same_run():
    line = voice_line()
    rows = {row["stat"]: row for row in line["rows"]}

    assert rows["p50 ms, 1 session"]["ratio"] == pytest.approx(1.0)
    assert rows["p50 ms, 4 sessions"]["product"] == pytest.approx(300.0)
    assert rows["p50 ms, 4 sessions"]["baseline"] == pytest.approx(100.0)
    assert rows["p50 ms, 4 sessions"]["ratio"] == pytest.approx(3.0)
    assert rows["p99 ms, 4 sessions"]["baseline"] == rows["p99 ms, 1 session"]["product"]


def test_the_last_row_says_how_many_sessions_were_held_before_the_time_doubled():
    line = voice_line()

    assert line["rows"][-1]["stat"] == "sessions held before p50 2x"
    assert line["rows"][-1]["product"] == 2
    assert line["rows"][-1]["baseline"] is None and line["rows"][-1]["ratio"] is None
    assert (line["raw"]["held_sessions"], line["raw"]["p50_doubled_at"]) == (2, 4)
    assert [s["p50_ratio"] for s in line["raw"]["steps"]] == pytest.approx([1.0, 1.5, 3.0])
    assert line["raw"]["steps"][0]["count"] == 101


def test_a_line_that_never_doubled_says_up_to_which_step_it_held():
    line = report.voice_measure("voice", "voice", [(1, step(0.1, 0.1)), (2, step(0.15, 0.2))])

    assert line["rows"][-1]["stat"] == "sessions, p50 under 2x up to"
    assert line["rows"][-1]["product"] == 2
    assert line["raw"]["p50_doubled_at"] is None


def test_the_voice_line_is_reported_without_a_verdict():
    built = report.build_report(config={}, environment={}, measures=[voice_line()],
                                wire_problems=[], notes=[], seconds=1.0)

    assert built["measures"][0]["verdict"] == report.INFO
    assert all(row["target"] == "" for row in built["measures"][0]["rows"])
    assert built["verdict"] == report.OK


def test_the_table_shows_the_sessions_held_as_a_count_with_no_baseline_or_ratio():
    built = report.build_report(
        config={}, environment={"database": "sqlite", "channel_layer": "InMemoryChannelLayer",
                                "llm": "offline", "cpus": 2},
        measures=[voice_line()], wire_problems=[], notes=[], seconds=1.0)

    rows = report.table_rows(built)

    assert rows[-1][1:5] == ("sessions held before p50 2x", "2", "", "")
    assert rows[4][1:5] == ("p50 ms, 4 sessions", "300", "100", "3.00x")


def test_the_first_step_of_the_voice_line_must_be_one_session():
    with pytest.raises(ValueError, match="one session"):
        report.voice_measure("voice", "voice", [(2, step(0.1, 0.1))])


# --- the microphone --------------------------------------------------------------------


def test_the_microphone_sends_whole_samples_that_add_up_to_the_utterance():
    pcm = bytes(range(256)) * 100  # 25,600 bytes: three full chunks and a short one

    chunks = lines.microphone_chunks(pcm, size=8192)

    decoded = [base64.b64decode(chunk) for chunk in chunks]
    assert [len(piece) for piece in decoded] == [8192, 8192, 8192, 1024]
    assert b"".join(decoded) == pcm


def test_a_chunk_size_that_would_split_a_sample_is_refused():
    with pytest.raises(ValueError, match="whole 16-bit samples"):
        lines.microphone_chunks(b"\0" * 10, size=8191)


# --- one voice turn ---------------------------------------------------------------------


class SpeakingSocket(FakeSocket):
    """Each microphone chunk takes a second to send; the answer to
    VOICE_INPUT_END comes from ``answer``."""

    def __init__(self, answer: list[tuple[float, str]], clock: FakeClock) -> None:
        super().__init__(lambda sent: answer if sent["type"] == "VOICE_INPUT_END" else [],
                         clock)

    async def send(self, text: str) -> None:
        if json.loads(text)["type"] == "AUDIO_STREAM":
            self.clock.now += 1.0
        await super().send(text)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(measure, "clock", fake)
    return fake


async def test_a_voice_turn_is_timed_from_the_end_of_speech_to_the_first_audio_frame(clock):
    # Heard 0.5 s after VOICE_INPUT_END, first audio 0.25 + 0.25 s later; the
    # rest of the answer (4 s more) is read but not timed.
    ws = SpeakingSocket([(0.5, TRANSCRIPT), (0.25, DELTA), (0.25, AUDIO), (2.0, AUDIO),
                         (1.0, COMPLETE), (1.0, DONE)], clock)
    page = peer(PRODUCT, ws, Observations(keep_frames=False))

    turn = await measure.one_voice_turn(page, ["AAAA", "BBBB", "CCCC"])

    assert turn.first_audio == pytest.approx(1.0)
    assert turn.heard == pytest.approx(0.5)
    assert [sent["type"] for sent in ws.sent] == ["AUDIO_STREAM"] * 3 + ["VOICE_INPUT_END"]
    assert ws.sent[0]["payload"] == {"data": "AAAA", "mimeType": "audio/pcm;rate=16000"}
    assert ws.sent[-1]["payload"] == {"reason": "user_stop"}
    assert len(ws.received) == 6  # read to done:true: the next turn starts clean


NO_SPEECH = frame("SYSTEM_EVENT", {"kind": "error", "message": "I didn't catch that.",
                                   "data": {"code": "no_speech"}})


async def test_a_turn_answered_no_speech_is_read_to_its_end_and_has_no_times(clock):
    ws = SpeakingSocket([(0.5, NO_SPEECH), (0.1, COMPLETE), (0.1, DONE)], clock)
    page = peer(PRODUCT, ws, Observations(keep_frames=False))

    turn = await measure.one_voice_turn(page, ["AAAA"])

    assert (turn.heard, turn.first_audio) == (None, None)
    assert len(ws.received) == 3


async def test_any_other_error_in_a_voice_turn_stops_the_line(clock):
    failed = frame("SYSTEM_EVENT", {"kind": "error", "message": "Speech failed.",
                                    "data": {"code": "speech_failed"}})
    ws = SpeakingSocket([(0.5, failed), (0.1, COMPLETE), (0.1, DONE)], clock)
    page = peer(PRODUCT, ws, Observations(keep_frames=False))

    with pytest.raises(BenchError, match="speech_failed"):
        await measure.one_voice_turn(page, ["AAAA"])


async def test_a_voice_turn_that_is_never_spoken_back_stops_the_line(clock):
    ws = SpeakingSocket([(0.5, TRANSCRIPT), (0.1, DELTA), (0.1, COMPLETE), (0.1, DONE)], clock)
    page = peer(PRODUCT, ws, Observations(keep_frames=False))

    with pytest.raises(BenchError, match="without the agent's voice"):
        await measure.one_voice_turn(page, ["AAAA"])


async def test_a_voice_turn_that_was_not_heard_stops_the_line(clock):
    ws = SpeakingSocket([(0.1, AUDIO), (0.1, COMPLETE), (0.1, DONE)], clock)
    page = peer(PRODUCT, ws, Observations(keep_frames=False))

    with pytest.raises(BenchError, match="without a transcript"):
        await measure.one_voice_turn(page, ["AAAA"])


async def test_a_voice_turn_whose_audio_does_not_end_with_turn_complete_stops_the_line(clock):
    ws = SpeakingSocket([(0.1, TRANSCRIPT), (0.1, COMPLETE), (0.1, AUDIO), (0.1, DONE)], clock)
    page = peer(PRODUCT, ws, Observations(keep_frames=False))

    with pytest.raises(BenchError, match="turn_complete"):
        await measure.one_voice_turn(page, ["AAAA"])


def test_a_handshake_that_did_not_offer_audio_stops_the_line():
    client = FakeClient(FakeSocket(lambda sent: [], FakeClock()))
    client.ack = {"capabilities": ["text", "tools"]}
    page = measure.Peer(PRODUCT, client, Observations(keep_frames=False), "voice")

    with pytest.raises(BenchError, match="not 'audio'"):
        page.require_capability("audio")


def test_without_espeak_ng_the_voice_line_stops_before_anything_starts(monkeypatch):
    from speech import offline

    monkeypatch.setattr(offline.shutil, "which", lambda name: None)

    with pytest.raises(BenchError, match="make espeak"):
        lines.spoken_utterance()


def fake_pages(monkeypatch, turns: list[measure.VoiceTurn]) -> None:
    """One page whose voice turns come out as ``turns``, in order."""
    answers = iter(turns)

    async def open_pages(*args, **kwargs):
        return [peer(PRODUCT, FakeSocket(lambda sent: [], FakeClock()),
                     Observations(keep_frames=False))]

    async def one_voice_turn(page, chunks, *, timeout):
        return next(answers)

    monkeypatch.setattr(lines, "open_pages", open_pages)
    monkeypatch.setattr(measure, "one_voice_turn", one_voice_turn)


async def test_a_step_counts_the_turns_not_heard_and_keeps_them_out_of_its_samples(monkeypatch):
    fake_pages(monkeypatch, [measure.VoiceTurn(0.2, 0.5), measure.VoiceTurn(None, None),
                             measure.VoiceTurn(0.3, 0.7)])
    side = lines.Side(PRODUCT, [1])

    sample = await lines.voice_turns(side, "key", Observations(), sessions=1, per_session=3,
                                     chunks=["AAAA"])

    assert sample.count == 2
    assert sample.latencies == [0.5, 0.7]
    assert sample.extra == {"heard": [0.2, 0.3], "unheard": 1}


async def test_a_step_in_which_no_turn_was_heard_stops_the_line(monkeypatch):
    fake_pages(monkeypatch, [measure.VoiceTurn(None, None)] * 2)
    side = lines.Side(PRODUCT, [1])

    with pytest.raises(BenchError, match="none of 2 voice turns was heard"):
        await lines.voice_turns(side, "key", Observations(), sessions=1, per_session=2,
                                chunks=["AAAA"])
