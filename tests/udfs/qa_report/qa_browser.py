"""Open QA pages in headless Chromium (Debian's package, driven by playwright; no browser download)."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass, field

import numpy as np
import pytest

VIEWS = ("#camera", "#world", "#timeline")
# Software WebGL for plotly's 3-D view in a headless browser without a GPU.
_ARGS = ["--no-sandbox", "--enable-unsafe-swiftshader", "--use-angle=swiftshader"]


@dataclass
class PageCheck:
    """What a page showed: console errors, per-view grey screenshots before and after moving the cursor."""

    errors: list[str] = field(default_factory=list)
    before: dict[str, np.ndarray] = field(default_factory=dict)
    after: dict[str, np.ndarray] = field(default_factory=dict)
    index_rows: int = 0


def chromium() -> str:
    """Path of the chromium binary, or skip."""
    pytest.importorskip("playwright")
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium not installed (make setup installs Debian's chromium)")
    return path


def _grey(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("L"), np.float64)


def _url(page: str) -> str:
    return page if "://" in page else f"file://{page}"


def check_pages(
    episode_page: str, index_page: str | None, move_to: int, headers: dict[str, str] | None = None
) -> PageCheck:
    """Load the episode page, screenshot each view, move the frame cursor to `move_to`, screenshot again.

    Pages are file paths or URLs (`egolake serve`); `headers` go with every request (a bearer token).
    """
    from playwright.sync_api import sync_playwright

    result = PageCheck()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1300}, extra_http_headers=headers)
            page.on("console", lambda m: result.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: result.errors.append(str(e)))
            page.goto(_url(episode_page))
            page.wait_for_function("document.body.dataset.frame === '0'", timeout=120_000)
            result.before = {v: _grey(page.locator(v).screenshot()) for v in VIEWS}
            page.locator("#slider").focus()
            for _ in range(move_to):  # the keyboard moves the cursor like a user does
                page.keyboard.press("ArrowRight")
            page.wait_for_function(f"document.body.dataset.frame === '{move_to}'", timeout=60_000)
            page.wait_for_timeout(300)
            result.after = {v: _grey(page.locator(v).screenshot()) for v in VIEWS}
            if index_page is not None:
                page.goto(_url(index_page))
                result.index_rows = page.locator("#episodes tr").count() - 1
        finally:
            browser.close()
    return result


def changed_pixels(a: np.ndarray, b: np.ndarray) -> int:
    """Pixels whose grey level differs by more than 8 (screenshots of one element, same size)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return int((np.abs(a - b) > 8).sum())
