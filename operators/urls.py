"""Mounted at /admin/live/ (before the admin's own urls, which would
otherwise answer 404 for it). Each view goes through the admin's login,
staff check and CSRF protection."""
from django.contrib import admin
from django.urls import path

from operators import views

app_name = "operators"

wrap = admin.site.admin_view

urlpatterns = [
    path("", wrap(views.live_list), name="live_list"),
    # Before the session pages: "alerts" would be taken for a session id.
    path("alerts/", wrap(views.live_alerts), name="live_alerts"),
    path("<str:session_id>/", wrap(views.live_session), name="live_session"),
    path("<str:session_id>/panel/", wrap(views.live_session_panel), name="live_session_panel"),
    path("<str:session_id>/command/", wrap(views.live_session_command),
         name="live_session_command"),
    path("<str:session_id>/takeover/", wrap(views.live_session_take_over), name="live_session_take_over"),
    path("<str:session_id>/say/", wrap(views.live_session_say), name="live_session_say"),
    path("<str:session_id>/tool/", wrap(views.live_session_run_tool), name="live_session_run_tool"),
    path("<str:session_id>/handback/", wrap(views.live_session_hand_back), name="live_session_hand_back"),
    path("<str:session_id>/approvals/<int:approval_id>/decide/",
         wrap(views.live_approval_decide), name="live_approval_decide"),
]
