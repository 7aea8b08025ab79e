"""Hyper-parameter search: a Katib Experiment whose trials are the run's own training job, cut short."""
