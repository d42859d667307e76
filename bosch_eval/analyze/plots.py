"""Heatmap of a square matrix (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path


def heatmap(matrix: list[list[float]], labels: list[str], path: str | Path) -> None:
    """A labelled heatmap with the values written in the cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1 + 0.7 * len(labels), 0.8 + 0.6 * len(labels)))
    image = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="w" if value < 0.5 else "k", fontsize=8)
    fig.colorbar(image, label="Jaccard similarity of SWA sets")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
