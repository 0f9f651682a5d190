from django.conf import settings
from django.urls import path

from aitp.consumer import AitpConsumer
from operators.routing import websocket_urlpatterns as operator_websocket_urlpatterns

websocket_urlpatterns = [
    path(settings.OWLLAYER_WS_PATH.lstrip("/"), AitpConsumer.as_asgi()),
    *operator_websocket_urlpatterns,
]
