"""publish: make the tuned model known outside the run, each optional: a push to a Hugging Face Hub repository
(hub), the evaluation on the run's experiment tracker (tracker), a registration in Kubeflow Model Registry
(model_registry)."""
