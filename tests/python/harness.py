"""Runs one test module with unittest and maps the result onto CTest:
exit 0 when tests ran and passed, 1 on a failure or error, 77 (skipped) when
every test was skipped, so that a skipped suite never reads as a pass.

    python3 -m harness test_mapping [unittest args...]
"""
import sys
import unittest


def main(argv):
    if not argv:
        print("usage: python3 -m harness MODULE [TEST...]", file=sys.stderr)
        return 2
    module, names = argv[0], argv[1:]
    loader = unittest.TestLoader()
    try:
        __import__(module)
    except unittest.SkipTest as e:  # a module that cannot run here (e.g. no CUDA device)
        print(f"harness: {module}: SKIPPED: {e}")
        return 77
    suite = (loader.loadTestsFromNames([f"{module}.{n}" for n in names]) if names
             else loader.loadTestsFromName(module))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.testsRun == 0:
        print(f"harness: {module}: no tests found", file=sys.stderr)
        return 1
    if len(result.skipped) == result.testsRun:
        print(f"harness: {module}: SKIPPED: every test was skipped ({result.skipped[0][1]})")
        return 77
    print(f"harness: {module}: {result.testsRun - len(result.skipped)} passed, {len(result.skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
