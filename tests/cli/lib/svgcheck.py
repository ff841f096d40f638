#!/usr/bin/env python3
"""Checks of the SVG pictures of `llm3d plot` and `llm3d plan --svg` (tests/cli/plot.sh), with
Python's standard library only (Debian's python3): xml.etree reads the SVG, zlib the PNG that
Chromium renders. Each subcommand exits 0 when the check holds, else 1 with one line on stderr.

  svgcheck.py axis FILE CHART AXIS MIN MAX       the chart's axis has data MIN..MAX inside its range
  svgcheck.py runs FILE CHART KIND N             the series of data-kind KIND is N polylines
  svgcheck.py marks FILE CHART KIND N            the series of data-kind KIND draws N marks
  svgcheck.py inside FILE                        every polyline point lies in its chart's frame
  svgcheck.py spike FILE CHART KIND VALUE        a polyline point of KIND lies at VALUE (thinning)
  svgcheck.py png FILE W H COLOR:N...            a W x H PNG with N pixels of each #RRGGBB colour
                                                 in it, its corners white
"""
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

NS = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print("svgcheck: " + msg, file=sys.stderr)
    sys.exit(1)


def chart(path, title):
    root = ET.parse(path).getroot()
    for g in root.iter(NS + "g"):
        if g.get("class") == "chart" and g.get("data-title") == title:
            return g
    fail("%s: no chart titled %r" % (path, title))


def series(g, kind):
    out = [s for s in g.iter(NS + "g") if s.get("class") == "series" and s.get("data-kind") == kind]
    if not out:
        fail("no series of kind %r" % kind)
    return out[0]


def points(poly):
    return [tuple(float(v) for v in p.split(",")) for p in poly.get("points").split()]


def frame(g):
    r = [e for e in g.iter(NS + "rect") if e.get("class") == "frame"][0]
    x, y, w, h = (float(r.get(k)) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def cmd_axis(path, title, axis, lo, hi):
    g = chart(path, title)
    a = [e for e in g.iter(NS + "g") if e.get("class") == "axis" and e.get("data-axis") == axis][0]
    dmin, dmax = float(a.get("data-min")), float(a.get("data-max"))
    rlo, rhi = float(a.get("data-lo")), float(a.get("data-hi"))
    # the data's extent exactly (NaN-aware: a NaN attribute fails the comparison)
    if not (abs(dmin - float(lo)) <= 1e-6 * abs(float(lo)) + 1e-12
            and abs(dmax - float(hi)) <= 1e-6 * abs(float(hi)) + 1e-12):
        fail("%s %s axis: data %g..%g, expected %s..%s" % (title, axis, dmin, dmax, lo, hi))
    if not (rlo <= dmin and dmax <= rhi and rhi > rlo):
        fail("%s %s axis: range %g..%g does not hold the data %g..%g" % (title, axis, rlo, rhi,
                                                                        dmin, dmax))
    # a range widened to whole ticks, not to anything: within one span of the data on each side
    span = dmax - dmin if dmax > dmin else abs(dmax) + 1
    if a.get("data-log") == "0" and not (rlo >= dmin - span and rhi <= dmax + span):
        fail("%s %s axis: range %g..%g far wider than the data %g..%g" % (title, axis, rlo, rhi,
                                                                          dmin, dmax))


def cmd_runs(path, title, kind, n):
    s = series(chart(path, title), kind)
    got = len(list(s.iter(NS + "polyline")))
    if got != int(n):
        fail("%s %s: %d polylines, expected %s" % (title, kind, got, n))


def cmd_marks(path, title, kind, n):
    s = series(chart(path, title), kind)
    got = sum(1 for e in s if e.tag in (NS + "path", NS + "circle", NS + "rect"))
    if got != int(n):
        fail("%s %s: %d marks, expected %s" % (title, kind, got, n))


def cmd_inside(path):
    root = ET.parse(path).getroot()
    for g in root.iter(NS + "g"):
        if g.get("class") != "chart":
            continue
        x0, y0, x1, y1 = frame(g)
        for poly in g.iter(NS + "polyline"):
            for x, y in points(poly):
                if not (x0 - 0.1 <= x <= x1 + 0.1 and y0 - 0.1 <= y <= y1 + 0.1):
                    fail("%s: point (%g, %g) outside the frame of %r" % (path, x, y,
                                                                         g.get("data-title")))


def cmd_spike(path, title, kind, value):
    g = chart(path, title)
    a = [e for e in g.iter(NS + "g") if e.get("class") == "axis" and e.get("data-axis") == "y"][0]
    lo, hi = float(a.get("data-lo")), float(a.get("data-hi"))
    x0, y0, x1, y1 = frame(g)
    want = y1 + (float(value) - lo) / (hi - lo) * (y0 - y1)
    ys = [y for poly in series(g, kind).iter(NS + "polyline") for _, y in points(poly)]
    n = len(ys)
    if n > 4 * (x1 - x0 + 2):
        fail("%s %s: %d points for %d pixel columns (not thinned)" % (title, kind, n, x1 - x0))
    if not any(abs(y - want) <= 0.11 for y in ys):
        fail("%s %s: no point at y %.1f (value %s) among %d" % (title, kind, want, value, n))


def png_pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("%s: not a PNG" % path)
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if typ == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                fail("%s: PNG type %d depth %d interlace %d not read here" % (path, ctype, depth,
                                                                            interlace))
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), w * bpp
    rows, prev = [], bytearray(stride)
    for r in range(h):  # the PNG filters (RFC 2083 sec. 6)
        f, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def cmd_png(path, w, h, *colors):
    pw, ph, bpp, rows = png_pixels(path)
    if (pw, ph) != (int(w), int(h)):
        fail("%s: %dx%d, expected %sx%s" % (path, pw, ph, w, h))
    for x, y in ((1, 1), (pw - 2, 1), (1, ph - 2), (pw - 2, ph - 2)):
        px = tuple(rows[y][x * bpp:x * bpp + 3])
        if min(px) < 245:
            fail("%s: corner (%d, %d) is %s, not white" % (path, x, y, px))
    for spec in colors:
        rgb, n = spec.split(":")
        want = tuple(int(rgb[i:i + 2], 16) for i in (1, 3, 5))
        got = 0
        for line in rows:
            for i in range(0, len(line), bpp):
                if all(abs(line[i + k] - want[k]) <= 12 for k in range(3)):
                    got += 1
        if got < int(n):
            fail("%s: %d pixels of %s, expected at least %s" % (path, got, rgb, n))


if __name__ == "__main__":
    cmds = {"axis": cmd_axis, "runs": cmd_runs, "marks": cmd_marks, "inside": cmd_inside,
            "spike": cmd_spike, "png": cmd_png}
    if len(sys.argv) < 3 or sys.argv[1] not in cmds:
        fail("usage: svgcheck.py axis|runs|marks|inside|spike|png FILE ...")
    try:
        cmds[sys.argv[1]](*sys.argv[2:])
    except ET.ParseError as e:
        fail("%s: not XML: %s" % (sys.argv[2], e))
