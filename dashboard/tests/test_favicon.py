"""The site's icon: at /favicon.ico, where browsers ask whatever the page links, and linked."""

from __future__ import annotations

from django.test import Client


def test_favicon_ico_is_an_icon(db):
    answered = Client().get("/favicon.ico")

    assert answered.status_code == 200
    assert answered["Content-Type"] == "image/x-icon"
    body = answered.content
    assert body[:4] == b"\x00\x00\x01\x00"  # the ICO header: reserved 0, type 1 (icon)
    assert int.from_bytes(body[4:6], "little") >= 2  # several sizes
    assert "max-age=86400" in answered["Cache-Control"]


def test_every_page_links_the_icon(db):
    page = Client().get("/login/").content.decode()

    assert 'rel="icon" href="/favicon.ico"' in page
    assert "favicon.svg" in page
