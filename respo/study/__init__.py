"""The staleness study (issue 5): ``respo sweep`` runs a resumable grid of training runs,
``respo report`` turns sweep directories into ``report.md`` with figures."""
