import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "owllayer_site.settings")

from django.core.asgi import get_asgi_application

# Django must be set up before any consumer (and its models) is imported.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from owllayer_site import daphne_close  # noqa: E402
from owllayer_site.routing import websocket_urlpatterns  # noqa: E402

daphne_close.install()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # No AllowedHostsOriginValidator here: each API key carries its own
        # allowed origins, and a refusal must be an AITP error frame + 1008,
        # never an HTTP 403 the browser would retry forever.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
