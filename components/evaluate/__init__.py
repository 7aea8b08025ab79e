"""evaluate_model: held-out loss of the base and the tuned model on identical tokens, and the gate."""
