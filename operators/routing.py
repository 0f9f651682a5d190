"""The staff watch socket. Authenticated by the Django session cookie: the
auth middleware wraps this consumer only (the AITP endpoint authenticates
with API keys and must never read a cookie)."""
from channels.auth import AuthMiddlewareStack
from django.urls import path

from operators.consumer import OperatorWatchConsumer

WATCH_PATH = "/ws/operators/"

websocket_urlpatterns = [
    path(WATCH_PATH.lstrip("/"), AuthMiddlewareStack(OperatorWatchConsumer.as_asgi())),
]
