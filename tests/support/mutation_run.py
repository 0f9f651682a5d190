"""Loaded first by mutmut's pytest runs (setup.cfg, ``pytest_add_cli_args``):
the speech engines are checked once, before any test.

A process's first handshake waits for that check (speaking and hearing a
word in a speech worker) to know whether to offer "audio". mutmut runs the
tests of every mutant in a process forked from one that ran pytest first:
checked there, the answer is inherited, and no mutant's run waits for it
(under the mutants' trampolines on a busy machine, longer than a page waits
for its HANDSHAKE_ACK). The pool is stopped after the check, so that no
fork copies its threads; the tests of the mutation selection run no speech
job themselves.
"""
from __future__ import annotations


def pytest_configure(config) -> None:
    import speech
    from speech import jobs

    speech.audio_problems()  # remembered for the process; at once when known
    jobs.shutdown()
