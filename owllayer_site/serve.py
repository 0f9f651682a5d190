"""Serve OwlLayer with daphne, with the WebSocket frame ceiling taken from settings.

    python -m owllayer_site.serve [--bind 127.0.0.1] [--port 8000] [daphne options...]

daphne closes a connection with 1009 on a frame over its own limit, and the
deployed client answers 1009 by reconnecting and resending the same frame.
So daphne's ceiling sits well above OWLLAYER_MAX_MESSAGE_BYTES: a frame over
our limit but under the ceiling gets a readable ``too_large`` error event and
the connection stays; only absurd frames hit the ceiling.
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "owllayer_site.settings")
    import django
    from django.conf import settings

    django.setup()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", "-b", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", "-p", type=int, default=int(os.environ.get("PORT", "8000")))
    args, extra = parser.parse_known_args(argv)
    # Rows left open by a process that died (this one's previous run, say).
    from django.core.management import call_command

    call_command("sweep")
    ceiling = str(settings.OWLLAYER_WS_FRAME_CEILING_BYTES)
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(
        [
            "-b", args.bind,
            "-p", str(args.port),
            "--websocket-max-message-size", ceiling,
            "--websocket-max-frame-size", ceiling,
            *extra,
            "owllayer_site.asgi:application",
        ]
    )


if __name__ == "__main__":
    main(sys.argv[1:])
