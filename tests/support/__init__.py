"""Code the tests and benchmarks share and the packages never ship: a coordinator child process, honest and
dishonest rollouts, small random models, ledger and CLI helpers.
"""
