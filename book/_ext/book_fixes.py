"""Small Sphinx fixes for an offline, error-free book.

* Drop sphinx-thebe's scripts: the book has no live-code button, and the theme registers
  them twice (a console error, "THEBE_JS_URL has already been declared") and they name a CDN.
* Start pages in light mode (the theme otherwise logs "invalid theme mode").
* Drop Font Awesome's JavaScript kit (1.5 MB on every page): the theme's CSS already draws every icon
  from the Font Awesome web fonts, so the kit only repeats them as SVG.
* Images load lazily (``loading="lazy"``): a figure far down a chapter is fetched when the reader gets
  there; each carries its size (``width``/``height`` from the PNG), so nothing shifts when it arrives.
* Every external script is deferred (parsed after the page, in order), except
  ``documentation_options.js``, which inline scripts of the page use at once; a script included twice
  is included once.
* Bibliography entries are list items (``role="listitem"`` in docutils' ``role="list"``), not the
  deprecated ``doc-biblioentry`` role, which accessibility checkers (Lighthouse) flag.
* Load ``_static/attnid.css`` (code size, table overflow, figures in dark mode) and ``_static/attnid.js``
  (the sidebar buttons work on a phone).
"""

import re
from pathlib import Path


def _page_context(app, pagename, templatename, context, doctree):
    context["default_mode"] = "light"
    scripts = context.get("script_files")
    if scripts is None:
        return
    keep = []
    for s in scripts:
        name = str(getattr(s, "filename", s) or "")
        body = str(getattr(s, "attributes", {}).get("body", ""))
        if "thebe" in name or "THEBE_JS_URL" in body:
            continue
        keep.append(s)
    scripts[:] = keep


FONTAWESOME_JS = re.compile(r'\s*<script defer src="[^"]*_static/scripts/fontawesome\.js[^"]*"></script>')


LAZY_IMG = re.compile(r"<img (?![^>]*\bloading=)")
SCRIPT_SRC = re.compile(r'<script(?P<attrs>[^>]*?)\ssrc="(?P<src>[^"]+)"(?P<rest>[^>]*)></script>')
IMG_SRC = re.compile(r'<img (?P<attrs>[^>]*?)src="(?P<src>[^"]*_images/[^"]+\.png)"')  # the figures
BIBLIOENTRY = 'role="doc-biblioentry"'  # deprecated in WAI-ARIA 1.3; the citation list's items are list items
KEEP_SYNC = ("documentation_options.js",)  # inline scripts of every page read DOCUMENTATION_OPTIONS at once


def _deferred_scripts(text: str) -> str:
    """Every ``<script src>`` deferred unless it already is (or is async, or in KEEP_SYNC); repeats dropped."""
    seen: set[str] = set()

    def fix(m: re.Match) -> str:
        src, attrs = m["src"], m["attrs"] + m["rest"]
        if src in seen:
            return ""
        seen.add(src)
        if "defer" in attrs or "async" in attrs or any(k in src for k in KEEP_SYNC):
            return m[0]
        return f'<script defer{m["attrs"]} src="{src}"{m["rest"]}></script>'

    return SCRIPT_SRC.sub(fix, text)


def _png_size(path: Path) -> tuple[int, int] | None:
    head = path.read_bytes()[:24] if path.is_file() else b""
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _sized_images(text: str, page: Path) -> str:
    """Every PNG ``<img>`` given its ``width`` and ``height`` (the CSS keeps it within the column)."""

    def fix(m: re.Match) -> str:
        size = _png_size((page.parent / m["src"]).resolve())
        if size is None or "width=" in m["attrs"]:
            return m[0]
        return f'<img width="{size[0]}" height="{size[1]}" {m["attrs"]}src="{m["src"]}"'

    return IMG_SRC.sub(fix, text)


def _lighter_pages(app, exception):
    """After an HTML build: remove the Font Awesome kit's script tag from every page (and the kit itself),
    defer the scripts, size every image and let it load lazily, and make bibliography entries list items."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        kept = _deferred_scripts(FONTAWESOME_JS.sub("", text))
        kept = LAZY_IMG.sub('<img loading="lazy" ', _sized_images(kept, page))
        kept = kept.replace(BIBLIOENTRY, 'role="listitem"')
        if kept != text:
            page.write_text(kept, encoding="utf-8")
    for f in (out / "_static" / "scripts").glob("fontawesome.js*"):
        f.unlink()


def setup(app):
    app.connect("html-page-context", _page_context, priority=900)
    app.connect("build-finished", _lighter_pages)
    app.add_css_file("attnid.css")
    app.add_js_file("attnid.js")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
