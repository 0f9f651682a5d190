#!/usr/bin/env python
"""Django's command line for OwlLayer Server.

A start-up failure a newcomer can fix (settings that cannot be used, a
database or Redis that does not answer) is one paragraph naming the setting,
not a traceback; ``--traceback`` shows the traceback (owllayer_site/startup_errors.py).
"""
import logging
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "owllayer_site.settings")
    from django.conf import settings
    from django.core.management import execute_from_command_line

    from owllayer_site import startup_errors

    # A database that does not answer is reported once, below, with the
    # driver's reason: not as a warning per attempt of the connection pool.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    try:
        # Loaded here, so that unusable settings are reported before Django's
        # command machinery turns them into a traceback.
        _ = settings.INSTALLED_APPS
        execute_from_command_line(sys.argv)
    except Exception as exc:
        if startup_errors.wants_traceback(sys.argv):
            raise
        message = startup_errors.explain(exc)
        if message is None:
            raise
        print(f"manage.py: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
