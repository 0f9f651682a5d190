from django.urls import path

from demo import views

app_name = "demo"

urlpatterns = [
    path("", views.store_page, {"route": "product"}, name="product"),
    path("cart/", views.store_page, {"route": "cart"}, name="cart"),
    path("assets/<str:name>", views.asset, name="asset"),
]
