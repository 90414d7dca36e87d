"""`prime-validator`: re-checks submitted rollouts and posts signed verdicts."""
