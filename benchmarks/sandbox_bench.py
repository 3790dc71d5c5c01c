"""Sandbox throughput: the pre-warmed pool against a fresh python3 per execution (one run).

    python benchmarks/sandbox_bench.py [--n 200] [--rounds 3] [--kind both] [--json PATH]

Same as ``rlvr sandbox bench``; see ``rlvr/sandbox/bench.py`` for what is measured.
"""

import sys

from rlvr.sandbox.bench import main

if __name__ == "__main__":
    sys.exit(main())
