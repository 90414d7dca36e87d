"""The process runtime every command shares: config loading, the CLI frame, logs, child processes, SLURM jobs,
first contact and the libp2p host. Above the wire contract (protocol/), below every building block and role.
"""
