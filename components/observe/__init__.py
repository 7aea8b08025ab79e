"""Watching a run: its Kubeflow Tensorboard and the alert its exit handler posts."""
