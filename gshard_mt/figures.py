"""Pictures without pyplot: each figure is a `matplotlib.figure.Figure` of its own (no backend to choose, no window,
nothing global to close), written whole so that a half-written picture never has the final name."""

from __future__ import annotations

from io import BytesIO

from matplotlib.figure import Figure

from gshard_mt import io


def subplots(*args, figsize: tuple[float, float] | None = None, layout: str | None = None, **kwargs):
  """(figure, axes) as pyplot's `subplots` makes them."""
  fig = Figure(figsize=figsize, layout=layout)
  return fig, fig.subplots(*args, **kwargs)


def save(fig: Figure, path: io.epath.Path, dpi: int = 100) -> io.epath.Path:
  """Writes `fig` to `path` (its suffix the format) atomically; returns the path."""
  image = BytesIO()
  fig.savefig(image, format=path.suffix[1:], dpi=dpi)
  io.write_atomically(path, image.getvalue())
  return path
