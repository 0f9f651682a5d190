from django.conf import settings
from django.urls import path

from aitp.consumer import AitpConsumer

websocket_urlpatterns = [
    path(settings.OWLLAYER_WS_PATH.lstrip("/"), AitpConsumer.as_asgi()),
]
