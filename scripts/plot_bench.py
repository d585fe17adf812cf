#!/usr/bin/env python3
"""Draws and tabulates `swa-decode bench` results from bench/results/*.json.

    python3 scripts/plot_bench.py                     # the newest set (highest vN_h*.json)
    python3 scripts/plot_bench.py bench/results/v12_h*.json --svg /tmp/v12.svg

Writes, from the same rows:
  --svg       (docs/bench.svg)   time and ratio to the floor against T, log-log, one line per H and
                                 kernel family, plus the peers' figures (dotted)
  --markdown  (docs/results.md)  every row, and per H and T each family next to the floor and peers
  --readme    (README.md)        the short table between the bench-table markers, if they are there

Peers (--peers, default bench/results/peers_*.json) are figures measured with other libraries:
{"peer": NAME, "device": DEVICE, "rows": [{"H", "T", "us", "source"}]}; only peers measured on the
bench's device are drawn. Python standard library only (the SVG is written by hand), so it runs
anywhere without an install.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from collections import OrderedDict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
BENCH_NAME = re.compile(r"^v(\d+)_h(\d+)\.json$")  # one `swa-decode bench --json` file per version and H

# The README's short table: the most heads and half of it, at one, a few and many decode rows.
README_HEADS = (128, 64)
README_TOKENS = (1, 32, 128, 2048)
README_BEGIN = "<!-- bench-table:begin (python3 scripts/plot_bench.py rewrites this block) -->"
README_END = "<!-- bench-table:end -->"

# Okabe-Ito colours (distinct for colour-blind readers), one per H; dash patterns, one per family.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
FAMILY_DASHES = ("", "8 4", "3 3", "12 3 3 3")
PEER_DASH = "1.5 3.5"

BENCH_FIELDS = ("H", "T", "us", "floor_us", "ratio", "kernel")
PEER_FIELDS = ("H", "T", "us", "source")
DROPIN_FIELDS = ("T", "H", "seed_us", "dropin_eager_us", "dropin_graph_us", "rel_l2_vs_seed")


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------

def load_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"plot_bench.py: cannot read {path}: {e}")


def check_rows(path: str, doc: dict, fields) -> list:
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise SystemExit(f"plot_bench.py: {path}: expected a non-empty 'rows' list, got {rows!r:.60}")
    for i, row in enumerate(rows):
        missing = [f for f in fields if f not in row]
        if missing:
            raise SystemExit(f"plot_bench.py: {path}: rows[{i}] lacks {', '.join(missing)} "
                             f"(expected fields {', '.join(fields)})")
    return rows


def newest_bench_files() -> list:
    by_version = {}
    for path in glob.glob(os.path.join(RESULTS, "v*_h*.json")):
        match = BENCH_NAME.match(os.path.basename(path))
        if match:
            by_version.setdefault(int(match.group(1)), []).append(path)
    if not by_version:
        raise SystemExit(f"plot_bench.py: no vN_hH.json files in {RESULTS}")
    return sorted(by_version[max(by_version)])


def family(kernel: str) -> str:
    """portable_mma_g1_split4 -> portable: the kernel names are <family>_<variant>."""
    return kernel.split("_")[0]


class Bench:
    """The rows of the given bench files, with the device, commits and copy bandwidths they name."""

    def __init__(self, paths):
        self.paths = list(paths)
        self.rows = []
        self.devices, self.commits, self.copy_gbps = OrderedDict(), OrderedDict(), []
        for path in self.paths:
            doc = load_json(path)
            for row in check_rows(path, doc, BENCH_FIELDS):
                self.rows.append(dict(row, file=os.path.splitext(os.path.basename(path))[0]))
            self.devices[doc.get("device", "unknown device")] = None
            commit = str(doc.get("commit", "unknown"))[:7] + ("-dirty" if doc.get("commit_dirty") else "")
            self.commits[commit] = None
            if doc.get("copy_gbps"):
                self.copy_gbps.append(float(doc["copy_gbps"]))
        self.heads = sorted({r["H"] for r in self.rows}, reverse=True)
        self.tokens = sorted({r["T"] for r in self.rows})
        self.families = sorted({family(r["kernel"]) for r in self.rows})

    @property
    def shape(self) -> str:
        """What every row shares, e.g. "W = 128, D = 512, int32 indices"."""
        windows = sorted({r["W"] for r in self.rows if "W" in r})
        index_types = sorted({r["index_type"] for r in self.rows if "index_type" in r})
        return ", ".join(([f"W = {'/'.join(map(str, windows))}"] if windows else []) + ["D = 512"] +
                         ([f"{'/'.join(index_types)} indices"] if index_types else []))

    @property
    def device(self) -> str:
        return " / ".join(self.devices)

    @property
    def commit(self) -> str:
        return ", ".join(self.commits)

    def row(self, heads: int, tokens: int, fam: str):
        for r in self.rows:
            if r["H"] == heads and r["T"] == tokens and family(r["kernel"]) == fam:
                return r
        return None

    def floor_us(self, heads: int, tokens: int):
        for r in self.rows:
            if r["H"] == heads and r["T"] == tokens and r["floor_us"]:
                return r["floor_us"]
        return None


class Peer:
    def __init__(self, path: str):
        doc = load_json(path)
        self.path = path
        self.name = doc.get("peer") or os.path.splitext(os.path.basename(path))[0]
        self.device = doc.get("device", "unknown device")
        self.rows = check_rows(path, doc, PEER_FIELDS)

    def us(self, heads: int, tokens: int):
        for r in self.rows:
            if r["H"] == heads and r["T"] == tokens:
                return r["us"]
        return None

    def sources(self) -> list:
        return list(OrderedDict((r["source"], None) for r in self.rows))


# ------------------------------------------------------------------------------------------------
# SVG
# ------------------------------------------------------------------------------------------------

def log_ticks(lo: float, hi: float) -> list:
    """1-2-5 ticks covering [lo, hi]; 1-3 or decades alone where 1-2-5 would crowd the axis."""
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        ticks = []
        for exponent in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
            ticks += [m * 10.0 ** exponent for m in mantissas]
        below = max(t for t in ticks if t <= lo)
        above = min(t for t in ticks if t >= hi)
        ticks = [t for t in ticks if below <= t <= above]
        if len(ticks) <= 9:
            return ticks
    return ticks


def number(value: float) -> str:
    return f"{value:g}" if value < 1e5 else f"{value:.0e}"


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def attributes(attrs: dict) -> str:
    """SVG attributes: floats to 0.1 px, class_ -> class, stroke_width -> stroke-width, None left out."""
    def value(v):
        return f"{v:.1f}" if isinstance(v, float) else str(v)
    return " ".join(f'{k.rstrip("_").replace("_", "-")}="{value(v)}"'
                    for k, v in attrs.items() if v is not None)


def element(tag: str, **attrs) -> str:
    return f"<{tag} {attributes(attrs)}/>"


def text(x, y, cls: str, content: str, **attrs) -> str:
    return f"<text {attributes(dict(x=x, y=y, class_=cls, **attrs))}>{escape(content)}</text>"


class Panel:
    """One log-log plot: T on x, `quantity` on y."""

    def __init__(self, left, top, width, height, tokens, values, y_label):
        self.left, self.top, self.width, self.height = left, top, width, height
        self.x_ticks = tokens
        self.y_ticks = log_ticks(min(values), max(values))
        # Half a T step of margin either side keeps the first and last points off the frame.
        self.x_lo = math.log10(tokens[0]) - 0.15
        self.x_hi = math.log10(tokens[-1]) + 0.15
        self.y_lo, self.y_hi = math.log10(self.y_ticks[0]), math.log10(self.y_ticks[-1])
        self.y_label = y_label

    def x(self, tokens: float) -> float:
        return self.left + (math.log10(tokens) - self.x_lo) / (self.x_hi - self.x_lo) * self.width

    def y(self, value: float) -> float:
        return self.top + (self.y_hi - math.log10(value)) / (self.y_hi - self.y_lo) * self.height

    def frame(self, title: str) -> list:
        left, top, right, bottom = self.left, self.top, self.left + self.width, self.top + self.height
        centre = left + self.width / 2
        out = [text(centre, top - 10, "panel", title)]
        for t in self.y_ticks:
            out.append(element("line", x1=left, y1=self.y(t), x2=right, y2=self.y(t), class_="grid"))
            out.append(text(left - 6, self.y(t) + 4, "ytick", number(t)))
        for t in self.x_ticks:
            out.append(element("line", x1=self.x(t), y1=top, x2=self.x(t), y2=bottom, class_="grid"))
            out.append(text(self.x(t), bottom + 16, "xtick", number(t)))
        out.append(element("rect", x=left, y=top, width=self.width, height=self.height, class_="frame"))
        out.append(text(centre, bottom + 36, "label", "T (decode rows per call, log scale)"))
        cx, cy = left - 48, top + self.height / 2
        out.append(text(cx, cy, "label", self.y_label, transform=f"rotate(-90 {cx} {cy:.1f})"))
        return out

    def line(self, points, colour: str, dash: str, marker: str) -> list:
        points = [(t, v) for t, v in points if v is not None and v > 0]
        if not points:
            return []
        path = " ".join(f"{self.x(t):.1f},{self.y(v):.1f}" for t, v in points)
        out = [element("polyline", points=path, fill="none", stroke=colour, stroke_width=2,
                       stroke_dasharray=dash or None)]
        for t, v in points:
            out.append(marker_svg(marker, self.x(t), self.y(v), colour))
        return out


def marker_svg(kind: str, x: float, y: float, colour: str) -> str:
    if kind == "square":
        return element("rect", x=x - 3.5, y=y - 3.5, width=7, height=7, fill="white", stroke=colour,
                       stroke_width=1.5)
    return element("circle", cx=x, cy=y, r=3, fill=colour)


def draw_svg(bench: Bench, peers: list) -> str:
    width, panel_w, panel_h, top = 1000, 390, 320, 100
    lefts = (80, 580)
    colour = {h: COLOURS[i % len(COLOURS)] for i, h in enumerate(bench.heads)}
    dash = {f: FAMILY_DASHES[i % len(FAMILY_DASHES)] for i, f in enumerate(bench.families)}

    def peer_ratio(peer, h, t):
        us, floor = peer.us(h, t), bench.floor_us(h, t)
        return us / floor if us is not None and floor else None

    # (y label, title, value of a bench row, value of a peer at H and T, lowest tick at most 1)
    quantities = (
        ("time per call (us, log scale)", "Time per call", lambda r: r["us"], lambda p, h, t: p.us(h, t),
         False),
        ("us / floor_us (log scale; 1 = at the floor)", "Ratio to the copy-bandwidth floor",
         lambda r: r["ratio"], peer_ratio, True),
    )
    body = []
    for left, (y_label, title, of_row, of_peer, show_one) in zip(lefts, quantities):
        values = [of_row(r) for r in bench.rows if of_row(r)]
        values += [v for p in peers for h in bench.heads for t in bench.tokens if (v := of_peer(p, h, t))]
        if show_one:
            values.append(1.0)  # keep the floor itself on the axis
        panel = Panel(left, top, panel_w, panel_h, bench.tokens, values, y_label)
        body += panel.frame(title)
        for h in bench.heads:
            for f in bench.families:
                points = [(t, of_row(r)) for t in bench.tokens if (r := bench.row(h, t, f))]
                body += panel.line(points, colour[h], dash[f], "circle")
            for p in peers:
                points = [(t, of_peer(p, h, t)) for t in bench.tokens]
                body += panel.line(points, colour[h], PEER_DASH, "square")

    # Legend: colours name H, dash patterns name the kernel family or the peer.
    legend_y = top + panel_h + 70
    legend = [text(lefts[0], legend_y, "legend", "heads:")]
    x = lefts[0] + 52
    for h in bench.heads:
        legend.append(element("line", x1=x, y1=legend_y - 4, x2=x + 26, y2=legend_y - 4, stroke=colour[h],
                              stroke_width=4))
        legend.append(text(x + 32, legend_y, "legend", f"H = {h}"))
        x += 100
    legend_y += 24
    legend.append(text(lefts[0], legend_y, "legend", "lines:"))
    x = lefts[0] + 52
    styles = [(f, dash[f], "circle", f"swa-decode {f}") for f in bench.families]
    styles += [(p.name, PEER_DASH, "square", f"{p.name} (same GPU)") for p in peers]
    for _, pattern, marker, label in styles:
        legend.append(element("line", x1=x, y1=legend_y - 4, x2=x + 40, y2=legend_y - 4, stroke="#333",
                              stroke_width=2, stroke_dasharray=pattern or None))
        legend.append(marker_svg(marker, x + 20, legend_y - 4, "#333"))
        legend.append(text(x + 48, legend_y, "legend", label))
        x += 70 + 8 * len(label)  # 13 px text averages under 8 px a character

    subtitle = (f"{bench.device}, commit {bench.commit}: {bench.shape}, realistic decode batches, "
                "median CUDA-graph replay time")
    if peers:
        subtitle2 = ("peers (dotted, squares) measured on the same GPU; their ratio uses this "
                     "library's floor for the same H and T")
    else:
        subtitle2 = ""
    height = legend_y + 30
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        "<style>",
        "  .title { font-size: 17px; font-weight: bold; fill: #111; }",
        "  .sub { font-size: 12px; fill: #333; }",
        "  .panel { font-size: 14px; font-weight: bold; text-anchor: middle; fill: #111; }",
        "  .label { font-size: 13px; text-anchor: middle; fill: #111; }",
        "  .xtick { font-size: 12px; text-anchor: middle; fill: #222; }",
        "  .ytick { font-size: 12px; text-anchor: end; fill: #222; }",
        "  .legend { font-size: 13px; fill: #111; }",
        "  .grid { stroke: #ddd; stroke-width: 1; }",
        "  .frame { fill: none; stroke: #444; stroke-width: 1; }",
        "</style>",
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{lefts[0]}" y="24" class="title">swa-decode: sliding-window decode attention, '
        f'time and ratio to the floor against T</text>',
        f'<text x="{lefts[0]}" y="44" class="sub">{escape(subtitle)}</text>',
        f'<text x="{lefts[0]}" y="60" class="sub">{escape(subtitle2)}</text>',
        *body,
        *legend,
        "</svg>",
        "",
    ])


# ------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------

def us_cell(us) -> str:
    return "" if us is None else f"{us:.1f}"


def ratio_cell(ratio) -> str:
    if ratio is None:
        return ""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x" if ratio < 100 else f"{ratio:.0f}x"


def relative(path: str) -> str:
    return os.path.relpath(os.path.abspath(path), REPO)


def comparison_table(bench: Bench, peers: list, heads, tokens) -> list:
    """One row per H and T: each family's time and ratio (the faster in bold), the floor, the peers."""
    variants = {f: len({r["kernel"] for r in bench.rows if family(r["kernel"]) == f}) > 1
                for f in bench.families}
    header = ["H", "T", "floor us"]
    for f in bench.families:
        header += ([f"{f} kernel"] if variants[f] else []) + [f"{f} us", "x floor"]
    header += [f"{p.name} us" for p in peers]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * 2 + "---:|" + "".join(
        ("---|" if variants[f] else "") + "---:|---:|" for f in bench.families) + "---:|" * len(peers)]
    for h in heads:
        for t in tokens:
            rows = {f: bench.row(h, t, f) for f in bench.families}
            if not any(rows.values()):
                continue
            fastest = min((r["us"] for r in rows.values() if r), default=None)
            cells = [str(h), str(t), f"{bench.floor_us(h, t):.2f}" if bench.floor_us(h, t) else ""]
            for f in bench.families:
                r = rows[f]
                if variants[f]:
                    cells.append(f"`{r['kernel']}`" if r else "")
                us, ratio = (us_cell(r["us"]), ratio_cell(r["ratio"])) if r else ("", "")
                # Bold marks what decode() picks where the JSON says (its "selected" field),
                # else the faster family.
                picked = r.get("selected") if r and "selected" in r else (r and r["us"] == fastest)
                if r and len([x for x in rows.values() if x]) > 1 and picked:
                    us, ratio = f"**{us}**", f"**{ratio}**"
                cells += [us, ratio]
            cells += [us_cell(p.us(h, t)) for p in peers]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def peer_notes(peers: list) -> list:
    return [f"- {p.name} ({relative(p.path)}): " + "; ".join(p.sources()) for p in peers]


def every_row_table(bench: Bench) -> list:
    lines = ["| H | T | W | kernel | us | floor_us | ratio | GB/s | TFLOP/s | max_err | rel_l2 | check "
             "| samples | from |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    order = sorted(bench.rows, key=lambda r: (-r["H"], r["T"], r["kernel"]))
    for r in order:
        def fmt(key, spec):
            return format(r[key], spec) if r.get(key) is not None else ""
        lines.append("| " + " | ".join([
            str(r["H"]), str(r["T"]), str(r.get("W", "")), f"`{r['kernel']}`", us_cell(r["us"]),
            fmt("floor_us", ".2f"), ratio_cell(r["ratio"]), fmt("gbps", ".0f"), fmt("tflops", ".1f"),
            fmt("max_err", ".2e"), fmt("rel_l2", ".2e"), str(r.get("check", "")),
            str(r.get("timing_samples", "")), r["file"]]) + " |")
    return lines


def dropin_section(path: str) -> list:
    doc = load_json(path)
    rows = check_rows(path, doc, DROPIN_FIELDS)
    lines = [
        "## Python drop-in against the reference PyTorch implementation",
        "",
        f"`swa_decode.native_swa_decode_attention` against the reference PyTorch implementation "
        f"(`native_swa_decode_attention`, whose `_fallback_batched_sdp` is timed), by "
        f"`python/bench_vs_seed.py` on {doc.get('device', 'an unknown device')} at commit "
        f"{str(doc.get('commit', 'unknown'))[:7]} ({relative(path)}). The drop-in is replayed from a "
        f"CUDA graph; the reference cannot be captured (its boolean-mask assignment synchronizes "
        f"with the host), so it runs eagerly.",
        "",
        "| H | T | reference us | drop-in eager us | drop-in graph us | speedup (graph) "
        "| rel_l2 vs reference |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['H']} | {r['T']} | {r['seed_us']:.0f} | {r['dropin_eager_us']:.1f} | "
                     f"{r['dropin_graph_us']:.1f} | {r['seed_us'] / r['dropin_graph_us']:.0f}x | "
                     f"{r['rel_l2_vs_seed']:.2e} |")
    return lines


def write_markdown(bench: Bench, peers: list, svg_path, dropin_path, path: str) -> None:
    files = ", ".join(f"`{relative(p)}`" for p in bench.paths)
    copy_range = sorted({f"{gbps / 1000:.2f}" for gbps in bench.copy_gbps})
    copy = "-".join(copy_range[::max(1, len(copy_range) - 1)]) + " TB/s" if copy_range else "not recorded"
    lines = [
        "# Measured results",
        "",
        f"Generated by `python3 scripts/plot_bench.py` from {files}"
        + (" and " + ", ".join(f"`{relative(p.path)}`" for p in peers) if peers else "")
        + "; to change it, change the JSON and rerun the script.",
        "",
        f"Device: {bench.device}. Commit: {bench.commit}. Copy bandwidth measured in the same runs: {copy}.",
        "",
    ]
    if svg_path:
        picture = os.path.relpath(os.path.abspath(svg_path), os.path.dirname(os.path.abspath(path)))
        lines += [f"![time and ratio to the floor against T]({picture})", ""]
    lines += [
        "Each row is one `swa-decode bench` measurement (`scripts/bench.sh --kernel all --json FILE`): a "
        "realistic DeepSeek-V4 decode batch (contexts up to 8192 tokens, 256-token blocks scattered over "
        "the pool, unused cache slots and scales NaN, sinks and LSE on). `us` is the median CUDA-graph "
        "replay time with the inputs rotated through sets larger than L2; `floor_us` the bytes that must "
        "move divided by the copy bandwidth measured in the same run; `ratio` = us / floor_us; `rel_l2` "
        "the error against the float64 reference, checked on the tokens the bench scans (the reference "
        "PyTorch implementation's own error is 3.2e-3).",
        "",
        "## Per H and T: each kernel family against the floor" + (" and the peers" if peers else ""),
        "",
        "In bold the family `decode()` picks (where the JSON records it, else the faster one).",
        "",
        *comparison_table(bench, peers, bench.heads, bench.tokens),
        "",
    ]
    if peers:
        lines += ["Peers, measured on the same GPU:", "", *peer_notes(peers), ""]
    lines += ["## Every row", "", *every_row_table(bench), ""]
    if dropin_path:
        lines += [*dropin_section(dropin_path), ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def dropin_sentence(path: str) -> str:
    doc = load_json(path)
    rows = check_rows(path, doc, DROPIN_FIELDS)
    pairs = "; ".join(f"H = {r['H']}, T = {r['T']}: {r['dropin_graph_us']:.1f} us against "
                      f"{r['seed_us'] / 1000:.1f} ms" for r in rows)
    return ("The Python drop-in (`swa_decode.native_swa_decode_attention`, replayed from a CUDA graph) "
            f"against the reference PyTorch implementation: {pairs}.")


def update_readme(bench: Bench, peers: list, dropin_path, path: str) -> bool:
    with open(path) as f:
        text = f.read()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        return False
    heads = [h for h in README_HEADS if h in bench.heads]
    tokens = [t for t in README_TOKENS if t in bench.tokens]
    block = [
        README_BEGIN,
        f"Measured on one {bench.device} (commit {bench.commit}); {bench.shape}, sinks and LSE on, "
        "`us` the median CUDA-graph replay time, `x floor` the time over the copy-bandwidth floor. "
        "In bold the family `decode()` picks (where the JSON records it, else the faster one).",
        "",
        *comparison_table(bench, peers, heads, tokens),
        "",
    ]
    if dropin_path:
        block += [dropin_sentence(dropin_path), ""]
    text = text[:begin] + "\n".join(block) + text[end:]
    with open(path, "w") as f:
        f.write(text)
    return True


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="bench JSON files (default: the newest vN_h*.json set)")
    parser.add_argument("--peers", nargs="*", default=None,
                        help="peer JSON files (default: bench/results/peers_*.json)")
    parser.add_argument("--svg", default=os.path.join(REPO, "docs", "bench.svg"), help="'' to skip")
    parser.add_argument("--markdown", default=os.path.join(REPO, "docs", "results.md"), help="'' to skip")
    parser.add_argument("--readme", default=os.path.join(REPO, "README.md"), help="'' to skip")
    parser.add_argument("--dropin", default=os.path.join(RESULTS, "python_vs_seed.json"),
                        help="python/bench_vs_seed.py JSON for the markdown ('' to skip)")
    args = parser.parse_args(argv)

    bench = Bench(args.files or newest_bench_files())
    peer_paths = args.peers
    if peer_paths is None:
        peer_paths = sorted(glob.glob(os.path.join(RESULTS, "peers_*.json")))
    peers = []
    for path in peer_paths:
        peer = Peer(path)
        if peer.device in bench.devices:
            peers.append(peer)
        else:
            print(f"plot_bench.py: {relative(path)} was measured on {peer.device}, not on "
                  f"{bench.device}: left out", file=sys.stderr)

    if args.svg:
        with open(args.svg, "w") as f:
            f.write(draw_svg(bench, peers))
        print(f"wrote {relative(args.svg)}")
    dropin = args.dropin if args.dropin and os.path.exists(args.dropin) else None
    if args.markdown:
        write_markdown(bench, peers, args.svg or None, dropin, args.markdown)
        print(f"wrote {relative(args.markdown)}")
    if args.readme and update_readme(bench, peers, dropin, args.readme):
        print(f"updated the bench table in {relative(args.readme)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
