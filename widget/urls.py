from django.urls import path, re_path

from widget import views

app_name = "widget"

urlpatterns = [
    # The files of one release (named like 1.0.0), which never change: what the snippet names.
    re_path(r"^(?P<release>\d+\.\d+\.\d+)/(?P<name>[^/]+)$", views.asset, name="asset"),
    # The newest release of a major version, for pages that do not pin one.
    path("v<int:major>/<str:name>", views.latest, name="latest"),
]
