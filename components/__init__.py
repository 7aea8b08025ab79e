"""The pipeline's steps and the programs their pods run (docs/development.md, "Layout")."""
