"""Former single-file benchmark, kept so ``make bench`` keeps working: it now runs the suite in
``benchmarks/run.py`` (same arguments, e.g. ``--quick``); see that file's docstring."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import main  # noqa: E402

if __name__ == "__main__":
    main()
