"""The real-model learning-rate bracket's verdict (reports/real/branches/preregistration.md, part 1).

Each N = 1 run's held-out pass@1 (mean@k per prompt) after training is compared with the starting policy's,
measured once by the sweep on the same prompts with the same evaluation draws, prompt by prompt: the paired
difference after − before over the P prompts, with its 95 % t interval. The study's rate is the smallest
whose interval lies above zero; if none, the largest whose interval does not lie below zero.

    python scripts/real_bracket.py collect runs/real/bracket --out reports/real/bracket/evals.json
    python scripts/real_bracket.py table reports/real/bracket/evals.json

``collect`` keeps what the verdict needs from the sweep directory (the baseline's and each finished run's
per-prompt means, with their settings) so that ``table`` recomputes it from the committed file alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from respo.fileio import write_text_atomic
from respo.study.stats import paired

KEEP = ("prompts", "k", "pass@1", "pass@1_se", "greedy_acc", "greedy_acc_se", "response_length", "per_prompt_mean")


def collect(sweep: Path, out: Path) -> None:
    (base_file,) = sorted((sweep / "baseline_eval").glob("*.json"))
    base = json.loads(base_file.read_text())
    runs = []
    for rd in sorted((sweep / "runs").iterdir()):
        summary = rd / "summary.json"
        if not summary.is_file():
            print(f"[bracket] {rd.name}: not finished, left out", file=sys.stderr)
            continue
        s, cfg = json.loads(summary.read_text()), json.loads((rd / "config.json").read_text())
        runs.append({"run": rd.name, "lr": cfg["lr"], "reuse": cfg["reuse"], "updates": s["updates"],
                     "seed": cfg["seed"], "start": (cfg.get("policy") or {}).get("weights_sha256", "")[:12],
                     "engine": cfg.get("rollout_engine"), "after": {k: s["eval_after"][k] for k in KEEP}})
    record = {"before": {"policy": base["policy"].get("weights_sha256", "")[:12], "protocol": base["protocol"],
                         "eval": {k: base["eval"][k] for k in KEEP}}, "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(record, indent=1) + "\n")
    print(f"[bracket] {len(runs)} finished run(s) -> {out}")


def paired_interval(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """Mean of after − before over prompts and its 95 % t interval (`respo.study.stats.paired`)."""
    if len(before) != len(after) or len(before) < 2:
        raise SystemExit(f"paired prompts needed: {len(before)} before, {len(after)} after")
    t = paired(after, before)
    return t.diff, t.ci_low, t.ci_high


def table(path: Path) -> None:
    rec = json.loads(path.read_text())
    before = rec["before"]["eval"]
    print(f"Start {rec['before']['policy']}: held-out pass@1 {before['pass@1']:.3f} ± {before['pass@1_se']:.3f} "
          f"(se), greedy {before['greedy_acc']:.3f}, {before['prompts']} prompts x {before['k']} samples\n")
    print("| lr | N | updates | pass@1 after | Δ pass@1 (after − before) | 95 % CI over prompts | greedy after |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for r in sorted(rec["runs"], key=lambda r: r["lr"]):
        if r["start"] != rec["before"]["policy"]:
            raise SystemExit(f"{r['run']} started from {r['start']}, the baseline is {rec['before']['policy']}")
        a = r["after"]
        m, lo, hi = paired_interval(before["per_prompt_mean"], a["per_prompt_mean"])
        rows.append((r["lr"], lo, hi))
        print(f"| {r['lr']:g} | {r['reuse']} | {r['updates']} | {a['pass@1']:.3f} | {m:+.3f} | [{lo:+.3f}, {hi:+.3f}] "
              f"| {a['greedy_acc']:.3f} |")
    gains = [lr for lr, lo, _ in rows if lo > 0]
    harmless = [lr for lr, _, hi in rows if hi >= 0]
    if gains:
        print(f"\nRule: the smallest rate whose interval lies above zero: lr {min(gains):g}.")
    elif harmless:
        print(f"\nRule: no rate's interval lies above zero; the largest whose interval does not lie below zero: "
              f"lr {max(harmless):g} (the control did not learn within these updates).")
    else:
        print("\nRule: every rate's interval lies below zero: no rate qualifies.")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("sweep", type=Path)
    c.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("evals", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "collect":
        collect(args.sweep, args.out)
    else:
        table(args.evals)


if __name__ == "__main__":
    main()
