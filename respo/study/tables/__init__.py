"""``runs.csv`` (one row per run) and every study table built from it: ``respo table KIND`` and the
tables of ``respo report`` (which lays them out with its figures and prose; it computes no number itself).

A row holds a run's coordinates and the numbers every table aggregates (`COLUMNS`). It is computed
from a run directory (`run_row`) or read back from a ``runs.csv`` that `respo report` wrote
(`read_rows`), so every table can be regenerated from the committed ``runs.csv`` files alone. A
column that an older ``runs.csv`` does not have is printed as ``—`` and named under the table. A
finished run given twice (the same coordinates and seed in two files or directories, or one file
passed twice) is refused in one line naming both places: it would count as two seeds. The tables
that pool runs over seeds (all but ``calib``) refuse runs of two starting policies (``start``) or two rollout
engines (``engine``), and are
labelled under the table when pooled from several inputs whose runs do not all record one.

Per run, over the updates with staleness > 0 (``stale_mean:*``; the first mini-batch of a rollout
step has log W = 0 exactly), and over all updates otherwise:

    late_mean / early_max      mean of the last eighth / best of the first quarter of the scores
    first8_score, last8_score  mean score of the first / last 8 updates (on-policy stability)
    entropy_early, entropy_late  mean per-token policy entropy over the first quarter / the last
                               eighth of the updates (the same windows as early max / late mean)
    pooled_pos_low_w, pooled_neg_low_w  fraction of all stale positives / negatives with log W < −1,
                               pooled from the log W histograms (count-weighted over stale updates)
    step_scores                JSON list: mean score of each complete rollout step (N updates; empty at N = 1)
    seconds_per_update         Σ of every ``time/*`` phase of every logged update / updates logged: all phases, a
                               rollout step's sampling and old log-probs shared out over its N updates
    train_seconds_per_update   mean ``time/train`` (the training forward/backward of one update)
    staleness:<metric>         JSON list, entry s = 0 .. N−1: mean of ``<metric>`` (`STALENESS_METRICS`) over the
                               updates whose mini-batch had staleness s (``staleness_mean`` = s; an update mixing
                               staleness levels, which only asynchronous runs have, is in no entry); null where no
                               such update logged it
    greedy_acc                 held-out greedy accuracy after the last update (one decode per prompt, no
                               sampling noise on the same prompts; NaN when not evaluated)
    start                      the starting policy: 12 hex digits of its weights' sha256 for a loaded policy
                               (warm start, model directory), empty for a preset from scratch or an older run
    engine                     the rollout engine that sampled the run (``rollout_engine``; a runs.csv written
                               before the column held only runs of respo's own sampler)
    mismatch_*                 the engine–trainer mismatch, log ρ = the trainer's log-prob before the update minus
                               the engine's (`CSV_MISMATCH`: mean abs log ρ per token, the sequence log ρ's p10 and
                               p90, the fraction of sequences beyond ±1), over every update; empty for the respo engine

``calib``: one row per run (a calibration sweep), with the greedy accuracy where the runs.csv has that column;
``--cost`` appends seconds per update and training seconds per update. ``staleness``: per (model, objective, N, lr) of finished runs, one table of the
per-staleness metrics (rows) at staleness 0 .. N−1 (columns), each the mean over the seeds that
logged it. ``headline``: per (lr, N, objective) mean ± sample
std over seeds, then each objective against the best baseline of its (lr, N) (GRPO or VESPO, by mean
late mean) on late mean and held-out pass@1 with Welch's t-test, its 95 % interval, the p value
adjusted within the table (Benjamini–Hochberg by default, ``--adjust holm``), the two one-sided
tests of equivalence within ±δ (``--margin``), and the verdict of `respo.study.stats.verdict` from the adjusted p values; last, the
mean score of each rollout step. The tests assume normal per-seed values; with three seeds that
cannot be checked, and no rank test can reach p < .10 at three seeds per side.

``regime``: per response length (``LENGTH=runs.csv`` arguments) and learning rate, the on-policy
control (GRPO at N = 1: late mean, held-out pass@1) next to GRPO's stale-update diagnostics at the
largest N (fraction of stale positives and of stale negatives with log W < −1, log W p10, k3 KL per
token, per-token entropy late in the run, and the same-batch ReSPO / VESPO mass shares), each a mean
over the seeds run (n).

``mismatch``: per (lr, N, objective) of finished runs that logged it, the engine–trainer mismatch (means over
seeds) next to the log W p10 of the stale updates: how large the uncorrected mismatch is against the staleness.

``replay``: per (lr, N, objective) run both ways, MoE routing replay's effect: the mean over seeds
with replay minus without, on late mean and held-out pass@1, tested like ``headline``. Every other
kind keeps the runs without replay unless ``--routing-replay`` asks for those with it.

``fill FILE.md``: regenerate, in place, every block of a markdown file that starts with a line
``<!-- respo table ARGS -->`` (or ``<!-- respo recommend ARGS -->``) and ends with ``<!-- /respo -->``:
the lines between become that command's output (paths relative to the current directory).
"""

# The package, by job (each module says more):
#   runs_csv       the runs.csv format: a run's row, writing and reading runs.csv, the endpoint rule
#   pooling        the selection flags and the checks on pooling runs over seeds (starting policies, engines)
#   common         what the table builders share (formatting, cells, pairing by seed)
#   registry       `TableKind` and `register`: what a kind of `respo table` declares
#   kinds/         one module per table kind, registered in kinds/__init__.py
#   fill_blocks    `respo table fill`: the table blocks of markdown files
#   command        the command line, generated from the registered kinds
#   report_tables  the tables `respo report` lays out
# Every public name below is re-exported here, so `respo.study.tables.X` keeps working.

from respo.study.tables import kinds as _kinds  # registers the built-in kinds
from respo.study.tables.command import add_arguments, run
from respo.study.tables.common import MARGIN, SEED_ENDPOINTS, by_seed, group_rows
from respo.study.tables.fill_blocks import FILL_COMMANDS, fill
from respo.study.tables.kinds.breakdown import BREAKDOWN_SHARE, breakdown_table, broke_down, start_score
from respo.study.tables.kinds.calib import CALIB_HEAD, calib_table
from respo.study.tables.kinds.factorial import FACTORIAL_ARMS, FACTORIAL_DEFAULT, FACTORIAL_METRICS, factorial_table
from respo.study.tables.kinds.headline import BASELINES, headline_tables
from respo.study.tables.kinds.mismatch import mismatch_table
from respo.study.tables.kinds.regime import regime_table
from respo.study.tables.kinds.replay import replay_table
from respo.study.tables.kinds.staleness import STALENESS_ROWS, staleness_tables
from respo.study.tables.pooling import _select, seed_list, starts_by_seed
from respo.study.tables.registry import KINDS, Flag, TableInput, TableKind, register
from respo.study.tables.report_tables import best_lr_cells, cell_table, column_cells, means_row, runs_table
from respo.study.tables.runs_csv import (_SEED_KEY, COLUMNS, CSV_MISMATCH, CSV_METRICS, CSV_SAME_BATCH, EDGE_UPDATES,
                                         STALENESS_METRICS, STALENESS_SHARES, WHERE, TableError, _check_duplicates,
                                         endpoint_gaps, endpoint_rule, read_rows, run_row, write_runs_csv)

__all__ = ["COLUMNS", "CSV_METRICS", "CSV_SAME_BATCH", "CSV_MISMATCH", "EDGE_UPDATES", "TableError", "run_row",
           "write_runs_csv", "seed_list", "starts_by_seed", "read_rows", "calib_table", "headline_tables",
           "staleness_tables", "STALENESS_METRICS", "regime_table", "replay_table", "mismatch_table", "fill",
           "add_arguments", "run"]

#: The endpoints each built-in kind of table pools over seeds (the factorial's are its ``--metrics``; a kind
#: declares its own, `TableKind.endpoints`).
ENDPOINTS = {k.name: k.endpoints for k in _kinds.BUILTIN if k.endpoints and not callable(k.endpoints)}
