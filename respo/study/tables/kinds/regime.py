"""``respo table regime``: per response length (``LENGTH=runs.csv`` arguments) and learning rate, the on-policy
control (GRPO at N = 1) next to GRPO's stale-update diagnostics at the largest N (`regime_table`)."""

from __future__ import annotations

import argparse
from typing import Sequence

from respo.study.tables.common import SEED_ENDPOINTS, _absent_note, _f, _mean, _ms
from respo.study.tables.pooling import _select
from respo.study.tables.registry import TableKind
from respo.study.tables.runs_csv import TableError, endpoint_rule, read_rows


def regime_table(inputs: Sequence[tuple[int, list[dict], set[str]]]) -> list[str]:
    """Per (response length, lr): GRPO at N = 1 and GRPO's stale diagnostics at the largest N
    (`respo.study.tables`), at the budget most of those runs have. ``inputs``: (length, rows, absent
    columns) per runs.csv."""
    cols = ("stale_mean:frac_pos_low_w", "pooled_neg_low_w", "stale_mean:log_w/p10", "stale_mean:kl_k3",
            "entropy_late", "same_batch_respo_mass_share", "same_batch_vespo_mass_share")
    digits = {"stale_mean:frac_pos_low_w": 4, "pooled_neg_low_w": 4, "stale_mean:log_w/p10": 2,
              "stale_mean:kl_k3": 4, "same_batch_respo_mass_share": 4, "same_batch_vespo_mass_share": 4}
    out = []
    absent_all: set[str] = set()
    for length, rows, absent in inputs:
        fin = [r for r in rows if r["finished"] and r["objective"] == "grpo" and not r["routing_replay"]]
        nmax = max((r["reuse"] for r in fin), default=None)
        if nmax is None or nmax == 1:
            continue
        budgets = [r["updates"] for r in fin if r["reuse"] == nmax]
        fin = [r for r in fin if r["updates"] == max(set(budgets), key=budgets.count)]  # one budget: the most run
        if not out:
            out = [f"| response tokens | lr | GRPO N = 1: late mean | N = 1: pass@1 | GRPO N = {nmax}: seeds | "
                   "stale positives log W<−1 | stale negatives log W<−1 | log W p10 | k3 KL per token | "
                   "entropy (late) | ReSPO / VESPO share (same batch) |", "|" + "---|" * 11]
        absent_all |= absent
        for lr in sorted({r["lr"] for r in fin if r["reuse"] == nmax}):
            on = [r for r in fin if r["reuse"] == 1 and r["lr"] == lr]
            st = [r for r in fin if r["reuse"] == nmax and r["lr"] == lr]
            v = {c: _f(_mean([r[c] for r in st]), digits.get(c, 3)) for c in cols}
            on_cells = (f"{_ms([r['late_mean'] for r in on])} | {_ms([r['pass@1'] for r in on])}" if on else "— | —")
            out.append(f"| {length} | {lr:g} | {on_cells} | {len(st)} | {v[cols[0]]} | {v[cols[1]]} | {v[cols[2]]} | "
                       f"{v[cols[3]]} | {v[cols[4]]} | {v[cols[5]]} / {v[cols[6]]} |")
    if not out:
        raise TableError("no GRPO runs at N > 1 in the given runs.csv files")
    return out + _absent_note(absent_all, cols)


def _main(args: argparse.Namespace) -> int:
    """Print the regime table of the ``LENGTH=RUNS_CSV`` inputs, each selected and its gaps handled on its own."""
    inputs, notes = [], []
    for spec in args.paths:
        length, sep, path = spec.partition("=")
        if not sep or not length.isdigit():
            raise TableError(f"expected LENGTH=RUNS_CSV (e.g. 128=runs.csv), got {spec!r}")
        rows, absent = read_rows([path])
        rows, left = endpoint_rule(_select(rows, args), SEED_ENDPOINTS, skip=args.skip_missing)
        inputs.append((int(length), rows, absent))
        notes += left
    print("\n".join(regime_table(inputs) + notes))
    return 0


KIND = TableKind("regime", "GRPO's log W spread per response length and lr (LENGTH=runs.csv arguments)", main=_main,
                 paths="LENGTH=runs.csv", endpoints=SEED_ENDPOINTS)
