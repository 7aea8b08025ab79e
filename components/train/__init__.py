"""The train step: the trainer entry point the job's pods run, and the backends that launch it."""
