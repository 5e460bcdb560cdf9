"""The label distribution across sites as a PNG: per site, its samples stacked by class (matplotlib, Agg backend).

matplotlib is imported when a plot is drawn: it is in the ``benchmark`` and ``test`` extras, not a dependency of the
package, so a server without it still runs the data check (see :mod:`nvflare_moon.server.data_check`).
"""

from typing import Sequence

import numpy as np


def plot_label_distribution(
    counts: np.ndarray,
    site_names: Sequence[str],
    class_names: Sequence[str],
    path: str,
    title: str,
    ylabel: str = "training samples",
) -> str:
    """Draw ``counts`` (``[sites, classes]``) as one bar per site, stacked by class, into ``path``; returns ``path``.
    The legend names the classes when there are at most 20."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = np.asarray(counts).reshape(len(site_names), len(class_names))
    num_sites, num_classes = counts.shape
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * num_sites + 3), 4.2))
    colors = plt.get_cmap("tab10" if num_classes <= 10 else "tab20")
    bottom = np.zeros(num_sites)
    x = np.arange(1, num_sites + 1)
    for k in range(num_classes):
        ax.bar(x, counts[:, k], bottom=bottom, color=colors(k % colors.N), label=class_names[k])
        bottom += counts[:, k]
    ax.set_xticks(x, list(site_names), rotation=45, fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    if num_classes <= 20:
        ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
