"""The documentation site as `make docs` builds it: strict (a warning fails), every page of docs/pages in it, and
nothing it loads from elsewhere (no web font, no CDN script or style sheet: it works air-gapped)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import VENV_BIN

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

ROOT = Path(__file__).parents[2]
PAGES = ROOT / "docs" / "pages"
# What a page would load from another host: a script, a style sheet, a font, an image, a frame.
REMOTE = re.compile(r"""(?:src|href)\s*=\s*["'](?:https?:)?//(?!127\.0\.0\.1|localhost)[^"']+["']""")
REMOTE_CSS = re.compile(r"""(?:@import|url\()\s*["']?(?:https?:)?//""")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([str(VENV_BIN / "mkdocs"), "build", "--strict", "-f", str(ROOT / "docs" / "mkdocs.yml"),
                           "--site-dir", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "WARNING" not in done.stderr, done.stderr[-5000:]
    return out


def test_every_page_is_built(site: Path) -> None:
    pages = sorted(PAGES.rglob("*.md"))
    assert len(pages) >= 40, pages
    missing = [p for p in pages if not (site / p.relative_to(PAGES)).with_suffix(".html").is_file()]
    assert missing == []
    for page in pages:
        assert "To be written" not in page.read_text(), f"{page} is a stub"


def test_the_site_loads_nothing_from_elsewhere(site: Path) -> None:
    offenders = {}
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css", ".js", ".svg"):
            text = path.read_text(errors="replace")
            pattern = REMOTE if path.suffix in (".html", ".svg") else REMOTE_CSS
            # Links a reader follows (<a href>) may point elsewhere; only what a page loads counts.
            found = [m for m in pattern.findall(text) if not _is_anchor(text, m)]
            if found:
                offenders[str(path.relative_to(site))] = found[:3]
    assert offenders == {}


def _is_anchor(text: str, attribute: str) -> bool:
    """Whether ``attribute`` (an href) belongs to an <a> element: a link a reader may follow, not a load."""
    at = text.find(attribute)
    tag_start = text.rfind("<", 0, at)
    return text[tag_start:tag_start + 3].lower() in ("<a ", "<a\n")


def test_the_pictures_are_self_contained_svg(site: Path) -> None:
    pictures = sorted(PAGES.rglob("*.svg"))
    assert len(pictures) >= 8, pictures
    for picture in pictures:
        text = picture.read_text()
        assert "<script" not in text and "<foreignObject" not in text, picture
        assert not re.search(r"""href\s*=\s*["'](?!#)""", text), f"{picture} refers to a file or address"
        assert "viewBox" in text, picture


def test_the_readme_fits_on_a_screen_and_points_into_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert readme.startswith("# Relay\n\n```sh\nmake run    #") and "\nmake test   #" in readme
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 20 and all((ROOT / link).is_file() for link in links), links
