"""TOPLOC proofs over final hidden states, and verifiable sampling."""
