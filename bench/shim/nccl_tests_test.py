#!/usr/bin/env python3
"""Tests of bench/shim/nccl_tests.py's verdicts, without a GPU: canned nccl-tests output, and a
stand-in *_perf program that shows what environment the script runs it in.

  python3 bench/shim/nccl_tests_test.py        (CTest: bench.shim.nccl_tests_script)
"""
import os
import stat
import sys
import tempfile
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccl_tests  # noqa: E402

# Two rows and the footer of an all_reduce_perf run, as nccl-tests prints them.
STDOUT = """#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    10.50    0.00    0.00      0    10.33    0.00    0.00      0
        1024           256     float     sum      -1    11.02    0.09    0.09      {wrong}    10.97    0.09    0.09      0
# Out of bounds values : {oob} OK
# Avg bus bandwidth    : 0.0478
#
"""


def out(wrong=0, oob=0):
    return STDOUT.format(wrong=wrong, oob=oob)


def served_line(**counts):
    names = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"]
    c = {n: counts.get(n, 0) for n in names}
    return "reccl: served at exit: " + " ".join(f"{n}={c[n]}" for n in names) + f" total={sum(c.values())}\n"


class Judge(unittest.TestCase):
    def test_nccl_run_is_ok_without_a_served_line(self):
        v = nccl_tests.judge("all_reduce", "nccl", 0, out(), "", {})
        self.assertTrue(v["ok"], v["problems"])
        self.assertEqual(len(v["rows"]), 2)

    def test_shim_run_that_served_its_calls_is_ok(self):
        v = nccl_tests.judge("all_reduce", "reccl", 0, out(), "reccl: libreccl_nccl serves ...\n" + served_line(all_reduce=12), {})
        self.assertTrue(v["ok"], v["problems"])
        self.assertEqual(v["served"]["all_reduce"], 12)

    def test_shim_run_that_forwarded_everything_fails(self):
        v = nccl_tests.judge("all_reduce", "reccl", 0, out(), served_line(), {})
        self.assertFalse(v["ok"])
        self.assertIn("reccl served no all_reduce call", "; ".join(v["problems"]))

    def test_shim_run_that_served_only_another_collective_fails(self):
        v = nccl_tests.judge("alltoall", "reccl", 0, out(), served_line(all_reduce=3), {})
        self.assertFalse(v["ok"])
        self.assertIn("reccl served no all_to_all call", "; ".join(v["problems"]))

    def test_shim_run_without_the_served_line_fails(self):
        v = nccl_tests.judge("broadcast", "reccl", 0, out(), "", {})
        self.assertFalse(v["ok"])
        self.assertIn("served at exit", "; ".join(v["problems"]))

    def test_collectives_the_environment_excludes_are_not_expected_served(self):
        env = {"RECCL_NCCL_COLLS": "all_reduce,bogus"}
        self.assertTrue(nccl_tests.judge("all_gather", "reccl", 0, out(), served_line(), env)["ok"])
        self.assertFalse(nccl_tests.judge("all_reduce", "reccl", 0, out(), served_line(), env)["ok"])
        self.assertTrue(nccl_tests.judge("all_reduce", "reccl", 0, out(), "", {"RECCL_NCCL": "0"})["ok"])

    def test_wrong_elements_out_of_bounds_exit_status_and_no_rows_fail(self):
        ok = served_line(all_reduce=1)
        self.assertIn("1 wrong elements", nccl_tests.judge("all_reduce", "reccl", 0, out(wrong=1), ok, {})["problems"])
        self.assertIn("4 out-of-bounds values", nccl_tests.judge("all_reduce", "reccl", 0, out(oob=4), ok, {})["problems"])
        self.assertIn("exit status 3", nccl_tests.judge("all_reduce", "reccl", 3, out(), ok, {})["problems"])
        self.assertIn("no result rows", nccl_tests.judge("all_reduce", "reccl", 0, "", ok, {})["problems"])

    def test_in_place_all_to_all_is_not_checked(self):
        text = out().replace("10.97    0.09    0.09      0", "10.97    0.09    0.09      5")
        self.assertTrue(nccl_tests.judge("alltoall", "nccl", 0, text, "", {})["ok"])
        self.assertFalse(nccl_tests.judge("all_reduce", "nccl", 0, text, "", {})["ok"])


# A stand-in all_reduce_perf: prints the canned table, and the shim's served line when it would be
# loaded and asked to (LD_PRELOAD and RECCL_NCCL_SERVED_AT_EXIT=1), serving SERVE calls.
FAKE = """#!/usr/bin/env python3
import os, sys
sys.stdout.write({stdout!r})
if os.environ.get("LD_PRELOAD") and os.environ.get("RECCL_NCCL_SERVED_AT_EXIT") == "1":
    n = {serve}
    sys.stderr.write(f"reccl: served at exit: all_reduce={{n}} reduce_scatter=0 all_gather=0 broadcast=0 all_to_all=0 total={{n}}\\n")
"""


class Run(unittest.TestCase):
    def run_fake(self, serve, mode):
        with tempfile.TemporaryDirectory() as d:
            exe = os.path.join(d, "all_reduce_perf")
            with open(exe, "w") as f:
                f.write(FAKE.format(stdout=out(), serve=serve))
            os.chmod(exe, os.stat(exe).st_mode | stat.S_IXUSR)
            args = types.SimpleNamespace(bin=d, ngpus=2, shim=os.path.join(d, "libreccl_nccl.so"), timeout=60)
            return nccl_tests.run(args, "all_reduce", "float", "sum", mode, ["-b", "8", "-e", "1K"])

    def test_the_script_asks_the_shim_for_its_served_counts(self):
        r = self.run_fake(serve=7, mode="reccl")
        self.assertTrue(r["ok"], r["problems"])
        self.assertEqual(r["served"]["all_reduce"], 7)

    def test_a_shim_that_served_nothing_fails_the_run(self):
        r = self.run_fake(serve=0, mode="reccl")
        self.assertFalse(r["ok"])

    def test_the_nccl_run_has_no_shim(self):
        r = self.run_fake(serve=0, mode="nccl")
        self.assertTrue(r["ok"], r["problems"])
        self.assertIsNone(r["served"])


if __name__ == "__main__":
    unittest.main()
