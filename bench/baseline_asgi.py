"""ASGI entry point of the baseline: ``daphne bench.baseline_asgi:application``.

A separate application so the product's routing stays untouched. It loads
the product's settings only for the channel layer: the baseline consumer
gets the same layer (in-memory or Redis) as the product's.
"""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "owllayer_site.settings")

import django

django.setup(set_prefix=False)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import path  # noqa: E402

from bench.baseline import BaselineConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "websocket": URLRouter(
            [path(settings.OWLLAYER_WS_PATH.lstrip("/"), BaselineConsumer.as_asgi())]
        ),
    }
)
