from __future__ import annotations

import os
import re
import threading
import uuid

from runtime import ids


def test_random_ids_have_the_shapes_of_their_secrets_and_uuid_counterparts():
    assert re.fullmatch(r"[0-9a-f]{24}", ids.token_hex(12))
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", ids.token_urlsafe(16))
    value = ids.uuid4()
    assert value.version == 4 and value.variant == uuid.RFC_4122
    assert len(ids.token_hex(ids.BLOCK + 1)) == 2 * (ids.BLOCK + 1)


def test_no_two_ids_share_their_bytes_across_blocks_and_threads():
    drawn: list[str] = []

    def draw() -> None:
        mine = [ids.token_hex(12) for _ in range(2000)]  # several blocks each
        drawn.extend(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(drawn) == 8000
    assert len(set(drawn)) == len(drawn)


def test_a_forked_child_never_hands_out_the_bytes_its_parent_will():
    ids.token_hex(16)  # the parent holds a block with unread bytes
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.write(writer, bytes.fromhex(ids.token_hex(16)))
        finally:
            os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    in_child = os.read(reader, 16)
    os.close(reader)

    assert len(in_child) == 16
    assert in_child != bytes.fromhex(ids.token_hex(16))
