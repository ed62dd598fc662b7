// The article header's sidebar buttons (sphinx-book-theme) must open the sidebars on a narrow
// screen too: pydata-sphinx-theme attaches its dialog to the first toggle only, which is hidden
// in this layout, so a click on a visible toggle is forwarded to it.
document.addEventListener("DOMContentLoaded", () => {
  for (const kind of ["primary", "secondary"]) {
    const toggles = Array.from(document.querySelectorAll(`.${kind}-toggle`));
    const first = toggles[0];
    toggles.slice(1).forEach((t) =>
      t.addEventListener("click", (e) => {
        if (window.matchMedia("(min-width: 992px)").matches) return; // the book theme handles wide screens
        e.preventDefault();
        e.stopPropagation();
        first.click();
      }),
    );
  }
});

// A box that scrolls sideways says so: on a phone a wide equation or table shows no scrollbar until it is touched,
// and looks cut off. Each such box (display math, a table or a cell's table output, the counter's text) is wrapped in a
// .scroll-cue whose edges fade where there is more to see (classes more-left and more-right, kept up to date as it
// scrolls and as the window resizes). tools/check_pages.py fails a box that scrolls sideways without one.
const SCROLLERS = "div.math span.display, .pst-scrollable-table-container, div.output.text_html, pre.counter-text";
function updateCue(box) {
  const cue = box.parentElement;
  const more = box.scrollWidth - box.clientWidth;
  cue.classList.toggle("more-left", more > 1 && box.scrollLeft > 1);
  cue.classList.toggle("more-right", more > 1 && box.scrollLeft < more - 1);
}
function addCues(root) {
  for (const box of root.querySelectorAll(SCROLLERS)) {
    if (!box.parentElement.classList.contains("scroll-cue")) {
      const cue = document.createElement("div");
      cue.className = "scroll-cue";
      box.replaceWith(cue);
      cue.append(box);
      box.addEventListener("scroll", () => updateCue(box), { passive: true });
    }
    updateCue(box);
  }
}
document.addEventListener("DOMContentLoaded", () => {
  addCues(document);
  window.addEventListener("resize", () => addCues(document));
  // boxes added later (the counter page's results) get theirs too
  new MutationObserver(() => addCues(document)).observe(document.body, { childList: true, subtree: true });
});
