"""The coordinator's RL loop: accepted batches in, trained policies published out, with the record of which
submissions made which step.
"""
