"""Drawing boxes on pictures with Pillow: class colours, captions, box outlines and the legend.

The floor that detection (:func:`yolo3.inference.detect.draw_detections`) and the evaluation
figures (:mod:`yolo3.evaluation.plots`) both draw with; it imports neither.
"""

import colorsys
import math

from PIL import Image, ImageDraw, ImageFont

TRUE_BOX_COLOR = (0, 230, 0)
MISSED_BOX_COLOR = (255, 0, 255)
HALO_COLOR = (0, 0, 0)
TILE_BACKGROUND = (40, 40, 40)
LEGEND_SAMPLE_COLOR = (200, 200, 200)  # stands for "any class colour" in the legend
LEGEND_LINE, LEGEND_PADDING = 16, 4
# Gallery marks: line colour (None: the class colour), width in pixels, colour between dashes
# (None: a solid line) and the legend's words.
BOX_STYLES = {
    "truth": (TRUE_BOX_COLOR, 1, None, "truth"),
    "missed": (MISSED_BOX_COLOR, 3, (255, 255, 255), "missed truth"),
    "match": (None, 2, None, "matched detection"),
    "false_positive": (None, 2, HALO_COLOR, "FP: false positive"),
    "detection": (None, 2, None, "detection"),
}
BACKGROUND = (255, 255, 255)


def class_colors(num_classes):
    """One distinct, saturated RGB colour per class, evenly spaced in hue (galleries and
    :func:`yolo3.inference.detect.draw_detections` alike)."""
    hues = [index / max(num_classes, 1) for index in range(num_classes)]
    return [tuple(int(255 * c) for c in colorsys.hsv_to_rgb(h, 0.9, 1.0)) for h in hues]


def legend_band(width, class_names, class_ids, marks=(), *, max_classes=20):
    """A white band ``width`` pixels wide that explains marks and class colours.

    Args:
        width: the band's width, that of the picture it goes under.
        class_names: names indexed by class id.
        class_ids: the classes whose colours to name (repeats and order do not matter);
            past ``max_classes`` of them, "+N more" ends the list.
        marks: keys of :data:`BOX_STYLES` to show, each with a sample box and its meaning.

    Items flow left to right in lines of :data:`LEGEND_LINE` pixels, the classes starting a
    line of their own; the band is ``2 * LEGEND_PADDING + LEGEND_LINE * lines`` high.
    """
    font = ImageFont.load_default()
    colors = class_colors(len(class_names))
    class_ids = sorted({int(c) for c in class_ids})
    groups = [
        [(key, None, BOX_STYLES[key][3]) for key in marks],
        [("class", colors[c % len(colors)], class_names[c]) for c in class_ids[:max_classes]],
    ]
    if len(class_ids) > max_classes:
        groups[1].append((None, None, f"+{len(class_ids) - max_classes} more"))
    if not any(groups):
        groups = [[(None, None, "no classes drawn")]]
    icon_w, gap = 20, 12
    placed, lines = [], 0
    for group in groups:
        x = None  # each group starts a line
        for icon, color, text in group:
            item_w = (icon_w + 4 if icon else 0) + math.ceil(font.getlength(text))
            if x is None or (x > LEGEND_PADDING and x + item_w > width - LEGEND_PADDING):
                x, lines = LEGEND_PADDING, lines + 1
            placed.append((icon, color, text, x, LEGEND_PADDING + (lines - 1) * LEGEND_LINE))
            x += item_w + gap
    band = Image.new("RGB", (width, 2 * LEGEND_PADDING + lines * LEGEND_LINE), BACKGROUND)
    draw = ImageDraw.Draw(band)
    for icon, color, text, x, y in placed:
        if icon == "class":
            draw.rectangle((x + 4, y + 2, x + 15, y + 13), fill=color, outline=HALO_COLOR)
        elif icon:
            outline(draw, (x + 1, y + 3, x + icon_w - 1, y + 12), icon, LEGEND_SAMPLE_COLOR)
        if icon:
            x += icon_w + 4
        draw.text((x, y + LEGEND_LINE // 2), text, fill=(0, 0, 0), font=font, anchor="lm")
    return band


def draw_caption(draw, text, box, color, font, bounds, places=("above", "inside_top", "below")):
    """Writes ``text`` in black on a ``color`` label beside ``box``; returns the label's corners.

    Args:
        draw: a ``PIL.ImageDraw.Draw``.
        box: ``x_min, y_min, x_max, y_max`` in the drawing's pixels, edges included.
        bounds: ``left, top, right, bottom`` the label must stay in, right and bottom excluded.
        places: where to try, in order: ``"above"``, ``"below"``, ``"inside_top"`` and
            ``"inside_bottom"``. Inside places count only when the label fits the box's width
            and a third of its height. The first that keeps the label within ``bounds`` wins;
            failing all, the first, moved into them. The label also moves left to stay within.
    """
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    _, top, _, bottom = font.getbbox("Ag")  # one label height for every text
    label_w, label_h = right - left + 4, bottom - top + 3
    x_min, y_min, x_max, y_max = (round(float(v)) for v in box)
    fits_inside = label_w <= x_max - x_min + 1 and 3 * label_h <= y_max - y_min + 1
    rows = {
        "above": y_min - label_h,
        "below": y_max + 1,
        "inside_top": y_min,
        "inside_bottom": y_max + 1 - label_h,
    }
    candidates = [rows[p] for p in places if fits_inside or not p.startswith("inside")]
    within = [y for y in candidates if bounds[1] <= y <= bounds[3] - label_h]
    fallback = candidates[0] if candidates else y_min
    y = within[0] if within else max(bounds[1], min(fallback, bounds[3] - label_h))
    x = max(bounds[0], min(x_min, bounds[2] - label_w))
    corners = (x, y, x + label_w - 1, y + label_h - 1)
    draw.rectangle(corners, fill=color)
    draw.text((x + 2 - left, y + 1 - top), text, fill=(0, 0, 0), font=font)
    return corners


def outline(draw, box, style, color=None):
    """Outlines ``box`` (integer pixels, edges included) in a :data:`BOX_STYLES` style.

    The line lies inside the box's edges, over a black halo one pixel wider on each side;
    ``color`` stands in for a style's class colour (None).
    """
    line_color, width, gap_color, _ = BOX_STYLES[style]
    line_color = line_color or color
    x_min, y_min, x_max, y_max = box
    draw.rectangle(
        (x_min - 1, y_min - 1, x_max + 1, y_max + 1), outline=HALO_COLOR, width=width + 2
    )
    if gap_color is None:
        draw.rectangle(box, outline=line_color, width=width)
        return
    draw.rectangle(box, outline=gap_color, width=width)
    dash = 4
    for start in range(x_min, x_max + 1, 2 * dash):
        end = min(start + dash - 1, x_max)
        draw.rectangle((start, y_min, end, min(y_min + width - 1, y_max)), fill=line_color)
        draw.rectangle((start, max(y_max - width + 1, y_min), end, y_max), fill=line_color)
    for start in range(y_min, y_max + 1, 2 * dash):
        end = min(start + dash - 1, y_max)
        draw.rectangle((x_min, start, min(x_min + width - 1, x_max), end), fill=line_color)
        draw.rectangle((max(x_max - width + 1, x_min), start, x_max, end), fill=line_color)
