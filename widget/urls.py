from django.urls import path, re_path

from widget import views

app_name = "widget"

urlpatterns = [
    # How a key's widget looks and speaks (?key=<publishable key>), for the widget as it starts.
    path("appearance", views.appearance, name="appearance"),
    # The files of one release (named like 1.0.0), which never change: what the snippet names.
    re_path(r"^(?P<release>\d+\.\d+\.\d+)/(?P<name>[^/]+)$", views.asset, name="asset"),
    # The newest release of a major version, for pages that do not pin one.
    path("v<int:major>/<str:name>", views.latest, name="latest"),
]
