"""Small environments written for the tests: one per adapter, and broken ones the roles must refuse."""
