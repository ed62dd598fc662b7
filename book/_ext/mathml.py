"""Math as MathML, written when the book is built: no MathJax, nothing typeset in the reader's browser.

Every ``$…$`` and ``$$…$$`` of the book (and of the Markdown that chapters compute) becomes a ``<math>``
element (``latex2mathml``), which every current browser draws itself (MathML Core). A page then loads no
math script, shows its math with its first paint, and does not move when math is typeset. The equation
numbers and their links stay as Sphinx writes them. A formula the converter cannot read, or a command it
does not know, fails the build, naming it.
"""

import hashlib
import re
from pathlib import Path

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.errors import ExtensionError
from sphinx.locale import _
from sphinx.util.math import get_node_equation_number

UNKNOWN = re.compile(r">(\\[A-Za-z]+)<")  # a command the converter does not know, left as text
TRANSPOSE = ("<mo>&#x022A4;</mo>", "<mi>&#x022A4;</mi>")  # ⊤ as a symbol, as TeX sets it, not a spaced operator


def to_mathml(tex: str, display: bool = False) -> str:
    """``tex`` as one ``<math>`` element (``display="block"`` for display math)."""
    try:
        out = convert(tex.strip(), display="block" if display else "inline")
    except Exception as e:  # the converter raises its own exception types
        raise ExtensionError(f"mathml: cannot convert {tex.strip()[:80]!r}: {type(e).__name__} {e}") from None
    unknown = UNKNOWN.search(out)
    if unknown:
        raise ExtensionError(f"mathml: unknown command {unknown[1]} in {tex.strip()[:80]!r}")
    return out.replace(*TRANSPOSE)


def visit_math(self, node: nodes.math) -> None:
    self.body.append(self.starttag(node, "span", "", CLASS="math notranslate nohighlight"))
    self.body.append(to_mathml(node.astext()) + "</span>")
    raise nodes.SkipNode


def visit_displaymath(self, node: nodes.math_block) -> None:
    self.body.append(self.starttag(node, "div", CLASS="math notranslate nohighlight"))
    if node["number"]:
        self.body.append(f'<span class="eqno">({get_node_equation_number(self, node)})')
        self.add_permalink_ref(node, _("Link to this equation"))
        self.body.append("</span>")
    parts = [p for p in node.astext().split("\n\n") if p.strip()]  # several equations: one below the other
    # in a box of their own that scrolls sideways when a formula is wider than the screen (_static/attnid.css)
    self.body.append('<span class="display">' + "".join(to_mathml(p, display=True) for p in parts) + "</span>")
    self.body.append("</div>\n")
    raise nodes.SkipNode


def _use_mathml(app, config) -> None:
    config.html_math_renderer = "mathml"


def setup(app):
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_displaymath, None))
    # a config value that changes with this file: an edit here rewrites every page on the next build
    app.add_config_value("mathml_source", hashlib.sha256(Path(__file__).read_bytes()).hexdigest(), "html")
    app.connect("config-inited", _use_mathml, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
