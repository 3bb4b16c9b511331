"""respawn's JAX trainer: resumes exactly from Orbax checkpoints and saves on the preemption notice."""
