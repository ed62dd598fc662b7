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
