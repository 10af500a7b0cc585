"""The tail the scenarios' plots share: axis labels, a small title, a light grid and legend, and the
figure saved at 100 dpi and closed (matplotlib, server extra)."""

from __future__ import annotations

from typing import Any

__all__ = ["finish_axes", "save_figure"]


def finish_axes(ax: Any, xlabel: str, ylabel: str, title: str | None = None, *, legend: int | None = 8) -> None:
    """Label ``ax``, give it ``title`` (9 pt) if any, a grid (α 0.3), and a legend of ``legend`` pt (None: none)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if legend is not None:
        ax.legend(fontsize=legend)


def save_figure(fig: Any, path: str) -> None:
    """Lay ``fig`` out tightly, write it to ``path`` at 100 dpi and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
