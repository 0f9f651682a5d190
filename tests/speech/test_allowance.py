"""One API key's share of the speech workers (speech.allowance). Pure: the clock is an argument."""
from __future__ import annotations

from speech.allowance import JOBS_LIMIT, SECONDS_LIMIT, KeyLimits, SpeechAllowance


def test_a_key_may_have_as_many_jobs_at_once_as_its_limit_and_one_more_after_one_ends():
    allowance = SpeechAllowance(KeyLimits(jobs_at_once=2))
    for _ in range(2):
        assert allowance.refusal("key", 0, now=0) is None
        allowance.take("key", 0, now=0)
    refused = allowance.refusal("key", 0, now=0)
    assert (refused.code, refused.data) == ("speech_rate_limited", {"limit": JOBS_LIMIT})
    assert allowance.refusal("other", 0, now=0) is None
    allowance.release("key")
    assert allowance.refusal("key", 0, now=0) is None


def test_a_key_may_have_its_seconds_of_speech_heard_per_minute_and_no_more():
    allowance = SpeechAllowance(KeyLimits(seconds_per_minute=10))
    allowance.take("key", 4, now=0)
    allowance.release("key")
    allowance.take("key", 5, now=20)
    allowance.release("key")
    refused = allowance.refusal("key", 2, now=30)
    assert refused.code == "speech_rate_limited"
    # The first 4 s leave the minute at 60 s: then 2 s more fit.
    assert refused.data == {"limit": SECONDS_LIMIT, "retryAfterMs": 30_000}
    assert allowance.refusal("key", 1, now=30) is None
    assert allowance.refusal("key", 2, now=60) is None
    assert allowance.refusal("other", 9, now=30) is None


def test_an_utterance_longer_than_a_whole_minutes_allowance_is_refused_and_told_to_come_back_shorter():
    allowance = SpeechAllowance(KeyLimits(seconds_per_minute=10))
    refused = allowance.refusal("key", 12, now=0)
    assert refused.data == {"limit": SECONDS_LIMIT, "retryAfterMs": 60_000}


def test_a_limit_of_zero_and_a_job_of_no_key_are_never_refused():
    off = SpeechAllowance(KeyLimits(jobs_at_once=0, seconds_per_minute=0))
    for _ in range(100):
        off.take("key", 30, now=0)
    assert off.refusal("key", 30, now=0) is None
    tight = SpeechAllowance(KeyLimits(jobs_at_once=1, seconds_per_minute=1))
    tight.take(None, 30, now=0)
    assert tight.refusal(None, 30, now=0) is None


def test_a_synthesis_counts_as_a_job_but_not_as_speech_heard():
    allowance = SpeechAllowance(KeyLimits(jobs_at_once=5, seconds_per_minute=1))
    allowance.take("key", 0, now=0)
    assert allowance.jobs("key") == 1
    assert allowance.refusal("key", 1, now=0) is None
