#!/usr/bin/python3
"""tools/costmodel.py's command line on mistakes: values out of range, files that cannot be read
or written, a --params file that holds no parameters. Each is an argparse-style error naming the
option or file (exit status 2), never a traceback nor a result computed from nonsense (python3 +
numpy; the model itself is tested by tests/cluster/test_costmodel.py)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import allreduce_model as am  # noqa: E402
import costmodel as cm  # noqa: E402

RESULTS = "RESULT,ring,2,1048576,262144,5,20000.0,20000.0,20000.0,0,0,OK,1,0.000\n" \
          "RESULT,ring,4,4194304,1048576,5,90000.0,90000.0,90000.0,0,0,OK,1,0.000\n"


class CostmodelArguments(unittest.TestCase):
    def setUp(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        self.dir = d.name
        self.params = self.path("p.json")
        with open(self.params, "w") as f:
            json.dump({"params": {"alpha": 1e-5, "beta": 1e-9, "gamma": 0.0}}, f)

    def path(self, name):
        return os.path.join(self.dir, name)

    def main(self, *argv):
        """(exit status, stdout, stderr) of costmodel.main(argv)."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cm.main([str(a) for a in argv])
            except SystemExit as e:
                rc = e.code
        return rc, out.getvalue(), err.getvalue()

    def assert_usage_error(self, argv, msg):
        rc, out, err = self.main(*argv)
        self.assertEqual(rc, 2, (argv, out, err))
        self.assertIn(msg, err, argv)
        self.assertIn(": error: ", err, argv)  # argparse's form: "costmodel.py <command>: error: ..."
        self.assertEqual(out, "", argv)  # nothing computed

    def test_values_out_of_range_name_the_option(self):
        p = ["--params", self.params]
        for argv, msg in (
                (["predict", *p, "--np", "0", "--bytes", "1M"], "argument --np: expected a positive integer, got '0'"),
                (["predict", *p, "--np", "-4", "--bytes", "1M"], "argument --np: expected a positive integer"),
                (["predict", *p, "--np", "4", "--bytes", "lots"],
                 "argument --bytes: expected a byte count such as 4096, 64K, 1M or 2G, got 'lots'"),
                (["predict", *p, "--np", "4", "--bytes", "0"], "argument --bytes: expected at least 1 byte(s)"),
                (["predict", "--alpha", "-1", "--link-gbit", "10", "--np", "4", "--bytes", "1M"],
                 "argument --alpha: expected a number >= 0, got '-1'"),
                (["predict", "--link-gbit", "nan", "--np", "4", "--bytes", "1M"],
                 "argument --link-gbit: expected a number > 0, got 'nan'"),
                (["predict", "--link-gbit", "inf", "--np", "4", "--bytes", "1M"], "argument --link-gbit"),
                (["project", *p, "--compute-ms", "-5"], "argument --compute-ms: expected a number > 0, got '-5'"),
                (["project", *p, "--compute-ms", "5", "--bucket-mb", "0"], "argument --bucket-mb: expected a number > 0"),
                (["project", *p, "--compute-ms", "5", "--bucket-mb", "-1"], "argument --bucket-mb"),
                (["project", *p, "--compute-ms", "5", "--grad-mb", "0"], "argument --grad-mb"),
                (["project", *p, "--compute-ms", "5", "--backward-fraction", "2"],
                 "argument --backward-fraction: expected a fraction from 0 to 1, got '2'"),
                (["project", *p, "--compute-ms", "5", "--workers", "8,x"],
                 "argument --workers: expected a positive integer, got 'x'"),
                (["project", *p, "--compute-ms", "5", "--workers", "8,0"], "argument --workers"),
                (["project", *p, "--compute-ms", "5", "--overlap", "2"], "argument --overlap: invalid choice"),
                (["baidu", "--grad-mb", "0"], "argument --grad-mb"),
                (["ddl", "--link-gbit", "10,0"], "argument --link-gbit: expected a number > 0, got '0'"),
                (["ddl", "--compute-ms", "100,-1"], "argument --compute-ms"),
                (["ddl", "--workers", "0"], "argument --workers"),
                (["ddl", "--gpus-per-node", "0"], "argument --gpus-per-node"),
                (["ddl", "--target", "1.5"], "argument --target"),
                (["fit", "--min-bytes", "x", "/dev/null"], "argument --min-bytes: expected a byte count"),
                (["fit", "--link-bytes-per-s", "-1", "/dev/null"], "argument --link-bytes-per-s"),
                (["table", "--per-host", "0", "/dev/null"], "argument --per-host")):
            self.assert_usage_error(argv, msg)

    def test_files_that_cannot_be_read_or_written(self):
        results = self.path("results.csv")
        with open(results, "w") as f:
            f.write(RESULTS)
        missing = self.path("none.csv")
        self.assert_usage_error(["fit", results, missing], f"{missing}: cannot read (No such file or directory)")
        self.assert_usage_error(["table", self.dir], f"{self.dir}: cannot read (Is a directory)")
        self.assert_usage_error(["predict", "--params", missing, "--np", "2", "--bytes", "1M"],
                                f"--params {missing}: cannot read (No such file or directory)")
        nowhere = self.path("no/such/folder/out")
        for argv, opt in ((["fit", results, "--json", nowhere + ".json"], "--json"),
                          (["project", "--params", self.params, "--compute-ms", "5", "--svg", nowhere + ".svg"], "--svg"),
                          (["project", "--params", self.params, "--compute-ms", "5", "--png", nowhere + ".png"], "--png"),
                          (["baidu", "--svg", self.dir], "--svg"),
                          (["ddl", "--png", self.dir], "--png")):
            self.assert_usage_error(argv, f"{opt} ")
        # Where the folder is there but the file cannot be made: after the results, still no traceback.
        if os.path.isdir("/proc"):
            rc, out, err = self.main("project", "--params", self.params, "--compute-ms", "5", "--svg", "/proc/x.svg")
            self.assertEqual(rc, 2)
            self.assertIn("/proc/x.svg: cannot write (", err)
            rc, out, err = self.main("ddl", "--png", "/proc/x.png")
            self.assertEqual(rc, 2)
            self.assertIn("/proc/x.png: cannot write (", err)

    def test_params_files_that_hold_no_parameters(self):
        for text, msg in (("not json", "not JSON"), ("\xff\xfe", "not JSON"), ("[1, 2]", "not the parameters"),
                          ('{"alpha": 1e-5, "beta": 1e-9}', "'gamma' is None, not a number >= 0"),
                          ('{"params": {"alpha": -1, "beta": 1e-9, "gamma": 0}}', "'alpha' is -1")):
            bad = self.path("bad.json")
            with open(bad, "w", encoding="latin-1") as f:
                f.write(text)
            self.assert_usage_error(["predict", "--params", bad, "--np", "2", "--bytes", "1M"], f"--params {bad}: {msg}")

    def test_good_arguments_still_work(self):
        rc, out, err = self.main("predict", "--params", self.params, "--np", "8", "--bytes", "64M")
        self.assertEqual((rc, err), (0, ""))
        self.assertIn("ring,np=8,bytes=67108864,", out)
        png = self.path("eff")  # --png writes a PNG under the name given, whatever it ends in
        rc, out, err = self.main("project", "--link-gbit", "10", "--compute-ms", "250", "--workers", "8,64",
                                 "--svg", self.path("p.svg"), "--png", png)
        self.assertEqual((rc, err), (0, ""))
        self.assertTrue(out.splitlines()[-1].startswith("64,"))
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        results = self.path("results.csv")
        with open(results, "w") as f:
            f.write(RESULTS)
        rc, out, err = self.main("fit", results, "--min-bytes", "512K", "--json", self.path("fit.json"))
        self.assertEqual(rc, 0, err)
        self.assertIn("# fit on results >= 512K bytes", out)
        self.assertGreater(am.load_params(self.path("fit.json"))["beta"], 0)

    def test_a_fit_on_links_of_several_speeds(self):
        # As a fit of runs at 1 Gbit/s (N = 2) and 250 Mbit/s (N = 8) records them: no one beta.
        mixed = self.path("mixed.json")
        with open(mixed, "w") as f:
            json.dump({"params": {"alpha": 1e-5, "beta": 2e-8, "gamma": 0.0},
                       "links": {"2": 119.3e6, "8": 29.9e6}}, f)
        rc, out, err = self.main("predict", "--params", mixed, "--np", "8", "--bytes", "64M")
        self.assertEqual((rc, err), (0, ""))
        want = am.predict({"alpha": 1e-5, "beta": 1 / 29.9e6, "gamma": 0.0}, "ring", 8, 64 << 20)
        self.assertIn(f"ring,np=8,bytes=67108864,time_us={want * 1e6:.1f},", out)  # N = 8's own link
        # No link measured at N = 4, none at all for a projection: refused (sys.exit's message).
        rc, out, err = self.main("predict", "--params", mixed, "--np", "4", "--bytes", "64M")
        self.assertEqual(out, "")
        self.assertIn("was fitted on links of several speeds (N=2: 119.3 MB/s, N=8: 29.9 MB/s): give the link "
                      "to model with --link-gbit G", str(rc))
        rc, out, err = self.main("project", "--params", mixed, "--compute-ms", "100")
        self.assertEqual(out, "")
        self.assertIn("links of several speeds", str(rc))
        rc, out, err = self.main("project", "--params", mixed, "--compute-ms", "100", "--link-gbit", "1")
        self.assertEqual((rc, err), (0, ""))

    def test_model_helpers_refuse_what_they_cannot_use(self):
        for text in ("", "M", "1X", "-1M", "nan", "inf"):
            with self.assertRaises(ValueError):
                am.parse_bytes(text)
        self.assertEqual(am.parse_bytes(" 1.5K "), 1536)
        with self.assertRaises(ValueError):
            am.step_time(lambda n, s: 0.0, 8, 0.1, 1000, 0, True, 2 / 3)
        with self.assertRaises(ValueError):
            am.step_time(lambda n, s: 0.0, 8, 0.1, 0, 1000, True, 2 / 3)


if __name__ == "__main__":
    unittest.main()
