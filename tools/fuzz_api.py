"""Long randomized fuzzing of the Python API (tests/test_fuzz_api.py).

layer_norm, rms_norm, their backward passes, the forward gufuncs and the
RMSNorm layer, in every dtype (bfloat16 too when ml_dtypes is installed).

Runs the hypothesis fuzz tests of tests/test_fuzz_api.py in rounds, with
fresh random seeds, until the time is up, then prints how many calls were
tried, by outcome, and exits 1 on the first failure (hypothesis prints the
shrunk failing call and a @reproduce_failure blob).

    python tools/fuzz_api.py --minutes 15
    python tools/fuzz_api.py --minutes 60 --examples 5000

Run it from the repository root against the build you want to fuzz (the
in-place build, an installed one, or the sanitizer copy of tools/sanitize.sh
with its environment). Same oracle as the short run in the normal suite;
LAYERNORM_C_FUZZ=1 is set here, which widens shapes to "very large d".
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=15.0, help="time budget (default 15)")
    ap.add_argument("--examples", type=int, default=2000,
                    help="examples per test per round (default 2000)")
    args = ap.parse_args(argv)

    os.environ["LAYERNORM_C_FUZZ"] = "1"
    os.environ["LAYERNORM_C_FUZZ_EXAMPLES"] = str(args.examples)
    sys.path.insert(0, str(ROOT / "tests"))
    if str(ROOT) not in sys.path and "" not in sys.path:
        sys.path.insert(1, str(ROOT))  # an in-place build in this checkout
    warnings.simplefilter("ignore")
    import test_fuzz_api as t  # noqa: E402  (after the environment is set)
    import layernorm_c as lnc  # noqa: E402

    tests = [t.test_fuzz_layer_norm, t.test_fuzz_layer_norm_ufunc,
             t.test_fuzz_layer_norm_backward, t.test_fuzz_rms_norm, t.test_fuzz_rms_norm_ufunc,
             t.test_fuzz_rms_norm_backward, t.test_fuzz_rms_layer]
    print(f"fuzz_api: layernorm_c from {Path(lnc.__file__).parent}, ISA {lnc.get_isa()}, "
          f"{lnc.get_num_threads()} thread(s), {args.minutes} min", flush=True)
    t0 = time.monotonic()
    deadline = t0 + 60 * args.minutes
    rounds = 0
    status = 0
    try:
        while time.monotonic() < deadline:
            for test in tests:
                # Alternate the instruction-set level between rounds, too.
                isas = lnc.supported_isas()
                lnc.set_isa(isas[rounds % len(isas)])
                test()
            rounds += 1
            total = sum(t.COUNTS.values())
            print(f"fuzz_api: round {rounds}: {total} calls, "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
    except BaseException as exc:  # report, then the traceback
        status = 1
        print(f"fuzz_api: FAILURE after {sum(t.COUNTS.values())} calls: "
              f"{type(exc).__name__}", flush=True)
        import traceback
        traceback.print_exc()
    elapsed = time.monotonic() - t0
    total = sum(t.COUNTS.values())
    print(f"fuzz_api: {total} calls in {elapsed:.0f} s ({total / max(elapsed, 1e-9):.0f}/s), "
          f"{rounds} rounds, failures: {status}")
    for k, v in sorted(t.COUNTS.items()):
        print(f"  {k:28s} {v}")
    return status


if __name__ == "__main__":
    sys.exit(main())
