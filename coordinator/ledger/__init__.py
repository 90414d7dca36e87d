"""The task ledger with its storage: every state change of a run, the rules it applies (leasing, scheduling,
validation, quorum, reputation) and the views, archive and export that read it.
"""
