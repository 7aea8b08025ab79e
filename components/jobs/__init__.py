"""The training job kinds and how a job ends, shared by the launcher (components/train/launcher/) and the Katib
search (components/hpo/), which finds its trials' jobs and pods the same way: no Kubernetes writes here."""
