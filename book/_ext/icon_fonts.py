"""Icon fonts cut down to the icons the book shows.

The theme ships Font Awesome whole: 0.3 MB of web fonts (solid and brands) that a page fetches as soon as
it draws its first icon, and the CSS rule of every one of its 1,900 icons inside the stylesheet that every
page waits for. The book shows about twenty. After an HTML build this keeps, in the fonts and in the
stylesheet, the icons that a page or a script names (``fa-…`` classes) and those the theme's CSS draws
itself (admonitions, links); every font keeps its name, so nothing else changes.
"""

import re
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTFont

THEME_CSS = "styles/pydata-sphinx-theme.css"
FONTS = "vendor/fontawesome/webfonts"
ICON_RULE = re.compile(r'(?P<sel>(?:\.fa-[a-z0-9-]+:(?:before|after),?)+)\{content:"(?P<content>[^"]*)"\}')
ICON_CLASS = re.compile(r"\bfa-[a-z0-9-]+")
ESCAPE = re.compile(r"\\([0-9a-fA-F]{1,6})")


def _codepoints(content: str) -> set[int]:
    """The characters of a CSS string: ``\\f0c9`` escapes and literal characters."""
    return {int(h, 16) for h in ESCAPE.findall(content)} | {ord(c) for c in ESCAPE.sub("", content)}


def icons_used(static: Path, pages: list[Path]) -> set[str]:
    """The ``fa-…`` class names in the pages and in the scripts under ``static``."""
    names: set[str] = set()
    for f in [*pages, *static.rglob("*.js")]:
        names |= set(ICON_CLASS.findall(f.read_text(encoding="utf-8", errors="ignore")))
    return names


def trimmed_css(css: str, used: set[str]) -> tuple[str, set[int]]:
    """``css`` without the icon rules of icons not in ``used``, and the codepoints it still draws: those of
    the rules kept and every private-use character outside the icon rules (the theme's own icons)."""
    kept: set[int] = set()

    def keep(m: re.Match) -> str:
        if not {s.split(":")[0][1:] for s in m["sel"].split(",")} & used:
            return ""
        kept.update(_codepoints(m["content"]))
        return m[0]

    out = ICON_RULE.sub(keep, css)
    rest = ICON_RULE.sub("", out)
    kept |= {ord(c) for c in rest if 0xE000 <= ord(c) <= 0xF8FF}
    kept |= {cp for cp in (int(h, 16) for h in ESCAPE.findall(rest)) if 0xE000 <= cp <= 0xF8FF}
    return out, kept


def subset_font(path: Path, codepoints: set[int]) -> None:
    """Rewrite the font at ``path`` keeping only the glyphs of ``codepoints`` (same format, same name)."""
    font = TTFont(path)
    opts = subset.Options()
    opts.flavor = font.flavor  # woff2 stays woff2
    opts.layout_features = ["*"]
    opts.name_IDs = ["*"]
    opts.notdef_outline = True
    sub = subset.Subsetter(opts)
    sub.populate(unicodes=codepoints & set(font.getBestCmap()))
    sub.subset(font)
    font.save(path)


def _trim_icon_fonts(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    css_path = static / THEME_CSS
    if not css_path.is_file():  # another theme
        return
    css, codepoints = trimmed_css(
        css_path.read_text(encoding="utf-8"), icons_used(static, list(Path(app.outdir).rglob("*.html")))
    )
    css_path.write_text(css, encoding="utf-8")
    for font in (static / FONTS).glob("*"):
        if font.suffix in (".woff2", ".ttf"):
            subset_font(font, codepoints)


def setup(app):
    app.connect("build-finished", _trim_icon_fonts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
