#!/usr/bin/python3
"""Lines on standard error beside rank 0's live progress line: under mpirun on a terminal
(a pseudo-terminal here), every rank's warning starts by clearing the terminal's line, where the
progress line may be open, instead of continuing its text; with output to pipes, no terminal
control characters at all. Usage: test_terminal_lines.py BIN_DIR (trainer, make_imagenet_like)."""
import os
import pty
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(REPO, "build", "bin")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           COLUMNS="100")
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
CLEAR = "\r\x1b[K"


class TestTerminalLines(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.data = os.path.join(cls.tmp.name, "data")
        subprocess.run([os.path.join(BIN, "make_imagenet_like"), "--out", cls.data, "--classes", "2",
                        "--train-per-class", "24", "--val-per-class", "4", "--width", "36", "--height", "36"],
                       check=True, stdout=subprocess.DEVNULL)
        # Unreadable images in both classes: each rank skips some, and says so from its decode thread.
        for c in sorted(os.listdir(os.path.join(cls.data, "train"))):
            folder = os.path.join(cls.data, "train", c)
            for name in sorted(os.listdir(folder))[:8]:
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(b"not a jpeg")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def command(self, run):
        return MPIRUN + [os.path.join(BIN, "trainer"), "--config", os.path.join(REPO, "configs", "quickstart.yaml"),
                         "--set", "data.root=" + self.data, "--set", "run_dir=" + os.path.join(self.tmp.name, run),
                         "--set", "model.classes=2", "--set", "model.width=0.25", "--set", "train.epochs=2",
                         "--set", "train.batch=4", "--set", "eval.every_epochs=0", "--set", "log.interval=1",
                         "--set", "checkpoint.at_epoch_end=false"]

    def warnings(self, text):
        """Each 'data: warning: rank' line with the 4 characters before it."""
        out, at = [], text.find("data: warning: rank")
        while at >= 0:
            out.append((text[max(0, at - len(CLEAR)):at], text[at:text.find("\n", at)]))
            at = text.find("data: warning: rank", at + 1)
        return out

    def test_on_a_terminal_each_rank_clears_the_progress_line_first(self):
        master, slave = pty.openpty()
        p = subprocess.Popen(self.command("tty"), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=ENV)
        os.close(slave)
        chunks = []
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not b:
                break
            chunks.append(b)
        os.close(master)
        self.assertEqual(p.wait(timeout=120), 0)
        text = b"".join(chunks).decode(errors="replace")
        self.assertIn("\repoch 1/2 step ", text, "no live progress line: " + text[-2000:])
        seen = self.warnings(text)
        self.assertTrue({w for _, w in seen if "rank 1:" in w}, "rank 1 said nothing: " + text[-2000:])
        for before, line in seen:
            self.assertEqual(before, CLEAR, "not led by a cleared line: " + repr(before + line))

    def test_to_pipes_no_terminal_control_characters(self):
        p = subprocess.run(self.command("pipes"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=ENV, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertTrue(self.warnings(p.stderr), p.stderr[-2000:])
        self.assertNotIn("\x1b", p.stdout + p.stderr)
        self.assertNotIn("\r", p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main()
