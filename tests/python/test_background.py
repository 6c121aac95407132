"""Runtime.prewarm_async / wait_prewarm / stats on a machine without a GPU:
background compiles into a temporary cache, counted; a second runtime on the
same cache compiles nothing; bad arguments raise naming the argument."""
import tempfile
import unittest

import kdajit

KEYS = [f"kda_single.h8.state_bf16.conv_ds.t1.gate_bounded.route_{r}.sm_90" for r in ("rowcta", "split2", "stream")]


class BackgroundPrewarm(unittest.TestCase):
    def test_compiles_in_the_background_and_counts(self):
        with tempfile.TemporaryDirectory() as tmp:
            rt = kdajit.Runtime(cache_dir=tmp, arch="sm_90", log_level="quiet")
            rt.prewarm_async(KEYS, threads=2)
            rt.wait_prewarm()
            s = rt.stats()
            self.assertEqual(set(s), set(kdajit.Runtime.STAT_NAMES))
            self.assertEqual(s["prewarm_compiled"], len(KEYS))
            self.assertEqual(s["prewarm_failed"], 0)
            self.assertEqual(s["prewarm_pending"], 0)
            self.assertEqual(s["serving_compiles"], 0)
            rt.close()
            again = kdajit.Runtime(cache_dir=tmp, arch="sm_90", log_level="quiet")
            again.prewarm_async(KEYS)
            again.wait_prewarm()
            self.assertEqual(again.stats()["prewarm_compiled"], 0)

    def test_bad_arguments(self):
        with tempfile.TemporaryDirectory() as tmp:
            rt = kdajit.Runtime(cache_dir=tmp, arch="sm_90", log_level="quiet")
            with self.assertRaisesRegex(ValueError, "keys"):
                rt.prewarm_async(KEYS[0])
            with self.assertRaisesRegex(ValueError, "threads"):
                rt.prewarm_async(KEYS, threads=0)
            with self.assertRaises(Exception) as e:
                rt.prewarm_async([KEYS[0], "kda_single.nope"])
            self.assertIn("key_names[1]", str(e.exception))
            self.assertEqual(rt.stats()["prewarm_pending"], 0)


if __name__ == "__main__":
    unittest.main()
