#!/usr/bin/env python3
"""Draws and tabulates `swa-decode bench` results from bench/results/*.json.

    python3 scripts/plot_bench.py                     # the newest sets (highest vN_h*.json, layers)
    python3 scripts/plot_bench.py bench/results/v12_h*.json --svg /tmp/v12.svg

Writes, from the window-only rows (the files given, else the newest vN_hH.json set):
  --svg        (docs/bench.svg)   time and ratio to the floor against T, log-log, one line per H and
                                  kernel family, plus the peers' figures (dotted)
  --markdown   (docs/results.md)  every row, and per H and T each family next to the floor and peers
  --readme     (README.md)        the short tables between the bench-table, layer-table and
                                  format-table markers, where they are there
and from the layer rows (--layers, default the newest vN_c4a*_hH.json / vN_c128a*_hH.json of each
layer, label and H among the last two versions, newest_per_shape; each file one layer at one H;
`swa-decode bench --layer c4a|c128a`):
  --layers-svg (docs/bench_layers.svg)  time against T per layer, each family, its floor and the peers
  the layer section of --markdown and the README's layer table
and from the layer files of both cache formats (--formats, default the newest seed and MODEL1 file
of each layer, label and H among the last two versions, where one is vN_model1_LAYER[_LABEL]_hH.json,
paired by layer, label and H; `swa-decode bench --layer swa|c4a|c128a --format seed|model1`):
  the format section of --markdown and the README's format table: each format's pick against its
  own floor at the same layer, H and T, and MODEL1's ratio over seed's
and, in --markdown and the README, the eager host time per call (--eager, python/bench_eager.py).
The seed tables take seed rows alone (a row's "format"; older files have none: seed); --results DIR
looks the default files up in DIR instead of bench/results.

Peers (--peers, default bench/results/peers_*.json) are figures measured with other libraries:
{"peer": NAME, "device": DEVICE, "rows": [{"H", "T", "us", "source"}]}, a row with "layer" other
than "swa" also naming its "extra_entries" (per row); only peers measured on the bench's device are
drawn; the format table sets them beside the MODEL1 rows alone (FlashMLA's were measured on MODEL1
caches). Python standard library only (the SVG is written by hand), so it runs anywhere without an
install.
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
# One `swa-decode bench --layer L [--format model1] --json` file per version, format (a model1_
# prefix; none: seed), layer, optional label (e.g. the context: 64k, 1m) and H: v15_c4a_h128.json,
# v15_c128a_64k_h128.json, v16_model1_swa_h64.json. Groups: version, "model1" or None, layer,
# label or None, H.
LAYER_NAME = re.compile(r"^v(\d+)_(?:(model1)_)?(swa|c4a|c128a)(?:_([0-9a-z]+))?_h(\d+)\.json$")
# The layers of the seed layer section (the window alone rides the vN_hH set there); the format
# section takes every layer. Listed in the order the sections show them.
SEED_SECTION_LAYERS = ("c4a", "c128a")
LAYER_TITLES = {"swa": "SWA", "c4a": "C4A", "c128a": "C128A"}
# A row's "format" (`swa-decode bench --format`): the cache rows it read. Files written before
# --format existed have no such field and were seed.
FORMATS = ("seed", "model1")
FORMAT_TITLES = {"seed": "seed", "model1": "MODEL1"}
# A peer's layer rows match a bench file when their extra entries per row are within this factor
# of the file's mean: the bench draws each row's count (C4A: top-k of a context / 4 that may be
# shorter, 0.94-0.97 of the top-k in v15) where a peer states the nominal count.
PEER_EXTRA_TOLERANCE = 1.25

# The README's short table: the most heads and half of it, at one, a few and many decode rows.
README_HEADS = (128, 64, 16, 8)
README_TOKENS = (1, 32, 128, 2048)
README_BEGIN = "<!-- bench-table:begin (python3 scripts/plot_bench.py rewrites this block) -->"
README_END = "<!-- bench-table:end -->"
# The README's layer table: (layer, file label, H, T) for DeepSeek-V4's two compressed layers at
# full heads, and C4A at half of them at the largest T.
README_LAYER_ROWS = (("c4a", "", 128, (128, 2048)), ("c128a", "64k", 128, (128, 2048)),
                     ("c4a", "", 64, (2048,)))
README_LAYER_BEGIN = "<!-- layer-table:begin (python3 scripts/plot_bench.py rewrites this block) -->"
README_LAYER_END = "<!-- layer-table:end -->"
# The README's format table: each layer file pair (seed and MODEL1 at one layer and H) at these T
# and at the largest T both formats measured.
README_FORMAT_TOKENS = (128,)
README_FORMAT_BEGIN = "<!-- format-table:begin (python3 scripts/plot_bench.py rewrites this block) -->"
README_FORMAT_END = "<!-- format-table:end -->"

# Okabe-Ito colours (distinct for colour-blind readers), one per H; dash patterns, one per family.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
FAMILY_DASHES = ("", "8 4", "3 3", "12 3 3 3")
PEER_DASH = "1.5 3.5"

BENCH_FIELDS = ("H", "T", "us", "floor_us", "ratio", "kernel")
PEER_FIELDS = ("H", "T", "us", "source")
DROPIN_FIELDS = ("T", "H", "seed_us", "dropin_eager_us", "dropin_graph_us", "rel_l2_vs_seed")
LAYER_FIELDS = BENCH_FIELDS + ("layer", "context", "extra_entries", "bound", "tflops", "selected")
EAGER_FIELDS = ("entry", "T", "H", "host_us")


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------

def load_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"plot_bench.py: cannot read {path}: {e}")


def row_format(path: str, i: int, row: dict) -> str:
    fmt = row.get("format", "seed")
    if fmt not in FORMATS:
        raise SystemExit(f"plot_bench.py: {path}: rows[{i}].format must be one of {', '.join(FORMATS)} "
                         f"(or absent: seed), got {fmt!r}")
    return fmt


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


def newest_version(results: str, pattern: str, name, keep=lambda match: True) -> list:
    """The files in `results` matching glob `pattern`, regex `name` (group 1: the version) and
    `keep` (of the match) of the highest version, or [] where none match."""
    by_version = {}
    for path in glob.glob(os.path.join(results, pattern)):
        match = name.match(os.path.basename(path))
        if match and keep(match):
            by_version.setdefault(int(match.group(1)), []).append(path)
    return sorted(by_version[max(by_version)]) if by_version else []


# A sweep may re-measure only the layer files a change could move (session 26 re-ran the layer
# kernel's files, not the window kernel's or C128A 1M): a layer table takes, for each format, layer,
# label and H, the file of the newest of the last SWEEPS_TO_MERGE versions that has one. Older
# shapes do not come back (v16's MODEL1 C128A 1M).
SWEEPS_TO_MERGE = 2


def newest_per_shape(results: str, pattern: str, keep=lambda match: True) -> list:
    """The layer files in `results` matching glob `pattern` and `keep` (of LAYER_NAME's match):
    for each format, layer, label and H, that of the highest version among the SWEEPS_TO_MERGE
    highest, or [] where none match."""
    matches = [(LAYER_NAME.match(os.path.basename(p)), p) for p in glob.glob(os.path.join(results, pattern))]
    matches = [(m, p) for m, p in matches if m and keep(m)]
    recent = sorted({int(m.group(1)) for m, _ in matches})[-SWEEPS_TO_MERGE:]
    by_shape = {}
    for m, path in matches:
        version = int(m.group(1))
        shape = m.groups()[1:]
        if version in recent and version > by_shape.get(shape, (-1, ""))[0]:
            by_shape[shape] = (version, path)
    return sorted(path for _, path in by_shape.values())


def newest_bench_files(results: str) -> list:
    paths = newest_version(results, "v*_h*.json", BENCH_NAME)
    if not paths:
        raise SystemExit(f"plot_bench.py: no vN_hH.json files in {results}")
    return paths


def newest_layer_files(results: str) -> list:
    """The newest seed layer files (vN_c4a_hH.json, vN_c128a_LABEL_hH.json), if any
    (newest_per_shape)."""
    return newest_per_shape(results, "v*_c*_h*.json",
                            lambda m: m.group(2) is None and m.group(3) in SEED_SECTION_LAYERS)


def newest_format_files(results: str) -> list:
    """The newest layer files, seed and MODEL1 (vN_model1_LAYER[_LABEL]_hH.json beside
    vN_LAYER[_LABEL]_hH.json; newest_per_shape), if any MODEL1 one is among them."""
    paths = newest_per_shape(results, "v*_*_h*.json")
    if not any(LAYER_NAME.match(os.path.basename(p)).group(2) == "model1" for p in paths):
        return []
    return paths


KERNEL_FAMILIES = ("few_heads", "portable", "sm90")  # the records' families (src/dispatch/*_record.cpp)


def family(kernel: str) -> str:
    """portable_mma_g1_split4 -> portable, few_heads_n16 -> few_heads: the kernel names are
    <family>_<variant>."""
    return next((f for f in KERNEL_FAMILIES if kernel.startswith(f + "_")), kernel.split("_")[0])


class Bench:
    """The rows of the given bench files, with the device, commits and copy bandwidths they name;
    every row of a format in `formats` (the seed tables take seed rows alone)."""

    def __init__(self, paths, fields=BENCH_FIELDS, formats=("seed",)):
        self.paths = list(paths)
        self.rows = []
        self.devices, self.commits, self.copy_gbps, self.matmul_tflops = OrderedDict(), OrderedDict(), [], []
        for path in self.paths:
            doc = load_json(path)
            for i, row in enumerate(check_rows(path, doc, fields)):
                fmt = row_format(path, i, row)
                if fmt not in formats:
                    raise SystemExit(f"plot_bench.py: {path}: rows[{i}].format is {fmt!r}, but this table "
                                     f"takes {' and '.join(map(repr, formats))} rows only (a MODEL1 file goes "
                                     "to the format table: --formats)")
                self.rows.append(dict(row, format=fmt, file=os.path.splitext(os.path.basename(path))[0]))
            self.devices[doc.get("device", "unknown device")] = None
            commit = str(doc.get("commit", "unknown"))[:7] + ("-dirty" if doc.get("commit_dirty") else "")
            self.commits[commit] = None
            if doc.get("copy_gbps"):
                self.copy_gbps.append(float(doc["copy_gbps"]))
            if doc.get("matmul_tflops"):
                self.matmul_tflops.append(float(doc["matmul_tflops"]))
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
        r = self.floor_row(heads, tokens)
        return r["floor_us"] if r else None

    def floor_row(self, heads: int, tokens: int):
        for r in self.rows:
            if r["H"] == heads and r["T"] == tokens and r["floor_us"]:
                return r
        return None


class LayerSet(Bench):
    """One layer file: one layer at one H in one format (`swa-decode bench --layer L --format F`),
    its rows and its peers."""

    def __init__(self, path: str, formats=("seed",)):
        super().__init__([path], LAYER_FIELDS, formats)
        match = LAYER_NAME.match(os.path.basename(path))
        self.layer = self.rows[0]["layer"]
        self.label = (match.group(4) or "") if match else ""
        self.num_heads = self.rows[0]["H"]
        self.format = self.rows[0]["format"]
        if {r["layer"] for r in self.rows} != {self.layer} or set(self.heads) != {self.num_heads}:
            raise SystemExit(f"plot_bench.py: {path}: expected one layer at one H, got layers "
                             f"{sorted({r['layer'] for r in self.rows})} and H {self.heads}")
        formats_read = sorted({r["format"] for r in self.rows})
        if formats_read != [self.format]:
            raise SystemExit(f"plot_bench.py: {path}: expected rows of one format, got formats {formats_read}")
        named = (match.group(2) or "seed") if match else self.format
        if named != self.format:
            raise SystemExit(f"plot_bench.py: {path}: the name says format {named!r} (a model1_ prefix or "
                             f"none), but its rows' format is {self.format!r}")
        self.mean_context = sum(r["context"] for r in self.rows) / len(self.rows)
        self.mean_extra = sum(r["extra_entries"] for r in self.rows) / len(self.rows)
        self.peer_extra = {}  # peer name -> the extra entries of its matching rows

    @property
    def title(self) -> str:
        """e.g. "C128A, H = 128, mean context 1.07M: window 128 + 8123 compressed entries per row"."""
        return f"{LAYER_TITLES.get(self.layer, self.layer)}, H = {self.num_heads}, {self.shape_text}"

    @property
    def shape_text(self) -> str:
        """e.g. "mean context 1.07M: window 128 + 8123 compressed entries per row"."""
        context = (f"{self.mean_context / 1e6:.2f}M" if self.mean_context >= 1e6
                   else f"{self.mean_context / 1e3:.1f}k")
        windows = sorted({r["W"] for r in self.rows if "W" in r})
        window = "/".join(map(str, windows)) or "W"
        return f"mean context {context}: window {window} + {self.mean_extra:.0f} compressed entries per row"

    @property
    def name(self) -> str:
        """e.g. "C4A", "C128A 64k", "C128A 1M" (a file label 1m: a 1M context)."""
        label = self.label[:-1] + "M" if self.label.endswith("m") else self.label
        return LAYER_TITLES.get(self.layer, self.layer) + (f" {label}" if label else "")

    @property
    def short_title(self) -> str:
        return f"{self.name}, H = {self.num_heads}"

    def match_peers(self, peers: list) -> None:
        for p in peers:
            if self.layer == "swa":
                # The window alone: the peer's window-only rows at this H (no extra entries to match).
                if any(p.us(self.num_heads, t) is not None for t in self.tokens):
                    self.peer_extra[p.name] = None
                continue
            extra = p.layer_extra(self.layer, self.num_heads, self.mean_extra)
            if extra is not None:
                self.peer_extra[p.name] = extra

    def peer_us(self, peer, tokens: int):
        if peer.name not in self.peer_extra:
            return None
        if self.layer == "swa":
            return peer.us(self.num_heads, tokens)
        return peer.layer_us(self.layer, self.num_heads, self.peer_extra[peer.name], tokens)

    def peer_columns(self, peers: list) -> list:
        return [(p.name, lambda h, t, p=p: self.peer_us(p, t)) for p in peers if p.name in self.peer_extra]


def layer_order(ls: LayerSet):
    """SWA, C4A, C128A, then by mean context, then the most heads first."""
    order = list(LAYER_TITLES)
    return (order.index(ls.layer) if ls.layer in order else len(order), ls.mean_context, -ls.num_heads)


class FormatPair:
    """One layer (and file label) at one H in both cache formats: format -> its LayerSet, either
    format possibly missing."""

    def __init__(self, sets: dict):
        self.sets = sets
        first = next(iter(sets.values()))
        self.layer, self.label, self.num_heads, self.name = first.layer, first.label, first.num_heads, first.name
        self.tokens = sorted({t for ls in sets.values() for t in ls.tokens})

    def pick(self, fmt: str, tokens: int):
        """decode()'s pick in format `fmt` at T, or None."""
        ls = self.sets.get(fmt)
        return picked({f: ls.row(ls.num_heads, tokens, f) for f in ls.families}) if ls else None

    def ratio_over_seed(self, tokens: int):
        """MODEL1's pick's ratio to its floor over seed's at T (None where either is missing)."""
        seed, model1 = self.pick("seed", tokens), self.pick("model1", tokens)
        if seed and model1 and seed.get("ratio") and model1.get("ratio"):
            return model1["ratio"] / seed["ratio"]
        return None

    def peer_us(self, peer, tokens: int):
        """The peer's time at T, matched to the MODEL1 set alone: the peers were measured on MODEL1
        caches, so no seed row stands in for it."""
        ls = self.sets.get("model1")
        return ls.peer_us(peer, tokens) if ls else None


def format_pairs(paths, peers: list) -> list:
    """The layer files of both formats paired by layer, file label and H, in layer_order."""
    by_key = OrderedDict()
    for ls in sorted((LayerSet(path, FORMATS) for path in paths), key=layer_order):
        pair = by_key.setdefault((ls.layer, ls.label, ls.num_heads), {})
        if ls.format in pair:
            raise SystemExit(f"plot_bench.py: {ls.paths[0]} and {pair[ls.format].paths[0]}: two "
                             f"{FORMAT_TITLES[ls.format]} files of {ls.short_title}; expected one per "
                             "format, layer, file label and H")
        pair[ls.format] = ls
        ls.match_peers([p for p in peers if p.device in ls.devices])
    return [FormatPair(sets) for sets in by_key.values()]


def picked(rows: dict):
    """The row decode() picks among one H and T's family rows: where the JSON records it (its
    "selected" field), else the fastest."""
    present = [r for r in rows.values() if r]
    for r in present:
        if r.get("selected"):
            return r
    if any("selected" in r for r in present):
        return None
    return min(present, key=lambda r: r["us"], default=None)


class Peer:
    def __init__(self, path: str):
        doc = load_json(path)
        self.path = path
        self.name = doc.get("peer") or os.path.splitext(os.path.basename(path))[0]
        self.device = doc.get("device", "unknown device")
        self.rows = check_rows(path, doc, PEER_FIELDS)
        for i, r in enumerate(self.rows):
            if r.get("layer", "swa") != "swa" and "extra_entries" not in r:
                raise SystemExit(f"plot_bench.py: {path}: rows[{i}] (layer {r['layer']}) lacks extra_entries")

    def us(self, heads: int, tokens: int):
        """The window-only figure at H and T."""
        for r in self.rows:
            if r.get("layer", "swa") == "swa" and r["H"] == heads and r["T"] == tokens:
                return r["us"]
        return None

    def layer_extra(self, layer: str, heads: int, mean_extra: float):
        """The extra entries of this peer's rows for `layer` at H nearest a bench file's mean, if
        within PEER_EXTRA_TOLERANCE of it."""
        counts = {r["extra_entries"] for r in self.rows if r.get("layer") == layer and r["H"] == heads}
        near = [c for c in counts if mean_extra > 0 and 1 / PEER_EXTRA_TOLERANCE <= c / mean_extra
                <= PEER_EXTRA_TOLERANCE]
        return min(near, key=lambda c: abs(math.log(c / mean_extra)), default=None)

    def layer_us(self, layer: str, heads: int, extra: float, tokens: int):
        for r in self.rows:
            if (r.get("layer") == layer and r["H"] == heads and r["extra_entries"] == extra
                    and r["T"] == tokens):
                return r["us"]
        return None

    def sources(self, layer: str = "swa", heads=None, extra=None) -> list:
        """The sources of the rows of one layer (at H and extra entries, where given)."""
        return list(OrderedDict((r["source"], None) for r in self.rows
                                if r.get("layer", "swa") == layer and heads in (None, r["H"])
                                and extra in (None, r.get("extra_entries"))))


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
        if marker:
            out += [marker_svg(marker, self.x(t), self.y(v), colour) for t, v in points]
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
    legend = legend_row(lefts[0], legend_y, "heads:",
                        [(colour[h], 4, None, None, f"H = {h}") for h in bench.heads])
    styles = [("#333", 2, dash[f], "circle", f"swa-decode {f}") for f in bench.families]
    styles += [("#333", 2, PEER_DASH, "square", f"{p.name} (same GPU)") for p in peers]
    legend += legend_row(lefts[0], legend_y + 24, "lines:", styles)

    subtitle = (f"{bench.device}, commit {bench.commit}: {bench.shape}, realistic decode batches, "
                "median CUDA-graph replay time")
    if peers:
        subtitle2 = ("peers (dotted, squares) measured on the same GPU; their ratio uses this "
                     "library's floor for the same H and T")
    else:
        subtitle2 = ""
    return svg_document(width, legend_y + 54, lefts[0],
                        "swa-decode: sliding-window decode attention, time and ratio to the floor against T",
                        (subtitle, subtitle2), body + legend)


def draw_layers_svg(sets: list, peers: list) -> str:
    """One panel per layer set, two a row: time against T for each family, its floor and the peers."""
    width, panel_w, panel_h, top, row_h = 1000, 390, 260, 100, 350
    lefts = (80, 580)
    families = sorted({f for ls in sets for f in ls.families})
    colour = {f: COLOURS[i % len(COLOURS)] for i, f in enumerate(families)}
    peer_colour = {p.name: COLOURS[(len(families) + i) % len(COLOURS)] for i, p in enumerate(peers)}
    floor_colour, floor_dash = "#888", "2 3"
    body = []
    for i, ls in enumerate(sets):
        left, panel_top = lefts[i % 2], top + (i // 2) * row_h
        floors = [(t, ls.floor_us(ls.num_heads, t)) for t in ls.tokens]
        lines = [(colour[f], FAMILY_DASHES[0], "circle",
                  [(t, r["us"]) for t in ls.tokens if (r := ls.row(ls.num_heads, t, f))]) for f in ls.families]
        lines += [(peer_colour[p.name], PEER_DASH, "square", [(t, ls.peer_us(p, t)) for t in ls.tokens])
                  for p in peers if p.name in ls.peer_extra]
        lines.append((floor_colour, floor_dash, None, floors))
        values = [v for *_, points in lines for _, v in points if v]
        panel = Panel(left, panel_top, panel_w, panel_h, ls.tokens, values, "time per call (us, log scale)")
        body += panel.frame(f"{ls.short_title}: 128 + {ls.mean_extra:.0f} entries per row")
        for line_colour, pattern, marker, points in lines:
            body += panel.line(points, line_colour, pattern, marker)

    legend_y = top + ((len(sets) + 1) // 2) * row_h - 20
    styles = [(colour[f], 2, FAMILY_DASHES[0], "circle", f"swa-decode {f}") for f in families]
    styles += [(peer_colour[p.name], 2, PEER_DASH, "square", f"{p.name} (same GPU)") for p in peers
               if any(p.name in ls.peer_extra for ls in sets)]
    legend = legend_row(lefts[0], legend_y, "lines:", styles)
    legend += legend_row(lefts[0], legend_y + 24, "",
                         [(floor_colour, 2, floor_dash, None, "floor: the larger of the memory and compute floors")])
    every = Bench([p for ls in sets for p in ls.paths], LAYER_FIELDS)
    subtitle = (f"{every.device}, commit {every.commit}: the window (128 entries) and the compressed entries "
                "in one softmax, D = 512, median CUDA-graph replay time")
    subtitle2 = ("C4A: a top-k of the context / 4 entries; C128A: every one of the context / 128 "
                 "(64k and 1M mean contexts); peers measured on the same GPU")
    return svg_document(width, legend_y + 54, lefts[0],
                        "swa-decode: DeepSeek-V4 attention layers, time per call against T",
                        (subtitle, subtitle2), body + legend)


def legend_row(left: float, y: float, title: str, styles) -> list:
    """A legend line: title, then (colour, stroke width, dash, marker or None, label) samples."""
    out = [text(left, y, "legend", title)]
    x = left + 52
    for colour, stroke_width, pattern, marker, label in styles:
        out.append(element("line", x1=x, y1=y - 4, x2=x + 40, y2=y - 4, stroke=colour,
                           stroke_width=stroke_width, stroke_dasharray=pattern or None))
        if marker:
            out.append(marker_svg(marker, x + 20, y - 4, colour))
        out.append(text(x + 48, y, "legend", label))
        x += 70 + 7 * len(label)  # 13 px text averages under 7 px a character
    return out


def svg_document(width: int, height: float, left: float, title: str, subtitles, body: list) -> str:
    height = int(math.ceil(height))
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
        f'<text x="{left}" y="24" class="title">{escape(title)}</text>',
        *[f'<text x="{left}" y="{44 + 16 * i}" class="sub">{escape(sub)}</text>'
          for i, sub in enumerate(subtitles) if sub],
        *body,
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


def window_peer_columns(peers: list) -> list:
    return [(p.name, p.us) for p in peers]


def comparison_table(bench: Bench, peer_columns: list, heads, tokens, layer: bool = False) -> list:
    """One row per H and T: each family's time and ratio (decode()'s pick in bold), the floor, the
    peers (name, us at H and T). A layer table adds which floor binds and, for decode()'s pick, its
    time over each peer's and its TFLOP/s."""
    variants = {f: len({r["kernel"] for r in bench.rows if family(r["kernel"]) == f}) > 1
                for f in bench.families}
    header = ["H", "T", "floor us"] + (["bound"] if layer else [])
    for f in bench.families:
        header += ([f"{f} kernel"] if variants[f] else []) + [f"{f} us", "x floor"]
    header += [f"{name} us" for name, _ in peer_columns]
    if layer:
        header += [f"pick / {name}" for name, _ in peer_columns] + ["pick TFLOP/s"]
    align = ["---:"] * 3 + (["---"] if layer else [])
    for f in bench.families:
        align += (["---"] if variants[f] else []) + ["---:", "---:"]
    align += ["---:"] * (len(header) - len(align))
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for h in heads:
        for t in tokens:
            rows = {f: bench.row(h, t, f) for f in bench.families}
            if not any(rows.values()):
                continue
            pick = picked(rows)
            floor = bench.floor_row(h, t)
            cells = [str(h), str(t), f"{floor['floor_us']:.2f}" if floor else ""]
            if layer:
                cells.append(floor.get("bound", "") if floor else "")
            for f in bench.families:
                r = rows[f]
                if variants[f]:
                    cells.append(f"`{r['kernel']}`" if r else "")
                us, ratio = (us_cell(r["us"]), ratio_cell(r["ratio"])) if r else ("", "")
                if r and len([x for x in rows.values() if x]) > 1 and r is pick:
                    us, ratio = f"**{us}**", f"**{ratio}**"
                cells += [us, ratio]
            peer_us = [of(h, t) for _, of in peer_columns]
            cells += [us_cell(us) for us in peer_us]
            if layer:
                cells += [ratio_cell(pick["us"] / us) if pick and us else "" for us in peer_us]
                cells.append(f"{pick['tflops']:.0f}" if pick and pick.get("tflops") is not None else "")
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


def layer_section(sets: list, peers: list, svg_path, markdown_path: str) -> list:
    if not sets:
        return []
    every = Bench([p for ls in sets for p in ls.paths], LAYER_FIELDS)
    tflops = sorted({f"{x:.0f}" for x in every.matmul_tflops})
    lines = [
        "## Layers: the window and the compressed entries in one softmax",
        "",
        f"From {', '.join(f'`{relative(p)}`' for p in every.paths)} (`swa-decode bench --layer c4a|c128a "
        f"--kernel all`; `--help` says how each layer's batch is drawn). Device: {every.device}. Commit: "
        f"{every.commit}. Each row attends the window and a second source of compressed entries "
        "(`DecodeArgs::extra`) in one softmax. `floor_us` is the larger of the memory floor (bytes / "
        "copy bandwidth) and the compute floor (FLOPs / the bf16 matmul rate cuBLAS reached in the "
        f"same run: {'-'.join(tflops) or 'not recorded'} TFLOP/s); `bound` says which; `x floor` is each "
        "family's time over it. In bold the family `decode()` picks; `pick / FlashMLA` is its time over "
        "FlashMLA's, `pick TFLOP/s` its rate.",
        "",
    ]
    if svg_path:
        picture = os.path.relpath(os.path.abspath(svg_path), os.path.dirname(os.path.abspath(markdown_path)))
        lines += [f"![time per call against T per layer, each family, its floor and FlashMLA]({picture})", ""]
    for ls in sets:
        lines += [f"### {ls.title}", "", *comparison_table(ls, ls.peer_columns(peers), ls.heads, ls.tokens,
                                                            layer=True), ""]
        notes = [f"- {p.name}: " + "; ".join(p.sources(ls.layer, ls.num_heads, ls.peer_extra[p.name]))
                 for p in peers if p.name in ls.peer_extra]
        if notes:
            lines += notes + [""]
    failed = [r for r in every.rows if r.get("check") != "pass"]
    lines += [f"{len(every.rows) - len(failed)} of {len(every.rows)} rows passed the check against the "
              "float64 reference.", "", "### Every layer row", "", *every_row_table(every), ""]
    return lines


def format_kernels(pair: FormatPair, tokens: int) -> str:
    """What decode() runs at T: one kernel, or each format's where they differ."""
    kernels = OrderedDict((fmt, r["kernel"]) for fmt in FORMATS if (r := pair.pick(fmt, tokens)))
    if len(set(kernels.values())) == 1:
        return f"`{next(iter(kernels.values()))}`"
    return ", ".join(f"{FORMAT_TITLES[fmt]} `{k}`" for fmt, k in kernels.items())


def format_peers(pairs: list, peers: list) -> list:
    """The peers matched to any pair's MODEL1 set."""
    return [p for p in peers if any(p.name in pair.sets["model1"].peer_extra
                                    for pair in pairs if "model1" in pair.sets)]


def format_table(pairs: list, peers: list, tokens_of) -> list:
    """One row per pair and T in tokens_of(pair): each format's pick, its time, its own floor (and
    which binds) and its time over that floor, MODEL1's ratio over seed's, and each peer's time
    beside MODEL1's with MODEL1's pick over it."""
    header = ["layer", "H", "T", "`decode()` runs"]
    for fmt in FORMATS:
        header += [f"{FORMAT_TITLES[fmt]} us", f"{FORMAT_TITLES[fmt]} floor us", f"{FORMAT_TITLES[fmt]} x floor"]
    header += ["MODEL1 x floor / seed x floor"]
    header += [f"{p.name} us (MODEL1)" for p in peers] + [f"MODEL1 / {p.name}" for p in peers]
    lines = ["| " + " | ".join(header) + " |", "|---|---:|---:|---|" + "---:|" * (len(header) - 4)]
    for pair in pairs:
        for t in tokens_of(pair):
            picks = {fmt: pair.pick(fmt, t) for fmt in FORMATS}
            if not any(picks.values()):
                continue
            cells = [pair.name, str(pair.num_heads), str(t), format_kernels(pair, t)]
            for fmt in FORMATS:
                r = picks[fmt]
                floor = (f"{r['floor_us']:.2f} ({r['bound']})" if r and r.get("floor_us") is not None
                         else "")
                cells += [us_cell(r["us"]) if r else "", floor, ratio_cell(r["ratio"]) if r else ""]
            over_seed = pair.ratio_over_seed(t)
            cells.append(f"{over_seed:.2f}" if over_seed else "")
            peer_us = [pair.peer_us(p, t) for p in peers]
            model1 = picks["model1"]
            cells += [us_cell(us) for us in peer_us]
            cells += [ratio_cell(model1["us"] / us) if model1 and model1.get("us") and us else ""
                      for us in peer_us]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_summary(pairs: list) -> str:
    """MODEL1 / seed (each over its own floor) over every layer, H and T timed in both formats, where
    it is smallest and largest, and how many rows pass their check."""
    ratios = [(x, pair, t) for pair in pairs for t in pair.tokens if (x := pair.ratio_over_seed(t))]
    rows = [r for pair in pairs for ls in pair.sets.values() for r in ls.rows]
    failed = len([r for r in rows if r.get("check") != "pass"])
    correct = ("every row of either format passes its check against the float64 reference" if not failed
               else f"{failed} of {len(rows)} rows fail their check against the float64 reference")
    if not ratios:
        return f"No layer, H and T has timings in both formats; {correct}."
    lo, hi = min(ratios, key=lambda x: x[0]), max(ratios, key=lambda x: x[0])
    return (f"MODEL1's ratio to its floor over seed's, over the {len(ratios)} layer, H and T combinations "
            f"timed in both formats: {lo[0]:.2f} ({lo[1].name}, H = {lo[1].num_heads}, T = {lo[2]}) to {hi[0]:.2f} "
            f"({hi[1].name}, H = {hi[1].num_heads}, T = {hi[2]}); {correct}.")


# What the format table's columns mean, for docs/results.md and the README alike.
FORMAT_EXPLANATION = (
    "Each row puts `decode()`'s pick on seed cache rows beside its pick on MODEL1 rows (FlashMLA's "
    "layout, which vLLM and SGLang store; docs/semantics.md has its bytes) at the same layer, H and T, "
    "each format against its own floor: the larger of its memory floor (MODEL1's rows are larger, so its "
    "memory floor is higher) and the compute floor (the same for both), with the one that binds. "
    "`MODEL1 x floor / seed x floor` is 1 where MODEL1 runs as close to its floor as seed to its, above 1 "
    "where it is further. The peers' figures were measured on MODEL1 caches, so they sit beside the "
    "MODEL1 rows alone.")


def format_files(pairs: list) -> Bench:
    """Every row of every pair's files, for their devices, commits and paths."""
    return Bench([p for pair in pairs for ls in pair.sets.values() for p in ls.paths], LAYER_FIELDS, FORMATS)


def format_section(pairs: list, peers: list) -> list:
    if not pairs:
        return []
    every = format_files(pairs)
    shown = format_peers(pairs, peers)
    lines = [
        "## Cache formats: seed and MODEL1, each against its own floor",
        "",
        f"From {', '.join(f'`{relative(p)}`' for p in every.paths)} (`swa-decode bench "
        f"--layer swa|c4a|c128a --format seed|model1`). Device: {every.device}. Commit: {every.commit}. "
        + FORMAT_EXPLANATION,
        "",
        format_summary(pairs),
        "",
        *format_table(pairs, shown, lambda pair: pair.tokens),
        "",
    ]
    for pair in pairs:
        shapes = "; ".join(f"{FORMAT_TITLES[fmt]} {pair.sets[fmt].shape_text}" for fmt in FORMATS
                           if fmt in pair.sets)
        lines.append(f"- {pair.name}, H = {pair.num_heads}: {shapes}")
        model1 = pair.sets.get("model1")
        for p in shown:
            if model1 and p.name in model1.peer_extra:
                lines.append(f"  - {p.name}: " + "; ".join(p.sources(pair.layer, pair.num_heads,
                                                                    model1.peer_extra[p.name])))
    return lines + [""]


def readme_format_block(pairs: list, peers: list) -> list:
    """Each pair at README_FORMAT_TOKENS and at the largest T both formats measured; [""] (an empty
    block) where no layer file of either format was read."""
    if not pairs:
        return [""]

    def tokens_of(pair):
        both = [t for t in pair.tokens if all(pair.pick(fmt, t) for fmt in FORMATS)]
        return sorted({t for t in README_FORMAT_TOKENS if t in both} | set(both[-1:]))

    every = format_files(pairs)
    text = (f"Both cache formats, measured on one {every.device} (commit {every.commit}; `swa-decode bench "
            "--format seed|model1`). " + FORMAT_EXPLANATION + " " + format_summary(pairs))
    return [text, "", *format_table(pairs, format_peers(pairs, peers), tokens_of), ""]


def load_eager(path: str):
    doc = load_json(path)
    return doc, check_rows(path, doc, EAGER_FIELDS)


def eager_section(path: str) -> list:
    doc, rows = load_eager(path)
    shapes = list(OrderedDict(((r["H"], r["T"]), None) for r in rows))
    entries = list(OrderedDict((r["entry"], None) for r in rows))
    host = {(r["entry"], r["H"], r["T"]): r["host_us"] for r in rows}
    lines = [
        "## Eager Python call: host time",
        "",
        f"What the caller waits per eager call (no CUDA graph) before it can issue its next op, by "
        f"`python/bench_eager.py` on {doc.get('device', 'an unknown device')} at commit "
        f"{str(doc.get('commit', 'unknown'))[:7]} (torch {doc.get('torch', 'unknown')}, median of "
        f"{doc.get('calls', '?')} calls; {relative(path)}), in us; the GPU time of the call is not in it. "
        "`decode` is `swa_decode.decode(..., out=)`, `native_swa_decode_attention` the drop-in (which "
        "allocates its out), `torch.ops.swa_decode.decode_out` the custom op (what a traced call pays) and "
        "`_C.decode_exchange` the binding alone (the script's docstring has the details).",
        "",
        "| entry | " + " | ".join(f"H = {h}, T = {t}" for h, t in shapes) + " |",
        "|---|" + "---:|" * len(shapes),
    ]
    for e in entries:
        cells = [f"{host[(e, h, t)]:.1f}" if (e, h, t) in host else "" for h, t in shapes]
        lines.append(f"| `{e}` | " + " | ".join(cells) + " |")
    return lines


def eager_sentence(path: str) -> str:
    """decode()'s and the drop-in's host time at the most heads and fewest rows measured."""
    doc, rows = load_eager(path)
    h = max(r["H"] for r in rows)
    t = min(r["T"] for r in rows if r["H"] == h)
    host = {r["entry"]: r["host_us"] for r in rows if r["H"] == h and r["T"] == t}
    parts = [f"{host[e]:.1f} us for {name}" for e, name in
             (("decode", "`swa_decode.decode(..., out=)`"), ("native_swa_decode_attention", "the drop-in"))
             if e in host]
    return (f"An eager Python call (no CUDA graph) costs the host {' and '.join(parts)} at H = {h}, "
            f"T = {t} on the {doc.get('device', 'unknown device')} (`python/bench_eager.py`).")


def write_markdown(bench: Bench, peers: list, svg_path, dropin_path, path: str, layer_lines=(),
                   eager_path=None, format_lines=()) -> None:
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
        *comparison_table(bench, window_peer_columns(peers), bench.heads, bench.tokens),
        "",
    ]
    if peers:
        lines += ["Peers, measured on the same GPU:", "", *peer_notes(peers), ""]
    lines += ["## Every row", "", *every_row_table(bench), ""]
    lines += list(layer_lines)
    lines += list(format_lines)
    if dropin_path:
        lines += [*dropin_section(dropin_path), ""]
    if eager_path:
        lines += [*eager_section(eager_path), ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def dropin_sentence(path: str) -> str:
    doc = load_json(path)
    rows = check_rows(path, doc, DROPIN_FIELDS)
    pairs = "; ".join(f"H = {r['H']}, T = {r['T']}: {r['dropin_graph_us']:.1f} us against "
                      f"{r['seed_us'] / 1000:.1f} ms" for r in rows)
    return ("The Python drop-in (`swa_decode.native_swa_decode_attention`, replayed from a CUDA graph) "
            f"against the reference PyTorch implementation: {pairs}.")


def replace_block(text: str, begin_marker: str, end_marker: str, lines: list):
    """text with the block from begin_marker up to end_marker replaced, or None without the markers."""
    begin, end = text.find(begin_marker), text.find(end_marker)
    if begin < 0 or end < begin:
        return None
    return text[:begin] + "\n".join([begin_marker, *lines]) + text[end:]


def ratio_range(ratios: list) -> str:
    lo, hi = min(ratios), max(ratios)
    return f"{lo:.2g}x" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}-{hi:.2g}x"


def pick_over_peer(ls: LayerSet, peer, tokens: int):
    """decode()'s pick at T and its time over the peer's (None where either is missing)."""
    pick = picked({f: ls.row(ls.num_heads, tokens, f) for f in ls.families})
    us = ls.peer_us(peer, tokens)
    return pick, (pick["us"] / us if pick and us else None)


def readme_layer_block(sets: list, peers: list) -> list:
    """decode()'s pick per README_LAYER_ROWS row against its floor and the peers, and each peer's
    range of pick / peer there and over each other layer set."""
    by_key = {(ls.layer, ls.label, ls.num_heads): ls for ls in sets}
    shown = [(by_key[(layer, label, h)], tokens) for layer, label, h, tokens in README_LAYER_ROWS
             if (layer, label, h) in by_key]
    if not shown:
        return []
    header = ["layer", "H", "T", "`decode()` runs", "us", "x floor (bound)"]
    header += [f"{p.name} us" for p in peers] + [f"x {p.name}" for p in peers]
    lines = ["| " + " | ".join(header) + " |", "|---|---:|---:|---|" + "---:|" * (len(header) - 4)]
    for ls, tokens in shown:
        for t in tokens:
            pick = picked({f: ls.row(ls.num_heads, t, f) for f in ls.families})
            if not pick:
                continue
            over = [pick_over_peer(ls, p, t)[1] for p in peers]
            lines.append("| " + " | ".join(
                [ls.name, str(ls.num_heads),
                 str(t), f"`{pick['kernel']}`", us_cell(pick["us"]), f"{ratio_cell(pick['ratio'])} ({pick['bound']})"]
                + [us_cell(ls.peer_us(p, t)) for p in peers] + [ratio_cell(x) if x else "" for x in over]) + " |")
    rows = [r for ls, _ in shown for r in ls.rows]
    failed = len([r for r in rows if r.get("check") != "pass"])
    correct = ("every row passes its check against the float64 reference" if not failed
               else f"{failed} of {len(rows)} rows fail their check against the float64 reference")
    text = (f"Measured on one {sets[0].device} (commit {sets[0].commit}): the window (W = 128) and "
            "DeepSeek-V4's compressed entries in one softmax (`--layer c4a`: a top-k of the context / 4 "
            "entries; `--layer c128a`: every one of the context / 128), `x floor` the time over the larger of "
            f"the memory and the compute floor. On these layers {correct}")
    for p in peers:
        here = [x for ls, tokens in shown for t in tokens if (x := pick_over_peer(ls, p, t)[1])]
        if not here:
            continue
        elsewhere = []
        for ls in sets:
            xs = [x for t in ls.tokens if (x := pick_over_peer(ls, p, t)[1])]
            if xs and not any(ls is s for s, _ in shown):
                elsewhere.append(f"{ratio_range(xs)} for {ls.short_title} (T = {ls.tokens[0]}-{ls.tokens[-1]})")
        every_t = [x for ls, _ in shown for t in ls.tokens if (x := pick_over_peer(ls, p, t)[1])]
        faster = sum(1 for x in here if x < 1)
        verdict = (f"slower than {p.name} on every row below" if not faster
                   else f"faster than {p.name} on {faster} of the {len(here)} rows below")
        text += (f"; {verdict}: the library's time over {p.name}'s {ratio_range(here)} there, "
                 f"{ratio_range(every_t)} over every T measured of those layers"
                 + "".join(f", {e}" for e in elsewhere))
    return [text + ".", "", *lines, ""]


def update_readme(bench: Bench, peers: list, dropin_path, path: str, layer_sets=(), eager_path=None,
                  pairs=()) -> bool:
    with open(path) as f:
        text = f.read()
    heads = [h for h in README_HEADS if h in bench.heads]
    tokens = [t for t in README_TOKENS if t in bench.tokens]
    block = [
        f"Measured on one {bench.device} (commit {bench.commit}); {bench.shape}, sinks and LSE on, "
        "`us` the median CUDA-graph replay time, `x floor` the time over the copy-bandwidth floor. "
        "In bold the family `decode()` picks (where the JSON records it, else the faster one).",
        "",
        *comparison_table(bench, window_peer_columns(peers), heads, tokens),
        "",
    ]
    if dropin_path:
        block += [dropin_sentence(dropin_path), ""]
    if eager_path:
        block += [eager_sentence(eager_path), ""]
    window = replace_block(text, README_BEGIN, README_END, block)
    if window is None:
        return False
    layer_peers = [p for p in peers if any(p.name in ls.peer_extra for ls in layer_sets)]
    layers = replace_block(window, README_LAYER_BEGIN, README_LAYER_END,
                           readme_layer_block(list(layer_sets), layer_peers))
    layers = layers if layers is not None else window
    formats = replace_block(layers, README_FORMAT_BEGIN, README_FORMAT_END, readme_format_block(list(pairs), peers))
    with open(path, "w") as f:
        f.write(formats if formats is not None else layers)
    return True


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="bench JSON files (default: the newest vN_h*.json set)")
    parser.add_argument("--results", default=RESULTS,
                        help="the folder the defaults of the files, --peers, --layers, --formats, --dropin "
                             "and --eager are looked up in (default bench/results)")
    parser.add_argument("--peers", nargs="*", default=None,
                        help="peer JSON files (default: RESULTS/peers_*.json)")
    parser.add_argument("--svg", default=os.path.join(REPO, "docs", "bench.svg"), help="'' to skip")
    parser.add_argument("--markdown", default=os.path.join(REPO, "docs", "results.md"), help="'' to skip")
    parser.add_argument("--readme", default=os.path.join(REPO, "README.md"), help="'' to skip")
    parser.add_argument("--dropin", default=None,
                        help="python/bench_vs_seed.py JSON for the markdown (default "
                             "RESULTS/python_vs_seed.json; '' to skip)")
    parser.add_argument("--layers", nargs="*", default=None,
                        help="seed layer bench JSON files (default: the newest vN_c4a*/vN_c128a* set)")
    parser.add_argument("--formats", nargs="*", default=None,
                        help="layer bench JSON files of both formats, paired by layer, file label and H "
                             "for the format table (default: the newest version with a vN_model1_* file, "
                             "its seed and MODEL1 files)")
    parser.add_argument("--layers-svg", default=os.path.join(REPO, "docs", "bench_layers.svg"),
                        help="'' to skip")
    parser.add_argument("--eager", default=None,
                        help="python/bench_eager.py JSON for the markdown and the README (default "
                             "RESULTS/eager_h200.json; '' to skip)")
    args = parser.parse_args(argv)
    if args.dropin is None:
        args.dropin = os.path.join(args.results, "python_vs_seed.json")
    if args.eager is None:
        args.eager = os.path.join(args.results, "eager_h200.json")

    bench = Bench(args.files or newest_bench_files(args.results))
    peer_paths = args.peers
    if peer_paths is None:
        peer_paths = sorted(glob.glob(os.path.join(args.results, "peers_*.json")))
    peers = []
    for path in peer_paths:
        peer = Peer(path)
        if peer.device in bench.devices:
            peers.append(peer)
        else:
            print(f"plot_bench.py: {relative(path)} was measured on {peer.device}, not on "
                  f"{bench.device}: left out", file=sys.stderr)

    layer_paths = args.layers if args.layers is not None else newest_layer_files(args.results)
    layer_sets = sorted((LayerSet(path) for path in layer_paths), key=layer_order)
    for ls in layer_sets:
        ls.match_peers([p for p in peers if p.device in ls.devices])
    format_paths = args.formats if args.formats is not None else newest_format_files(args.results)
    pairs = format_pairs(format_paths, peers)

    if args.svg:
        with open(args.svg, "w") as f:
            f.write(draw_svg(bench, peers))
        print(f"wrote {relative(args.svg)}")
    layers_svg = args.layers_svg if layer_sets and args.layers_svg else None
    if layers_svg:
        with open(layers_svg, "w") as f:
            f.write(draw_layers_svg(layer_sets, peers))
        print(f"wrote {relative(layers_svg)}")
    dropin = args.dropin if args.dropin and os.path.exists(args.dropin) else None
    eager = args.eager if args.eager and os.path.exists(args.eager) else None
    if args.markdown:
        write_markdown(bench, peers, args.svg or None, dropin, args.markdown,
                       layer_section(layer_sets, peers, layers_svg, args.markdown), eager,
                       format_section(pairs, peers))
        print(f"wrote {relative(args.markdown)}")
    if args.readme and update_readme(bench, peers, dropin, args.readme, layer_sets, eager, pairs):
        print(f"updated the bench tables in {relative(args.readme)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
