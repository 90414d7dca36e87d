"""The coordinator, the top of the package ladder, in four jobs: ``ledger`` (the task ledger and its
storage), ``loop`` (the RL loop: batches in, policies out), ``processes`` (its children: trainer job,
built-in validator, local network, SLURM allocation) and ``serving`` (the HTTP API, dashboard and gossip).
"""
