"""The coordinator's children: the trainer job, the built-in validator, the local network and the SLURM
allocation that holds them.
"""
