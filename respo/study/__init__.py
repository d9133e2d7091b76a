"""The staleness study (does ReSPO hold up as rollout staleness grows?): ``respo sweep`` runs a
resumable grid of training runs, ``respo report`` turns sweep directories into ``report.md`` with
figures, and `respo.study.run_report` writes the report of a single run."""
