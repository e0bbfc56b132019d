"""tools/doc_table.py: a table between its markers replaces the old one and leaves the rest of
the file as it was; a file without the markers (or no file) gets them appended; the benchmark
logs' RUN lines read back as rates."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from doc_table import measured_on, put_between_markers, rate_cell, run_rates  # noqa: E402


class DocTable(unittest.TestCase):
    def test_replaces_between_markers_only(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.md")
            with open(path, "w") as f:
                f.write("# T\n\n<!-- b:begin -->\nold\n<!-- b:end -->\n\nafter <!-- a:begin -->\n")
            put_between_markers(path, "b", "| 1 |")
            put_between_markers(path, "b", "| 2 |\n")
            self.assertEqual(open(path).read(),
                             "# T\n\n<!-- b:begin -->\n| 2 |\n<!-- b:end -->\n\nafter <!-- a:begin -->\n")
            # "a" has a begin but no end: the end comes after it, nothing else moves.
            put_between_markers(path, "a", "x")
            self.assertEqual(open(path).read(), "# T\n\n<!-- b:begin -->\n| 2 |\n<!-- b:end -->\n\n"
                                                "after <!-- a:begin -->\nx\n<!-- a:end -->\n")

    def test_new_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "new.md")
            put_between_markers(path, "t", "row\n")
            self.assertEqual(open(path).read(), "\n<!-- t:begin -->\nrow\n<!-- t:end -->\n")

    def test_run_rates(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "log")
            with open(log, "w") as f:
                f.write("RUN folder 2 RESULT x img_per_s_median=928.4 min=920.0 max=932.6\n"
                        "noise\nRUN torch none RESULT y policy=none img_per_s_median=282 min=281 max=291 extra=1\n")
            res = run_rates(log)
            self.assertEqual(res, {("folder", "2"): (928.4, 920.0, 932.6), ("torch", "none"): (282.0, 281.0, 291.0)})
            self.assertEqual(rate_cell(res[("folder", "2")]), "928 (920–933)")

    def test_measured_on(self):
        line = measured_on("0.5 0.6 0.7", "1.0 1.1 1.2")
        self.assertRegex(line, r"^Measured \d{4}-\d\d-\d\d on \S+ \(\d+ cores\), load average "
                               r"0.5 0.6 0.7 before and 1.0 1.1 1.2 after$")


if __name__ == "__main__":
    unittest.main()
