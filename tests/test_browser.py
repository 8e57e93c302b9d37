"""tests/browser.py in a real headless Chromium: a clean page reads clean, and each kind of fault is caught."""
from __future__ import annotations

import base64
import struct
import zlib

import pytest

from tests.browser import needs_chromium, open_page

pytestmark = needs_chromium


def _png(width: int, height: int) -> bytes:
    """A valid RGB PNG of width x height, a red-green gradient."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + b"".join(bytes((255 * x // width, 255 * y // height, 96)) for x in range(width))
                    for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def _page(tmp_path, body: str, title: str = "A report"):
    path = tmp_path / "report.html"
    path.write_text(f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>'
                    f"<body>{body}</body></html>")
    return path


def _clean_body() -> str:
    image = base64.b64encode(_png(8, 6)).decode()
    return ('<h1>Study</h1><h2>In short</h2><p>The keys grew.</p>'
            f'<img alt="keys" src="data:image/png;base64,{image}"><script>document.title += "";</script>')


def test_a_clean_self_contained_page_reads_clean(tmp_path):
    page = open_page(_page(tmp_path, _clean_body()))
    assert page.console_errors == []
    assert page.failed == []
    assert page.outside == []
    assert page.requests[0] == (tmp_path / "report.html").as_uri()
    assert len(page.images) == 1 and page.images[0][0].startswith("data:image/png;base64,") and page.images[0][1]
    assert page.scripts == 1
    assert page.text_visible and 0 < page.text_top < 200
    assert page.title == "A report"


def test_the_text_below_2000px_of_content_is_not_visible(tmp_path):
    page = open_page(_page(tmp_path, '<div style="height: 2000px">tall</div><h2>In short</h2>'))
    assert page.text_top is not None and page.text_top >= 2000
    assert not page.text_visible
    assert open_page(_page(tmp_path, "<h2>Elsewhere</h2>")).text_top is None


def test_a_broken_image_is_not_decoded_and_its_request_failed(tmp_path):
    page = open_page(_page(tmp_path, '<h2>In short</h2><img src="missing.png">'))
    assert page.images == [("missing.png", False)]
    assert (tmp_path / "missing.png").as_uri() in page.failed
    assert page.outside == [(tmp_path / "missing.png").as_uri()]


def test_an_image_from_the_web_is_outside_and_never_fetched(tmp_path):
    page = open_page(_page(tmp_path, '<h2>In short</h2><img src="http://example.invalid/x.png">'))
    assert page.outside == ["http://example.invalid/x.png"]
    assert page.failed == ["http://example.invalid/x.png"]  # blocked inside the browser
    assert page.images == [("http://example.invalid/x.png", False)]


@pytest.mark.parametrize("script, expected", [('console.error("boom")', "boom"),
                                              ('throw new Error("bang")', "bang")])
def test_console_errors_and_uncaught_exceptions_are_caught(tmp_path, script, expected):
    page = open_page(_page(tmp_path, f"<h2>In short</h2><script>{script}</script>"))
    assert len(page.console_errors) == 1 and expected in page.console_errors[0], page.console_errors
    assert page.scripts == 1


def test_the_screenshot_is_a_png_of_the_viewport(tmp_path):
    shot = tmp_path / "shot.png"
    page = open_page(_page(tmp_path, _clean_body()), screenshot=shot)
    assert _png_size(shot.read_bytes()) == (1280, 800)
    assert page.text_visible
    small = tmp_path / "small.png"
    open_page(_page(tmp_path, _clean_body()), width=400, height=300, screenshot=small)
    assert _png_size(small.read_bytes()) == (400, 300)


def test_a_page_that_never_loads_is_a_timeout_not_a_hang(tmp_path):
    with pytest.raises(RuntimeError, match="timed out waiting for Page.loadEventFired"):
        open_page(_page(tmp_path, "<h2>In short</h2><script>for (;;) {}</script>"), timeout_s=2)


def test_a_chromium_that_exits_at_once_is_an_error_with_its_stderr(tmp_path, monkeypatch):
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\necho 'cannot open display: none here' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("QK_CHROMIUM", str(fake))
    with pytest.raises(RuntimeError, match=r"(?s)Chromium exited.*exit status 3.*cannot open display: none here"):
        open_page(_page(tmp_path, "<h2>In short</h2>"), timeout_s=20)
