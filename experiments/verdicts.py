"""The verdict index: every claim declared in experiments/claims/*.toml, decided from the per-seed
run files committed under results/, written to results/VERDICTS.md.

One rule for every study (:mod:`fresh_rl.eval.claims`, docs/statistics.md): per cell the paired
seed differences a − b; the cells that pass the claim's gates; one pooled Student-t test over
seeds of each seed's mean difference across those cells; the cells shown Holm-corrected. The
verdict is *reproduced*, *refuted*, *undecided* (the interval spans 0) or *not testable here*
(a gate failed). Each study has a reader (:data:`fresh_rl.eval.verdicts.READERS`) that turns
its committed files into per-seed values (``series``) and gate measurements (``measure``);
nothing is trained or recomputed.

    python experiments/verdicts.py                 # rewrite results/VERDICTS.md (clean checkout)
    python experiments/verdicts.py --allow-dirty   # ... from a checkout with uncommitted code
    python experiments/verdicts.py --check         # exit 1 if results/VERDICTS.md is stale

The index is stamped with the commit of the code that wrote it; a ``+dirty`` stamp is refused
unless ``--allow-dirty`` (:func:`fresh_rl.provenance.require_clean`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fresh_rl.eval.verdicts import INDEX, is_current, write_index
from fresh_rl.provenance import git_commit


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=INDEX)
    parser.add_argument("--allow-dirty", action="store_true",
                        help="stamp the index although the code has uncommitted edits (+dirty)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if --out differs from a rebuild (stamp line ignored)")
    args = parser.parse_args(argv)
    if args.check:
        stale = not is_current(args.out)
        print(f"{args.out} is {'stale: rebuild it' if stale else 'current'}")
        return int(stale)
    write_index(args.out, git_commit(), args.allow_dirty)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
