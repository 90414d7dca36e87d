"""`prime-worker`: the task loop (lease, generate, prove, submit), its devices and its SLURM job arrays."""
