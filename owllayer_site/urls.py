from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    # Before the admin: its catch-all would answer 404 for these.
    path("admin/live/", include("operators.urls")),
    path("admin/", admin.site.urls),
    path("console/", include("console.urls")),
    # The drop-in widget, for tenants' pages on any origin (docs/widget.md).
    path("widget/", include("widget.urls")),
    path("", include("aitp.urls")),
    path("demo/", include("demo.urls")),
    path("", RedirectView.as_view(pattern_name="demo:home", query_string=True)),
]
