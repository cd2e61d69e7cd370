"""Training progress: the step counter a job already prints in its log or serves as a metric."""
