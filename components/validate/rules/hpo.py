"""The hyper-parameter search's rules live with the search (components/hpo/space.py), which asks them again before
its first trial; validate_inputs asks them here."""

from __future__ import annotations

from components.hpo.space import check_hpo_settings

__all__ = ["check_hpo_settings"]
