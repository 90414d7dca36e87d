"""Wire schemas, node identities and signatures, errors, config and logging: what every role shares."""
