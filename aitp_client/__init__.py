"""The project's own AITP client: tests, benchmarks and the terminal chat use it."""
from aitp_client.client import PROTOCOL_VERSION, SDK_VERSION, AitpClient
from aitp_client.errors import AitpClosed, AitpError, AitpProtocolError, AitpRefused, AitpUpgradeRefused
from aitp_client.frames import envelope, final_text, new_message_id, streamed_text, system_event, turn_done
from aitp_client.validate import InvalidFrame, check_frame, frame_problems

__all__ = [
    "PROTOCOL_VERSION",
    "SDK_VERSION",
    "AitpClient",
    "AitpClosed",
    "AitpError",
    "AitpProtocolError",
    "AitpRefused",
    "AitpUpgradeRefused",
    "InvalidFrame",
    "check_frame",
    "envelope",
    "final_text",
    "frame_problems",
    "new_message_id",
    "streamed_text",
    "system_event",
    "turn_done",
]
