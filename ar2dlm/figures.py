"""Matplotlib without a display, and one way to write a figure (PDF and PNG)."""

from __future__ import annotations


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, pdf_path, png_path) -> None:
    fig.tight_layout()
    fig.savefig(pdf_path)
    fig.savefig(png_path, dpi=150)
    pyplot().close(fig)
