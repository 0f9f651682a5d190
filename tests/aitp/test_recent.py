"""Answers reused while fresh and asked for once by everyone who needs them
at the same moment (runtime/recent.py: the tenant's quota verdict, the watch
groups' presence)."""
from __future__ import annotations

import asyncio

import pytest

from runtime.recent import RecentAnswers


class Question:
    def __init__(self, answers=None) -> None:
        self.asked = 0
        self.release = asyncio.Event()
        self.answers = answers

    async def __call__(self):
        self.asked += 1
        await self.release.wait()
        if isinstance(self.answers, Exception):
            raise self.answers
        return f"answer {self.asked}"


async def test_a_fresh_answer_is_reused_and_a_stale_one_asked_for_again():
    fresh_for = [60.0]
    answers = RecentAnswers(lambda: fresh_for[0])
    question = Question()
    question.release.set()
    assert await answers.get("acme", question) == "answer 1"
    assert await answers.get("acme", question) == "answer 1"
    fresh_for[0] = 0.0
    assert await answers.get("acme", question) == "answer 2"
    assert await answers.get("acme", question) == "answer 3"


async def test_everyone_asking_at_the_same_moment_shares_one_asking():
    answers = RecentAnswers(lambda: 0.0)
    question = Question()
    waiting = [asyncio.ensure_future(answers.get("acme", question)) for _ in range(50)]
    await asyncio.sleep(0)
    question.release.set()
    assert await asyncio.gather(*waiting) == ["answer 1"] * 50
    assert question.asked == 1


async def test_different_keys_are_asked_for_apart():
    answers = RecentAnswers(lambda: 60.0)
    question = Question()
    question.release.set()
    assert [await answers.get(key, question) for key in ("a", "b", "a")] == [
        "answer 1", "answer 2", "answer 1"]


async def test_an_answer_learned_otherwise_is_used_without_asking():
    answers = RecentAnswers(lambda: 60.0)
    answers.learned("group", True)
    question = Question()
    assert await answers.get("group", question) is True
    assert question.asked == 0


async def test_an_error_reaches_every_waiter_and_the_next_asks_again():
    answers = RecentAnswers(lambda: 60.0)
    failing = Question(answers=ConnectionError("database gone"))
    waiting = [asyncio.ensure_future(answers.get("acme", failing)) for _ in range(3)]
    await asyncio.sleep(0)
    failing.release.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    working = Question()
    working.release.set()
    assert await answers.get("acme", working) == "answer 1"


async def test_a_waiter_that_stops_waiting_leaves_the_answer_to_the_others():
    answers = RecentAnswers(lambda: 60.0)
    question = Question()
    first = asyncio.ensure_future(answers.get("acme", question))
    second = asyncio.ensure_future(answers.get("acme", question))
    await asyncio.sleep(0)
    first.cancel()
    question.release.set()
    assert await second == "answer 1"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert question.asked == 1


async def test_past_its_limit_everything_learned_is_forgotten():
    answers = RecentAnswers(lambda: 60.0, limit=2)
    answers.learned("a", 1)
    answers.learned("b", 2)
    answers.learned("c", 3)
    question = Question()
    question.release.set()
    assert await answers.get("a", question) == "answer 1"
    assert await answers.get("c", question) == 3
