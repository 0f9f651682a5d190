"""The console's session page reads conversation content through aitp.transcript,
which the admin's approval detail and the live session page share."""
from __future__ import annotations

from aitp.transcript import Block, message_blocks, pretty_json

__all__ = ["Block", "message_blocks", "pretty_json"]
