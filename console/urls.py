from django.contrib.auth import views as auth_views
from django.urls import path

from console import views

app_name = "console"

tenant = "t/<slug:slug>/"

urlpatterns = [
    path("", views.index, name="index"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="registration/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    # POST only (Django's LogoutView refuses GET), so a link cannot sign anyone out.
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path(tenant, views.usage, name="usage"),
    path(tenant + "sessions/<str:session_id>/", views.session_detail, name="session"),
    # A visitor's id is the tenant's own string (1 to 128 printable characters, "/" too).
    path(tenant + "visitors/<path:visitor_id>/", views.visitor, name="visitor"),
    path(tenant + "keys/", views.keys, name="keys"),
    path(tenant + "keys/new/", views.key_create, name="key_create"),
    path(tenant + "keys/<int:key_id>/created/", views.key_created, name="key_created"),
    path(tenant + "keys/<int:key_id>/edit/", views.key_edit, name="key_edit"),
    path(tenant + "keys/<int:key_id>/appearance/", views.key_appearance, name="key_appearance"),
    path(tenant + "keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path(tenant + "keys/visitor-secret/rotate/", views.visitor_secret_rotate, name="visitor_secret_rotate"),
    path(tenant + "budget/", views.budget, name="budget"),
    path(tenant + "members/", views.members, name="members"),
    path(tenant + "members/<int:membership_id>/role/", views.member_role, name="member_role"),
    path(tenant + "members/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path(tenant + "invitations/<int:invitation_id>/withdraw/", views.invitation_withdraw,
         name="invitation_withdraw"),
    # The invited person's page: not a member yet, maybe not even signed in.
    path("invitation/", views.invitation, name="invitation"),
]
