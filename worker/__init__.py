"""`prime-worker`: inference engines, the task loop and submission of proven rollouts."""
