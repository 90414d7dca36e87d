"""verifiers tasksets written for the tests; this directory goes on PYTHONPATH, as an installed package would."""
