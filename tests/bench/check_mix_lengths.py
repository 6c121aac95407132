"""kdajit_bench's prompt batches against bench_prefill.py's: the lengths that
`kdajit_bench --op prefill --list` prints for each shape must be those of
lengths_of in bench/peers/bench_fla_chunk_kda.py, which bench_prefill.py
draws its batches from (mixN: Python's random.Random(0), N calls of
randint(100, 2000)). No GPU; the standard library only.

    python3 tests/bench/check_mix_lengths.py build/bench/kdajit_bench
"""
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "bench", "peers"))
import bench_fla_chunk_kda as peer  # noqa: E402  (stdlib imports only)

SHAPES = ["mix64", "mix1", "mix300", "8x2048", "4x8192", "1x16384"]


def listed_lengths(bench):
    """{shape: [lengths]} from the 'shape S: ...: lengths a,b,c' lines of --list."""
    out = subprocess.run([bench, "--op", "prefill", "--list", "--heads", "16", "--state", "f32",
                          "--shapes", ",".join(SHAPES)], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        if line.startswith("shape "):
            name = line[len("shape "):].split(":", 1)[0]
            found[name] = [int(v) for v in line.rsplit("lengths ", 1)[1].split(",")]
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_mix_lengths.py KDAJIT_BENCH")
    found = listed_lengths(sys.argv[1])
    failed = 0
    for shape in SHAPES:
        want = peer.lengths_of(shape)
        got = found.get(shape)
        if got == want:
            print(f"{shape}: {len(want)} prompts, {sum(want)} tokens: same as bench_prefill.py")
        else:
            failed += 1
            print(f"{shape}: kdajit_bench lists {got}, bench_prefill.py draws {want}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
