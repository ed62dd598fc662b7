"""The book's table and figure helpers (attnid.plotting)."""

import matplotlib

matplotlib.use("Agg")

import pandas as pd

from attnid.plotting import MIN_FONT_PT, PAGE_WIDTH_IN, panels, set_style, table


def test_table_hides_the_index_and_aligns_numbers():
    df = pd.DataFrame({"model": ["a", "b"], "H": [16, 4], "D": [4, 16], "params": [1234567, 8], "share": [0.5, 1e-5]})
    html = table(df).to_html()
    assert "1,234,567" in html and "1e-05" in html and "0.5" in html
    assert '<th class="blank' not in html and "row_heading" not in html  # no index
    # H and D stay separate cells: "16" and "4" are two <td>s, never "164"
    assert ">16</td>" in html and ">4</td>" in html and "164" not in html
    styles = html.split("</style>")[0]
    assert "text-align: right" in styles and "text-align: left" in styles


def test_table_formats_override_and_missing_values():
    df = pd.DataFrame({"x": [0.123456, None], "ok": [True, False]})
    html = table(df, formats={"x": "{:.2f}"}).to_html()
    assert "0.12" in html and "–" in html and "yes" in html and "no" in html


def test_panels_two_per_row_within_the_page_width():
    set_style()
    for n, shape in ((1, (1, 1)), (2, (1, 2)), (3, (2, 2)), (4, (2, 2))):
        fig, axes = panels(n)
        assert axes.shape == shape
        assert len(fig.axes) == n  # the spare cell of an odd row is removed
        assert fig.get_size_inches()[0] <= PAGE_WIDTH_IN
    assert matplotlib.rcParams["legend.fontsize"] >= MIN_FONT_PT
    assert min(matplotlib.rcParams[k] for k in ("xtick.labelsize", "ytick.labelsize", "axes.labelsize")) >= MIN_FONT_PT


def test_point_labels_do_not_overlap():
    import matplotlib.pyplot as plt

    from attnid.plotting import label_points

    set_style()
    fig, ax = plt.subplots()
    x = [1, 1.05, 1.1, 2, 2, 2, 2, 5]
    y = [1, 1.02, 0.98, 1.5, 1.45, 1.4, 1.55, 0.2]
    ax.scatter(x, y)
    ax.set(xscale="log", xlim=(0.5, 20), ylim=(0, 2))
    notes = label_points(ax, x, y, [f"model-{i}" for i in range(len(x))])
    fig.canvas.draw()
    boxes = [n.get_window_extent() for n in notes]
    assert len(boxes) == len(x)
    for i in range(len(boxes)):
        for j in range(i):
            assert not boxes[i].overlaps(boxes[j]), (i, j)
    plt.close(fig)


def test_dot_rows_draws_a_row_per_name_on_a_log_axis():
    import matplotlib

    matplotlib.use("Agg")
    from attnid.plotting import dot_rows

    fig = dot_rows(["a", "b", "c"], {"x": ("o", [1, 10, 100]), "y": ("s", [2, 20, 200])}, xlabel="n", title="t")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert len(ax.collections) == 2 and ax.get_ylim()[0] > ax.get_ylim()[1]  # first name on top


def test_the_style_is_seaborns_whitegrid_theme_without_importing_seaborn():
    """set_style writes out what sns.set_theme(context="notebook", style="whitegrid", palette="colorblind") sets:
    every rcParam seaborn changes is seaborn's value under set_style too, unless the book sets its own (BOOK_RC);
    the colour map aside (WHITEGRID's comment)."""
    import matplotlib as mpl
    import seaborn as sns
    from matplotlib.colors import to_rgb

    from attnid.plotting import BOOK_RC, PALETTE, WHITEGRID

    with mpl.rc_context():
        mpl.rcdefaults()
        defaults = dict(mpl.rcParams)
        set_style()
        ours = dict(mpl.rcParams)
        mpl.rcdefaults()
        sns.set_theme(context="notebook", style="whitegrid", palette=PALETTE)
        seaborn = dict(mpl.rcParams)
    changed = {k for k in seaborn if seaborn[k] != defaults[k]} - {"axes.prop_cycle", "image.cmap"}
    assert set(WHITEGRID) <= changed  # nothing written out that seaborn leaves alone
    assert {k: ours[k] for k in changed} == {k: BOOK_RC.get(k, seaborn[k]) for k in changed}
    cycle = [[to_rgb(c) for c in rc["axes.prop_cycle"].by_key()["color"]] for rc in (ours, seaborn)]
    assert cycle[0] == cycle[1]


def test_the_landing_figure_counts_every_published_layer_and_its_labels_neither_overlap_nor_leave_the_axes():
    """Every preset, latent attention included (26, as the rest of the book says); one label per point the eye sees
    as one (coinciding layers merged); no two labels overlap, and each stays inside the axes."""
    import matplotlib.pyplot as plt

    from attnid.chapters.landing import headline_figure, published_layers
    from attnid.presets import MLA_PRESETS, PRESETS

    set_style()
    models = published_layers()
    assert len(models) == len(PRESETS) + len(MLA_PRESETS) and "deepseek-v3" in set(models["name"])
    fig = headline_figure(models)
    fig.canvas.draw()
    ax = fig.axes[0]
    notes = [t for t in ax.texts]
    assert sorted(n for t in notes for n in t.get_text().replace("\n", " ").split(", ") if n) == sorted(
        n.strip(",") for n in models["name"]
    )  # every layer named once
    from matplotlib.text import Text

    boxes = [Text.get_window_extent(t) for t in notes]  # the text's box (an annotation's own adds its leader line)
    for i in range(len(boxes)):
        assert ax.bbox.x0 - 1 <= boxes[i].x0 and boxes[i].x1 <= ax.bbox.x1 + 1, notes[i].get_text()
        for j in range(i):
            assert not boxes[i].overlaps(boxes[j]), (notes[i].get_text(), notes[j].get_text())
    plt.close(fig)


def test_points_whose_markers_overlap_share_one_label():
    import matplotlib.pyplot as plt

    from attnid.plotting import merge_coincident

    set_style()
    fig, ax = plt.subplots()
    ax.set(xscale="log", yscale="log", xlim=(1, 100), ylim=(1e-4, 1))
    x, y, labels = merge_coincident(ax, [32, 32, 32, 8], [3.149e-3, 3.127e-3, 1e-2, 1e-2], ["a", "b", "c", "d"])
    assert (x, y, labels) == ([32, 32, 8], [3.149e-3, 1e-2, 1e-2], ["a, b", "c", "d"])
    plt.close(fig)
