"""The demo store's cart arithmetic (pure: no Django, no browser)."""
from __future__ import annotations

import pytest

from demo.catalog import MAX_QUANTITY, Cart, CartError, cents_of


def cart_with(**items: int) -> Cart:
    cart = Cart()
    for slug, quantity in items.items():
        cart.add(slug.replace("_", "-"), quantity)
    return cart


def test_two_headphones_cost_twice_their_price():
    cart = cart_with(pro_headphones=2)
    assert cart.total_cents == 29998
    assert cart.summary()["total"] == 299.98
    assert cart.count == 2


def test_adding_the_same_product_again_adds_to_its_line():
    cart = cart_with(pro_headphones=1)
    cart.add("pro-headphones", 2)
    assert cart.items == {"pro-headphones": 3}


@pytest.mark.parametrize("quantity", [0, -1, 2.5, "2", True, None, MAX_QUANTITY + 1])
def test_a_quantity_that_is_not_a_whole_number_in_range_is_refused(quantity):
    with pytest.raises(CartError, match="quantity"):
        Cart().add("pro-headphones", quantity)


def test_a_whole_float_quantity_counts_as_that_number():
    assert cart_with(pro_headphones=2.0).items == {"pro-headphones": 2}


def test_an_unknown_product_is_refused_by_name():
    with pytest.raises(CartError, match="no product 'banana'"):
        Cart().add("banana", 1)


def test_setting_a_quantity_to_zero_removes_the_line():
    cart = cart_with(pro_headphones=2, travel_speaker=1)
    cart.set_quantity("pro-headphones", 0)
    assert cart.items == {"travel-speaker": 1}


def test_a_percent_coupon_takes_its_share_rounded_to_the_cent():
    cart = cart_with(pro_headphones=2)
    cart.apply_coupon(" owl10 ")
    assert cart.discount_cents == 3000  # 10% of 299.98, rounded half up
    assert cart.total_cents == 26998


def test_a_fixed_coupon_never_takes_more_than_the_subtotal():
    cart = cart_with(charging_dock=1)
    cart.apply_coupon("WELCOME5")
    assert cart.total_cents == 3450
    cart.set_quantity("charging-dock", 0)
    assert cart.total_cents == 0


def test_an_unknown_coupon_or_an_empty_cart_is_refused():
    with pytest.raises(CartError, match="no coupon called 'FREE'"):
        cart_with(pro_headphones=1).apply_coupon("FREE")
    with pytest.raises(CartError, match="empty"):
        Cart().apply_coupon("OWL10")


def test_paying_the_exact_total_empties_the_cart_and_returns_the_order():
    cart = cart_with(pro_headphones=2)
    order = cart.pay(299.98, order_id="ord_1")
    assert order["amount"] == 299.98
    assert order["items"][0]["quantity"] == 2
    assert cart.items == {} and cart.coupon is None


@pytest.mark.parametrize("amount", [299.97, 300, 29998, 0])
def test_paying_any_other_amount_is_refused_and_keeps_the_cart(amount):
    cart = cart_with(pro_headphones=2)
    with pytest.raises(CartError, match="does not match the cart total"):
        cart.pay(amount, order_id="ord_1")
    assert cart.items == {"pro-headphones": 2}


def test_paying_for_an_empty_cart_is_refused():
    with pytest.raises(CartError, match="nothing to pay"):
        Cart().pay(0, order_id="ord_1")


@pytest.mark.parametrize("amount, cents", [(299.98, 29998), (0.1, 10), (7, 700), (1e2, 10000)])
def test_amounts_become_exact_cents(amount, cents):
    assert cents_of(amount) == cents


@pytest.mark.parametrize("amount", ["299.98", None, True, 1.234, float("nan"), float("inf")])
def test_an_amount_that_is_not_dollars_and_cents_is_refused(amount):
    with pytest.raises(CartError):
        cents_of(amount)


def test_a_damaged_or_stale_saved_cart_loads_as_what_is_still_valid():
    saved = {"items": {"pro-headphones": 2, "gone-product": 1, "travel-speaker": "x"},
             "coupon": "EXPIRED"}
    cart = Cart.from_data(saved)
    assert cart.items == {"pro-headphones": 2}
    assert cart.coupon is None
    assert Cart.from_data("garbage").items == {}
