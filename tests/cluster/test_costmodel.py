#!/usr/bin/python3
"""Unit tests of tools/costmodel.py and its model, tools/allreduce_model.py, on synthetic
measurements (python3 -m unittest, no MPI)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest
import xml.dom.minidom

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import allreduce_model as am  # noqa: E402
import costmodel as cm  # noqa: E402

MIB = 1 << 20
TRUE = {"alpha": 40e-6, "beta": 1 / 117e6, "gamma": 0.6e-9}


def synthetic(params, noise=0.0, seed=1, kinds=("ring", "reducer")):
    rng = np.random.default_rng(seed)
    pts = []
    for kind in kinds:
        for n in (2, 4, 8):
            for s in (1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB):
                t = cm.predict(params, kind, n, s) * (1 + noise * rng.standard_normal())
                pts.append((kind, n, s, t))
    return pts


def result_line(impl, n, s, t):
    return (f"RESULT,{impl},{n},{s},{s // 4},5,{t * 1e6:.1f},{t * 1e6:.1f},{t * 1e6:.1f},"
            f"0,0,OK,1,0.000")


class TestFormulas(unittest.TestCase):
    def test_ring_and_reducer_terms(self):
        p = {"alpha": 1.0, "beta": 0.0, "gamma": 0.0}
        self.assertEqual(cm.predict(p, "ring", 8, MIB), 14.0)  # 2(N-1) messages
        p = {"alpha": 0.0, "beta": 1.0, "gamma": 0.0}
        self.assertAlmostEqual(cm.predict(p, "ring", 4, 400), 600.0)  # 2(N-1)/N·S
        self.assertAlmostEqual(cm.predict(p, "reducer", 4, 400), 2400.0)  # 2(N-1)·S
        p = {"alpha": 0.0, "beta": 0.0, "gamma": 1.0}
        self.assertAlmostEqual(cm.predict(p, "ring", 4, 400), 300.0)
        self.assertAlmostEqual(cm.predict(p, "reducer", 4, 400), 1200.0)
        self.assertEqual(cm.predict(TRUE, "ring", 1, MIB), 0.0)

    def test_reducer_is_n_times_ring_on_bandwidth(self):
        p = {"alpha": 0.0, "beta": 1e-9, "gamma": 0.0}
        for n in (2, 8, 40):
            r = cm.predict(p, "reducer", n, MIB) / cm.predict(p, "ring", n, MIB)
            self.assertAlmostEqual(r, n)

    def test_formula_of_labels(self):
        self.assertEqual(cm.formula("ring@128K"), "ring")
        self.assertEqual(cm.formula("reducer"), "reducer")
        self.assertEqual(cm.formula("naive-tcp"), "reducer")
        self.assertEqual(cm.formula("openmpi-ring"), "ring")
        self.assertEqual(cm.formula("mpi"), "ring")


class TestFit(unittest.TestCase):
    def test_exact_recovery_with_measured_beta(self):
        p = cm.fit(synthetic(TRUE), beta=TRUE["beta"])
        self.assertAlmostEqual(p["alpha"] / TRUE["alpha"], 1.0, places=6)
        self.assertAlmostEqual(p["gamma"] / TRUE["gamma"], 1.0, places=6)
        self.assertEqual(p["beta"], TRUE["beta"])

    def test_noisy_recovery_and_small_errors(self):
        pts = synthetic(TRUE, noise=0.02, seed=7)
        p = cm.fit(pts, beta=TRUE["beta"])
        self.assertLess(abs(p["gamma"] / TRUE["gamma"] - 1), 0.3)
        for kind, n, s, t in pts:
            self.assertLess(abs(cm.predict(p, kind, n, s) / t - 1), 0.08)

    def test_beta_fitted_when_not_given(self):
        truth = dict(TRUE, gamma=0.0)
        p = cm.fit(synthetic(truth), beta=None)
        self.assertAlmostEqual(p["beta"] / truth["beta"], 1.0, places=6)
        self.assertAlmostEqual(p["alpha"] / truth["alpha"], 1.0, places=4)
        self.assertEqual(p["gamma"], 0.0)

    def test_parameters_never_negative(self):
        # Times below the bandwidth term alone would need γ < 0: it is clamped at 0.
        truth = dict(TRUE, gamma=0.0)
        p = cm.fit(synthetic(truth), beta=TRUE["beta"] * 1.2)
        self.assertGreaterEqual(p["gamma"], 0.0)
        self.assertGreaterEqual(p["alpha"], 0.0)

    def test_nnls_matches_unconstrained_when_feasible(self):
        a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        y = np.array([1.0, 2.0, 3.0])
        np.testing.assert_allclose(am.nnls(a, y), [1.0, 2.0], atol=1e-12)
        np.testing.assert_allclose(am.nnls(a, -y), [0.0, 0.0], atol=1e-12)

    def test_empty_and_bad_input(self):
        with self.assertRaises(ValueError):
            cm.fit([])
        with self.assertRaises(ValueError):
            cm.fit([("ring", 2, MIB, 0.0)])


class TestCommandLine(unittest.TestCase):
    def run_main(self, argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = cm.main(argv)
        return rc, out.getvalue()

    def test_fit_command_reports_every_point(self):
        lines = ["# allreduce_bench np=2", "RESULT,impl,np,bytes,count,reps,median_us,min_us,max_us,"
                 "algbw_GBps,busbw_GBps,check,attempts,foreign_cores", "LINK,2,117000000"]
        pts = synthetic(TRUE, noise=0.01, seed=3, kinds=("ring", "reducer"))
        lines += [result_line(k, n, s, t) for k, n, s, t in pts]
        lines.append(result_line("ring", 4, 4096, 0.001))  # below --min-bytes: shown, not fitted
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "results.csv")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            rc, out = self.run_main(["fit", path, "--json", os.path.join(d, "p.json")])
            self.assertEqual(rc, 0)
            rows = [l for l in out.splitlines() if l.startswith("point,") and "point,impl" not in l]
            self.assertEqual(len(rows), len(pts) + 1)
            self.assertIn("joint,", out)
            with open(os.path.join(d, "p.json")) as f:
                saved = json.load(f)
            self.assertAlmostEqual(saved["params"]["beta"], 1 / 117e6)
            self.assertLess(saved["worst_err_pct"]["joint"], 5.0)
            rc, out = self.run_main(["project", "--params", os.path.join(d, "p.json"),
                                     "--compute-ms", "100", "--workers", "8,64",
                                     "--svg", os.path.join(d, "p.svg")])
            self.assertEqual(rc, 0)
            xml.dom.minidom.parse(os.path.join(d, "p.svg"))  # well-formed
            rc, out = self.run_main(["table", path])
            self.assertIn("| 64 MiB |", out)

    def test_parse_skips_header_and_garbage(self):
        rows = am.parse_results(["RESULT,impl,np,bytes", "RESULT,ring,2,x,1,1,1,1,1,1,1,OK,1,0",
                                 "junk", result_line("ring", 2, MIB, 0.01) + ",CONTENDED"])
        self.assertEqual(len(rows), 1)
        self.assertTrue(rows[0]["contended"])
        self.assertEqual(cm.parse_bytes("64M"), 64 * MIB)
        self.assertEqual(am.parse_links(["LINK,8,1.5e8", "LINK,x,1"]), {8: 1.5e8})


class TestProjection(unittest.TestCase):
    P = {"alpha": 5e-6, "beta": 8 / 10e9, "gamma": 0.0}

    def test_no_communication_means_full_efficiency(self):
        res = cm.project({"alpha": 0, "beta": 0, "gamma": 0}, ["ring"], [8, 256], 0.1, 98 * MIB,
                         25 * MIB, True)
        for _, t, eff, speed in res["ring"]:
            self.assertAlmostEqual(eff, 1.0)

    def test_ring_flat_reducer_falls(self):
        res = cm.project(self.P, ["ring", "reducer"], [8, 32, 128], 0.2, 98 * MIB, 25 * MIB, False)
        ring = [e for _, _, e, _ in res["ring"]]
        red = [e for _, _, e, _ in res["reducer"]]
        self.assertLess(ring[0] - ring[-1], 0.05)  # ring time hardly grows with N (8 → 128)
        self.assertGreater(red[0], red[1])
        self.assertGreater(red[1], red[2])
        self.assertTrue(all(r > d for r, d in zip(ring, red)))

    def test_overlap_helps_and_buckets_are_counted(self):
        off = cm.project(self.P, ["ring"], [16], 0.2, 98 * MIB, 25 * MIB, False)["ring"][0][1]
        on = cm.project(self.P, ["ring"], [16], 0.2, 98 * MIB, 25 * MIB, True)["ring"][0][1]
        self.assertLess(on, off)
        # Without overlap the step is compute plus every bucket's allreduce, one after another.
        sizes = [25 * MIB] * 3 + [23 * MIB]
        want = 0.2 + sum(cm.predict(self.P, "ring", 16, s) for s in sizes)
        self.assertAlmostEqual(off, want, places=9)

    def test_calibration_hits_target(self):
        c = cm.calibrate_compute(self.P, "ring", 40, 31.0, 400 * MIB, 25 * MIB, False)
        res = cm.project(self.P, ["ring"], [40], c, 400 * MIB, 25 * MIB, False)
        self.assertAlmostEqual(res["ring"][0][3], 31.0, places=3)


class TestDdlProjection(unittest.TestCase):
    """ResNet-50 (25.6M fp32 parameters = 102.4 MB) weak scaling to 256 workers."""
    GRAD = 25.6e6 * 4
    TEN_GBIT = {"alpha": 0.0, "beta": 8 / 10e9, "gamma": 0.0}

    def test_one_bucket_no_overlap_by_hand(self):
        # 2·255/256 · 102.4 MB = 204 MB through a 1.25 GB/s link: 0.1632 s after 0.25 s of compute.
        e = cm.ddl_efficiency(self.TEN_GBIT, 256, 0.25, self.GRAD, self.GRAD, False)
        self.assertAlmostEqual(e, 0.25 / (0.25 + 0.1632), places=9)

    def test_workers_per_node_share_one_link(self):
        # 8 per node: a ring over 32 nodes, 2·31/32 · 102.4 MB = 198.4 MB, 0.15872 s.
        e = cm.ddl_efficiency(self.TEN_GBIT, 256, 0.25, self.GRAD, self.GRAD, False, per_node=8)
        self.assertAlmostEqual(e, 0.25 / (0.25 + 0.15872), places=9)
        self.assertEqual(cm.ddl_efficiency(self.TEN_GBIT, 8, 0.25, self.GRAD, self.GRAD, False, per_node=8), 1.0)

    def test_overlap_by_hand(self):
        # N = 2: a 50 B bucket takes 50·0.02 = 1 s. Compute 3 s: forward 1 s, backward 2 s; bucket 1
        # ready at 2 s, reduced by 3 s; bucket 2 ready at 3 s, reduced by 4 s: efficiency 3/4.
        p = {"alpha": 0.0, "beta": 0.02, "gamma": 0.0}
        self.assertAlmostEqual(cm.ddl_efficiency(p, 2, 3.0, 100, 50, True), 0.75)
        self.assertAlmostEqual(cm.ddl_efficiency(p, 2, 3.0, 100, 50, False), 3.0 / 5.0)

    def test_compute_needed_for_target(self):
        p = {"alpha": 10e-6, "beta": 8 / 25e9, "gamma": 0.0}
        c = cm.ddl_compute_for(p, 256, 0.95, self.GRAD, 25 * MIB, True)
        self.assertAlmostEqual(cm.ddl_efficiency(p, 256, c, self.GRAD, 25 * MIB, True), 0.95, places=4)
        self.assertLess(cm.ddl_efficiency(p, 256, 0.9 * c, self.GRAD, 25 * MIB, True), 0.95)

    def test_command_table_and_plot(self):
        with tempfile.TemporaryDirectory() as d:
            out = io.StringIO()
            png = os.path.join(d, "ddl.png")
            with contextlib.redirect_stdout(out):
                rc = cm.main(["ddl", "--png", png])
            self.assertEqual(rc, 0)
            text = out.getvalue()
            first = text.split("# efficiency against workers")[0]
            rows = {l.split(",")[0]: l.split(",") for l in first.splitlines() if l[:1].isdigit()}
            # Default grid (10/25/100 Gbit/s x 100/250/500 ms): at 250 ms only 100 Gbit/s reaches 95 %.
            self.assertTrue(rows["100"][2].endswith("*"), text)
            self.assertFalse(rows["10"][2].endswith("*"), text)
            self.assertFalse(rows["25"][2].endswith("*"), text)
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                self.skipTest("matplotlib missing: no PNG")
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")



class TestPerHostTable(unittest.TestCase):
    """table --compact --per-host: each algorithm against its own link bound."""

    def test_bounds_by_algorithm_and_placement(self):
        link, s = 100e6, 4 * MIB
        flat = 2 * 7 / 8 * s / link  # N = 8
        self.assertAlmostEqual(cm.link_bound("ring", 8, s, link, 2), flat)
        self.assertAlmostEqual(cm.link_bound("hierarchical", 8, s, link, 2), 2 * 3 / 4 * s / link)  # H = 4
        self.assertAlmostEqual(cm.link_bound("hierarchical", 8, s, link, 4), 1.0 * s / link)        # H = 2
        self.assertAlmostEqual(cm.link_bound("ring/rank", 8, s, link, 2), flat)
        self.assertAlmostEqual(cm.link_bound("ring/rank", 8, s, link, 2, round_robin=True), 2 * flat)
        self.assertAlmostEqual(cm.link_bound("ring", 8, s, link, 2, round_robin=True), flat)

    def test_table_cells_and_speedups(self):
        link, s = 100e6, 4 * MIB
        t_ring, t_hier = 2 * 7 / 8 * s / link, 2 * 1 / 2 * s / link / 0.8  # hier at 80 % of its bound
        lines = [f"LINK,8,{link:.0f}", result_line("ring", 8, s, t_ring),
                 result_line("hierarchical", 8, s, t_hier), result_line("openmpi", 8, s, 2 * t_ring)]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.csv")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = cm.main(["table", "--compact", "--per-host", "4", "--versus", "hierarchical", path])
        self.assertEqual(rc, 0)
        row = next(l for l in out.getvalue().splitlines() if l.startswith("| 4 MiB"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertTrue(cells[1].endswith("· 100%"), row)   # ring at its bound
        self.assertTrue(cells[2].endswith("· 80%"), row)    # hierarchical at 80 % of 1.0 S/B
        self.assertEqual(cells[4], f"{t_ring / t_hier:.2f}×", row)
        self.assertEqual(cells[5], f"{2 * t_ring / t_hier:.2f}×", row)
        self.assertIn("hierarchical / openmpi", out.getvalue())


    def run_main(self, argv, files):
        """(exit status or SystemExit's message, stdout) of costmodel.main on files {name: lines}."""
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for name, lines in files.items():
                paths.append(os.path.join(d, name))
                with open(paths[-1], "w") as f:
                    f.write("\n".join(lines) + "\n")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    rc = cm.main([a.replace("{dir}", d) for a in argv] + paths)
                except SystemExit as e:
                    rc = e.code
            extra = {}
            for n in os.listdir(d):
                if n.endswith(".json"):
                    with open(os.path.join(d, n)) as f:
                        extra[n] = f.read()
        return rc, out.getvalue(), extra

    def test_table_keeps_runs_at_two_link_rates_apart(self):
        # N = 8 at 100 MB/s (ring and reducer) and at 25 MB/s (ring only): two tables, each cell
        # against its own run's bound, no reducer figure in the slower run's.
        s = 4 * MIB
        fast = [f"LINK,8,{100e6:.0f}", result_line("ring", 8, s, 2 * 7 / 8 * s / 100e6),
                result_line("reducer", 8, s, 8 * 2 * 7 / 8 * s / 100e6)]
        slow = [f"LINK,8,{25e6:.0f}", result_line("ring", 8, s, 2 * 7 / 8 * s / 25e6)]
        rc, out, _ = self.run_main(["table"], {"fast.csv": fast, "slow.csv": slow})
        self.assertEqual(rc, 0)
        self.assertEqual(out.count("**N = 8**"), 2, out)
        tables = out.split("**N = 8**")[1:]
        slow_t = next(t for t in tables if "25.0 MB/s" in t)
        fast_t = next(t for t in tables if "100.0 MB/s" in t)
        self.assertNotIn("8.00×", slow_t)
        self.assertIn("8.00×", fast_t)  # ring / reducer in the run that had both
        row = next(l for l in slow_t.splitlines() if l.startswith("| 4 MiB"))
        self.assertIn("| 100.0 |", row)  # the slow ring at its own bound

    def test_fit_saves_the_joint_fit_or_refuses(self):
        s, link = 4 * MIB, 100e6
        rows = [f"LINK,4,{link:.0f}", result_line("openmpi", 4, s, 0.2)]
        rc, out, saved = self.run_main(["fit", "--json", "{dir}/p.json"], {"r.csv": rows})
        self.assertIn("no results of --joint ring,reducer", str(rc))
        self.assertEqual(saved, {})  # no file of another implementation's parameters
        # --link-bytes-per-s: the saved links are the one the fit used.
        rows = [f"LINK,4,{link:.0f}", result_line("ring", 4, s, 2 * 3 / 4 * s / link),
                result_line("ring", 4, 2 * s, 2 * 3 / 4 * 2 * s / link),
                result_line("ring", 8, s, 2 * 7 / 8 * s / link)]  # N = 8: no LINK line of its own
        rc, out, saved = self.run_main(["fit", "--link-bytes-per-s", "50e6", "--json", "{dir}/p.json"], {"r.csv": rows})
        self.assertEqual(rc, 0)
        self.assertIn("beta = 1/--link-bytes-per-s 5e+07", out)
        self.assertEqual(json.loads(saved["p.json"])["links"], {"4": 50e6, "8": 50e6})

    def test_baidu_takes_each_parameter_given(self):
        first = lambda argv: self.run_main(["baidu", *argv], {})[1].splitlines()[0]
        self.assertIn("alpha 5.0 us", first([]))
        self.assertIn("alpha 50.0 us", first(["--alpha", "50e-6"]))
        self.assertIn("link 7.00 GB/s, alpha 5.0 us", first(["--link-gbit", "56"]))
        self.assertIn("link 1.25 GB/s, alpha 5.0 us", first(["--link-gbit", "10"]))

    def test_an_unreachable_target_is_said(self):
        rc, out, _ = self.run_main(["ddl", "--target", "1", "--link-gbit", "100", "--compute-ms", "100"], {})
        self.assertEqual(rc, 0)
        self.assertIn("100,", out)
        self.assertIn(",unreachable", out)


if __name__ == "__main__":
    unittest.main()
