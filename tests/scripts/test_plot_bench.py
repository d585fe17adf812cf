#!/usr/bin/env python3
"""scripts/plot_bench.py's format table and its format checks, on tiny hand-made bench files: the
seed and MODEL1 rows of a layer side by side, each over its own floor, the peers beside MODEL1 alone,
and no MODEL1 row in a seed table. Standard library only; run by ctest (PlotBench.*) or directly:
    python3 tests/scripts/test_plot_bench.py
"""

import contextlib
import importlib.util
import io
import json
import os
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = importlib.util.spec_from_file_location("plot_bench", os.path.join(REPO, "scripts", "plot_bench.py"))
plot_bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(plot_bench)

DEVICE = "Fake GPU"
README = "\n".join([
    "# readme", "",
    plot_bench.README_BEGIN, plot_bench.README_END, "",
    plot_bench.README_LAYER_BEGIN, plot_bench.README_LAYER_END, "",
    plot_bench.README_FORMAT_BEGIN, plot_bench.README_FORMAT_END, "",
    "after", "",
])


def layer_row(layer, fmt, heads, tokens, us, floor_us, bound="memory", extra=500):
    row = {"T": tokens, "H": heads, "W": 128, "layer": layer, "context": 2000.0, "extra_entries": extra,
           "us": us, "floor_us": floor_us, "ratio": us / floor_us, "bound": bound, "tflops": 1.0,
           "kernel": "sm90_wgmma_layer", "selected": True, "check": "pass"}
    if fmt is not None:
        row["format"] = fmt
    return row


class PlotBenchFormats(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        # The window-only set every run needs (the seed tables' rows); no format field: seed.
        self.write("v1_h64.json", [{"T": 128, "H": 64, "us": 30.0, "floor_us": 10.0, "ratio": 3.0,
                                    "kernel": "sm90_wgmma"}])
        self.write("peers_fake.json", [
            {"H": 64, "T": 128, "us": 20.0, "source": "fake window"},
            {"layer": "c4a", "H": 64, "T": 128, "us": 90.0, "extra_entries": 512, "source": "fake c4a"},
            {"layer": "c4a", "H": 128, "T": 128, "us": 95.0, "extra_entries": 512, "source": "fake c4a"},
        ], peer="FakePeer")
        with open(self.path("README.md"), "w") as f:
            f.write(README)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, rows, **doc):
        with open(self.path(name), "w") as f:
            json.dump(dict({"device": DEVICE, "commit": "abcdef0123", "rows": rows}, **doc), f)

    def write_c4a_pair(self):
        # Seed files before --format had no format field: the seed file here leaves it out.
        self.write("v2_c4a_h64.json", [layer_row("c4a", None, 64, 128, 100.0, 20.0),
                                       layer_row("c4a", None, 64, 2048, 800.0, 400.0)])
        self.write("v2_model1_c4a_h64.json", [layer_row("c4a", "model1", 64, 128, 120.0, 22.0),
                                              layer_row("c4a", "model1", 64, 2048, 880.0, 440.0)])
        self.write("v2_swa_h64.json", [layer_row("swa", "seed", 64, 128, 25.0, 10.0, extra=0)])
        self.write("v2_model1_swa_h64.json", [layer_row("swa", "model1", 64, 128, 33.0, 12.0, extra=0)])

    def run_script(self, *extra):
        with contextlib.redirect_stdout(io.StringIO()):
            plot_bench.main(["--results", self.dir, "--svg", "", "--layers-svg", "", "--dropin", "",
                             "--eager", "", "--markdown", self.path("results.md"),
                             "--readme", self.path("README.md"), *extra])
        with open(self.path("results.md")) as f, open(self.path("README.md")) as g:
            return f.read(), g.read()

    def refusal(self, *extra):
        with self.assertRaises(SystemExit) as raised:
            self.run_script(*extra)
        return str(raised.exception)

    def test_pairs_each_layer_seed_and_model1_at_the_same_h_and_t(self):
        self.write_c4a_pair()
        markdown, readme = self.run_script()
        # us, floor (bound) and x floor per format; MODEL1's 120 / 22 = 5.45x over seed's 100 / 20 =
        # 5.00x is 1.09; the peer's 90 us beside MODEL1's 120 is 1.33x.
        c4a = ("| C4A | 64 | 128 | `sm90_wgmma_layer` | 100.0 | 20.00 (memory) | 5.00x | 120.0 | "
               "22.00 (memory) | 5.45x | 1.09 | 90.0 | 1.33x |")
        swa = ("| SWA | 64 | 128 | `sm90_wgmma_layer` | 25.0 | 10.00 (memory) | 2.50x | 33.0 | "
               "12.00 (memory) | 2.75x | 1.10 | 20.0 | 1.65x |")
        section = markdown[markdown.index("## Cache formats"):]
        for row in (c4a, swa):
            self.assertIn(row, section)
        self.assertIn("| FakePeer us (MODEL1) | MODEL1 / FakePeer |", section)
        self.assertIn("1.00 (C4A, H = 64, T = 2048) to 1.10 (SWA, H = 64, T = 128)", section)
        # The README block: SWA before C4A, T = 128 and the largest T both formats measured.
        block = readme[readme.index(plot_bench.README_FORMAT_BEGIN):readme.index(plot_bench.README_FORMAT_END)]
        self.assertIn(c4a, block)
        self.assertLess(block.index("| SWA | 64 | 128 |"), block.index("| C4A | 64 | 128 |"))
        self.assertIn("| C4A | 64 | 2048 | `sm90_wgmma_layer` | 800.0 | 400.00 (memory) | 2.00x | 880.0 | "
                      "440.00 (memory) | 2.00x | 1.00 | ", block)
        self.assertTrue(readme.endswith(plot_bench.README_FORMAT_END + "\n\nafter\n"))

    def test_a_partial_sweep_takes_the_previous_sweeps_other_files(self):
        # v3 re-measures C4A in both formats, not the window; v1's MODEL1 C128A (two sweeps back)
        # stays out.
        self.write_c4a_pair()
        self.write("v1_model1_c128a_1m_h64.json", [layer_row("c128a", "model1", 64, 128, 500.0, 50.0)])
        self.write("v3_c4a_h64.json", [layer_row("c4a", "seed", 64, 128, 90.0, 20.0)])
        self.write("v3_model1_c4a_h64.json", [layer_row("c4a", "model1", 64, 128, 99.0, 22.0)])
        names = [os.path.basename(p) for p in plot_bench.newest_format_files(self.dir)]
        self.assertEqual(names, ["v2_model1_swa_h64.json", "v2_swa_h64.json", "v3_c4a_h64.json",
                                 "v3_model1_c4a_h64.json"])
        self.assertEqual([os.path.basename(p) for p in plot_bench.newest_layer_files(self.dir)],
                         ["v3_c4a_h64.json"])
        section = self.run_script()[0]
        section = section[section.index("## Cache formats"):]
        self.assertIn("| C4A | 64 | 128 | `sm90_wgmma_layer` | 90.0 | 20.00 (memory) | 4.50x | 99.0 | ", section)
        self.assertIn("| SWA | 64 | 128 | `sm90_wgmma_layer` | 25.0 | ", section)
        self.assertNotIn("C128A", section)

    def test_seed_tables_take_no_model1_row(self):
        self.write_c4a_pair()
        markdown, readme = self.run_script()
        layers = markdown[markdown.index("## Layers"):markdown.index("## Cache formats")]
        self.assertIn("v2_c4a_h64.json", layers)
        self.assertNotIn("model1", layers)
        self.assertNotIn("120.0", layers)
        self.assertNotIn("v2_swa_h64.json", layers)  # the window alone rides the vN_hH set there
        layer_block = readme[readme.index(plot_bench.README_LAYER_BEGIN):readme.index(plot_bench.README_LAYER_END)]
        # The README's layer table shows C4A at H = 64 at T = 2048 alone (README_LAYER_ROWS).
        self.assertIn("| C4A | 64 | 2048 | `sm90_wgmma_layer` | 800.0 |", layer_block)
        self.assertNotIn("880.0", layer_block)

    def test_peer_sits_beside_model1_rows_alone(self):
        self.write_c4a_pair()
        # A seed file with no MODEL1 partner: the peer's H = 128 figure stays out of its row.
        self.write("v2_c4a_h128.json", [layer_row("c4a", "seed", 128, 128, 110.0, 22.0)])
        markdown, _ = self.run_script()
        self.assertIn("| C4A | 128 | 128 | `sm90_wgmma_layer` | 110.0 | 22.00 (memory) | 5.00x |  |  |  |  |  |  |",
                      markdown)
        self.assertNotIn("95.0", markdown[markdown.index("## Cache formats"):])

    def layer_block_with_peer_at_2048(self, peer_us):
        """The README layer block where the peer ran C4A, H = 64 at T = 2048 in peer_us (ours: 800)."""
        self.write_c4a_pair()
        self.write("peers_fake.json", [
            {"H": 64, "T": 128, "us": 20.0, "source": "fake window"},
            {"layer": "c4a", "H": 64, "T": 2048, "us": peer_us, "extra_entries": 512, "source": "fake c4a"},
        ], peer="FakePeer")
        _, readme = self.run_script()
        return readme[readme.index(plot_bench.README_LAYER_BEGIN):readme.index(plot_bench.README_LAYER_END)]

    def test_the_layer_block_says_where_the_library_beats_the_peer(self):
        block = self.layer_block_with_peer_at_2048(1000.0)
        self.assertIn("faster than FakePeer on 1 of the 1 rows below: the library's time over FakePeer's 0.8x there",
                      block)
        self.assertIn("| C4A | 64 | 2048 | `sm90_wgmma_layer` | 800.0 | 2.00x (memory) | 1000.0 | 0.80x |", block)

    def test_the_layer_block_says_where_the_library_is_slower_everywhere(self):
        block = self.layer_block_with_peer_at_2048(400.0)
        self.assertIn("slower than FakePeer on every row below: the library's time over FakePeer's 2x there", block)

    def test_without_a_model1_file_the_format_block_stays_empty(self):
        self.write("v2_c4a_h64.json", [layer_row("c4a", "seed", 64, 128, 100.0, 20.0)])
        markdown, readme = self.run_script()
        self.assertNotIn("## Cache formats", markdown)
        self.assertIn(plot_bench.README_FORMAT_BEGIN + "\n" + plot_bench.README_FORMAT_END + "\n", readme)

    def test_a_model1_file_in_a_seed_table_is_refused(self):
        self.write_c4a_pair()
        message = self.refusal("--layers", self.path("v2_model1_c4a_h64.json"))
        self.assertIn("v2_model1_c4a_h64.json: rows[0].format is 'model1'", message)
        message = self.refusal(self.path("v2_model1_swa_h64.json"))
        self.assertIn("v2_model1_swa_h64.json: rows[0].format is 'model1'", message)

    def refusal_of_model1_file_with_format(self, fmt):
        """The run's refusal where v2_model1_c4a_h64.json's row says format `fmt`."""
        self.write_c4a_pair()
        self.write("v2_model1_c4a_h64.json", [layer_row("c4a", fmt, 64, 128, 120.0, 22.0)])
        return self.refusal()

    def test_an_unknown_format_is_refused(self):
        message = self.refusal_of_model1_file_with_format("fp4")
        self.assertIn("v2_model1_c4a_h64.json: rows[0].format must be one of seed, model1", message)
        self.assertIn("got 'fp4'", message)

    def test_a_name_that_disagrees_with_its_rows_is_refused(self):
        message = self.refusal_of_model1_file_with_format("seed")
        self.assertIn("v2_model1_c4a_h64.json: the name says format 'model1'", message)
        self.assertIn("its rows' format is 'seed'", message)

    def test_two_files_of_one_format_layer_and_h_are_refused(self):
        self.write_c4a_pair()
        self.write("other.json", [layer_row("c4a", "model1", 64, 128, 120.0, 22.0)])
        message = self.refusal("--formats", self.path("v2_model1_c4a_h64.json"), self.path("other.json"))
        self.assertIn("two MODEL1 files of C4A, H = 64", message)


if __name__ == "__main__":
    unittest.main()
