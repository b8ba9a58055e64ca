#!/usr/bin/env bash
# check_html.sh PAGE OUTDIR: renders an `ember mem html` page in headless Chromium and checks that it draws — the
# screenshot is not blank (more than 20 distinct pixel colours, PNG decoded with the Python standard library) and the
# DOM holds the chart's <svg> and the peak marker. Exit 77 (ctest: skipped) when no chromium binary is installed.
set -euo pipefail
page=${1:?usage: check_html.sh PAGE OUTDIR}
out=${2:?usage: check_html.sh PAGE OUTDIR}

browser=""
for b in chromium chromium-browser; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
  echo "check_html: no chromium or chromium-browser on PATH; skipped"
  exit 77
fi
[ -f "$page" ] || { echo "check_html: no page at $page" >&2; exit 1; }
mkdir -p "$out"
url="file://$(readlink -f "$page")"
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,900 --no-first-run
       --no-default-browser-check --user-data-dir="$out/profile")

rm -f "$out/page.png"
timeout 120 "$browser" "${flags[@]}" --screenshot="$out/page.png" "$url" >"$out/screenshot.log" 2>&1 || true
[ -s "$out/page.png" ] || { echo "check_html: $browser wrote no screenshot" >&2; cat "$out/screenshot.log" >&2; exit 1; }
timeout 120 "$browser" "${flags[@]}" --dump-dom "$url" >"$out/dom.html" 2>"$out/dom.log" || true

python3 - "$out/page.png" <<'PY'
import struct, sys, zlib

def pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit("check_html: not a PNG file")
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    width, height, depth, ctype, _, _, interlace = ihdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        sys.exit(f"check_html: unexpected PNG format depth={depth} colour type={ctype} interlace={interlace}")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    colours = set()
    for y in range(height):
        f = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 255
        elif f == 2:
            row = bytearray((a + b) & 255 for a, b in zip(row, prev))
        elif f == 3:
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                row[i] = (row[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                row[i] = (row[i] + pred) & 255
        colours.update(bytes(row[i:i + bpp]) for i in range(0, stride, bpp))
        prev = row
    return width, height, colours

w, h, colours = pixels(sys.argv[1])
print(f"check_html: screenshot {w}x{h}, {len(colours)} distinct colours")
if len(colours) <= 20:
    sys.exit("check_html: the screenshot looks blank")
PY

grep -q "<svg" "$out/dom.html" || { echo "check_html: no <svg> in the rendered DOM" >&2; exit 1; }
grep -q 'id="peak-marker"' "$out/dom.html" || { echo "check_html: no peak marker in the rendered DOM" >&2; exit 1; }
echo "check_html: $page renders (svg and peak marker present)"
