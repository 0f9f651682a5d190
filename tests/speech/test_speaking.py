"""Sentences go to text to speech as soon as they are complete; a barge-in cuts at what was heard."""
from __future__ import annotations

import base64

from aitp.voice.audio import AGENT_MIME, AGENT_RATE, agent_chunks, agent_payload
from aitp.voice.base import Audio
from speech.speaking import MAX_SENTENCE_CHARS, SentenceSplitter, SpokenProgress, speakable


def texts(sentences) -> list[str]:
    return [sentence.text for sentence in sentences]


def test_the_first_sentence_is_handed_out_while_the_model_is_still_writing():
    splitter = SentenceSplitter()
    assert splitter.feed("Your headphones are in") == []
    assert texts(splitter.feed(" the cart. The total")) == ["Your headphones are in the cart."]
    assert splitter.feed(" is 299.98 dollars") == []
    assert splitter.flush().text == "The total is 299.98 dollars"


def test_a_full_stop_is_only_an_end_once_the_next_character_shows_it():
    splitter = SentenceSplitter()
    assert splitter.feed("It costs 149.") == []
    assert texts(splitter.feed("99 each. Next")) == ["It costs 149.99 each."]


def test_abbreviations_and_initials_do_not_end_a_sentence_but_numbers_do():
    splitter = SentenceSplitter()
    sentences = splitter.feed("Ask Dr. Jones, e.g. by mail, or J. Smith. I added 2. Then ")
    assert texts(sentences) == ["Ask Dr. Jones, e.g. by mail, or J. Smith.", "I added 2."]


def test_questions_exclamations_and_closing_quotes_end_sentences():
    splitter = SentenceSplitter()
    sentences = splitter.feed('Really? Yes! He said "done." Then ')
    assert texts(sentences) == ["Really?", "Yes!", 'He said "done."']


def test_a_blank_line_or_a_list_item_ends_a_sentence():
    splitter = SentenceSplitter()
    sentences = splitter.feed("Here is what I found\n\n- **Pro Headphones** for 149\n- Speakers\n")
    assert texts(sentences) == ["Here is what I found", "Pro Headphones for 149"]
    assert splitter.flush().text == "Speakers"


def test_a_run_on_sentence_is_split_at_a_pause_so_speech_starts_early():
    splitter = SentenceSplitter()
    run_on = "word " * 30 + "and then, " + "more " * 60
    sentences = splitter.feed(run_on)
    assert sentences, "a sentence longer than the bound must be handed out"
    assert sentences[0].text.endswith("and then,")
    assert all(sentence.end - sentence.start <= MAX_SENTENCE_CHARS for sentence in sentences)


def test_each_sentence_knows_where_it_sits_in_the_agents_text():
    splitter = SentenceSplitter()
    text = "First one. Second **bold** one! Third"
    sentences = [*splitter.feed(text), splitter.flush()]
    assert [text[s.start:s.end].strip() for s in sentences] == [
        "First one.", "Second **bold** one!", "Third"]
    assert texts(sentences) == ["First one.", "Second bold one!", "Third"]


def test_nothing_speakable_is_not_handed_out():
    splitter = SentenceSplitter()
    assert splitter.feed("--- \n\n") == []
    assert splitter.flush() is None


def test_speakable_reads_links_by_their_words_and_drops_markdown_marks():
    assert speakable("See [the cart](https://shop.example/cart) or `checkout`") == "See the cart or checkout"
    assert speakable("## Total\n> **299.98**") == "Total 299.98"


def test_a_cut_point_before_any_audio_went_out_is_the_start():
    progress = SpokenProgress()
    splitter = SentenceSplitter()
    for sentence in splitter.feed("One two three. Four five six. "):
        progress.queue(sentence, 1000)
    assert progress.cut(splitter.text) == 0
    assert progress.spoken_text(splitter.text) == ""


def test_the_cut_point_covers_whole_sentences_sent_and_the_words_heard_of_the_current_one():
    text = "One two three. Four five six seven eight. Nine."
    splitter = SentenceSplitter()
    progress = SpokenProgress()
    for sentence in splitter.feed(text):
        progress.queue(sentence, 1000)
    progress.sent(1000)  # the whole first sentence
    assert progress.spoken_text(text) == "One two three."
    progress.sent(500)  # half of the second
    heard = progress.spoken_text(text)
    assert heard.startswith("One two three. Four")
    assert not heard.endswith("eight.")
    assert heard.split()[-1] in ("Four", "five", "six", "seven"), "the cut falls between words"
    progress.sent(500)
    assert progress.spoken_text(text) == "One two three. Four five six seven eight."


def test_more_audio_sent_than_queued_is_our_bug():
    progress = SpokenProgress()
    try:
        progress.sent(10)
    except ValueError:
        return
    raise AssertionError("sending unqueued audio must raise")


def test_agent_voice_is_cut_into_quarter_second_frames_of_24_khz_pcm():
    one_second = Audio(b"\1\0" * AGENT_RATE, AGENT_RATE)
    chunks = agent_chunks(one_second)
    assert [len(chunk) for chunk in chunks] == [12000, 12000, 12000, 12000]
    payload = agent_payload(chunks[0])
    assert payload["mimeType"] == AGENT_MIME == "audio/pcm;rate=24000"
    assert base64.b64decode(payload["data"]) == chunks[0]


def test_agent_voice_at_another_rate_is_resampled_to_24_khz_before_it_is_cut():
    half_second_16k = Audio(b"\0\0" * 8000, 16000)
    chunks = agent_chunks(half_second_16k)
    assert sum(len(chunk) for chunk in chunks) == AGENT_RATE  # 0.5 s x 24 kHz x 2 bytes
    assert all(len(chunk) % 2 == 0 for chunk in chunks)
