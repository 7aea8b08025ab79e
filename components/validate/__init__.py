"""validate_inputs: every check that can run before a GPU is requested."""
