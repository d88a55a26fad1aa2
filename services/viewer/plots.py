"""Small inline SVG line plots (no JavaScript, no plotting library): one series against step, with the
alarm steps marked as red bands."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 300, 150, 44, 10, 22, 22


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.2g}"
    return f"{v:.3g}"


def line_plot(title: str, points: Sequence[tuple[int, float]], marks: Sequence[int] = ()) -> str:
    """An SVG plot of `points` (step, value); `marks` are steps drawn as red bands."""
    head = (f'<svg class="plot" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
            f'aria-label="{escape(title)}"><text x="{PAD_L}" y="14" class="title">{escape(title)}</text>')
    if not points:
        return head + f'<text x="{W // 2}" y="{H // 2}" text-anchor="middle" class="empty">no data</text></svg>'
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys + [0.0]), max(ys)
    if y1 == y0:
        y1 = y0 + 1.0
    span_x = (x1 - x0) or 1

    def px(x: float) -> float:
        return PAD_L + (x - x0) / span_x * (W - PAD_L - PAD_R)

    def py(y: float) -> float:
        return H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_T - PAD_B)

    band = max(2.0, (W - PAD_L - PAD_R) / max(1, len(set(xs))))
    parts = [head]
    parts += [f'<rect class="mark" x="{px(s) - band / 2:.1f}" y="{PAD_T}" width="{band:.1f}" '
              f'height="{H - PAD_T - PAD_B}"><title>alarm at step {s}</title></rect>' for s in marks if x0 <= s <= x1]
    parts.append(f'<line class="axis" x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}"/>'
                 f'<line class="axis" x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}"/>')
    for v in (y0, y1):
        parts.append(f'<text class="tick" x="{PAD_L - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    for v in (x0, x1):
        parts.append(f'<text class="tick" x="{px(v):.1f}" y="{H - 6}" text-anchor="middle">{v}</text>')
    path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    parts.append(f'<polyline class="line" points="{path}"/>')
    if len(points) <= 60:
        parts += [f'<circle class="dot" cx="{px(x):.1f}" cy="{py(y):.1f}" r="2"><title>step {x}: {_fmt(y)}</title>'
                  f'</circle>' for x, y in points]
    return "".join(parts) + "</svg>"
