from django.urls import path

from aitp import history, views
from runtime.config import config

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    # Beside the AITP endpoint: a page reads its conversation again there.
    path((config().protocol.ws_path.strip("/") + "/conversation").lstrip("/"), history.conversation,
         name="conversation"),
]
