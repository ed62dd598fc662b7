"""Small Sphinx fixes for an offline, error-free book.

* Drop sphinx-thebe's scripts: the book has no live-code button, and the theme registers
  them twice (a console error, "THEBE_JS_URL has already been declared") and they name a CDN.
* Start pages in light mode (the theme otherwise logs "invalid theme mode").
* Load ``_static/attnid.css`` (code size, table overflow, figures in dark mode) and ``_static/attnid.js``
  (the sidebar buttons work on a phone).
"""


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


def setup(app):
    app.connect("html-page-context", _page_context, priority=900)
    app.add_css_file("attnid.css")
    app.add_js_file("attnid.js")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
