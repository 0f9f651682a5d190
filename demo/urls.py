from django.urls import path

from demo import views

app_name = "demo"

urlpatterns = [
    path("", views.home, name="home"),
    path("products/<slug:slug>/", views.product_page, name="product"),
    path("cart/", views.cart_page, name="cart"),
    path("api/cart/<slug:action>", views.cart_api, name="api"),
]
