"""The page's audio as the protocol carries it: what the session machine checks and the watch feed relays.

  base.py     Audio, and the interfaces a speech engine speaks (SpeechToText,
              TextToSpeech, Transcription, SpeechError and its codes)
  audio.py    mime types, WAV, soxr resampling, the agent's AUDIO_STREAM chunks
  inbound.py  checking the page's audio (AUDIO_STREAM chunks, USER_INPUT audio)

Pure: no Django, no asyncio, no engine. The speech engines, their pool of
worker processes and the pieces of a voice turn (the utterance, end of
speech, sentences to speak) live above this app, in speech/.
"""
