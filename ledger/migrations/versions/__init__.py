"""One module per revision, oldest first: ``r0001_schema_1`` is the schema of the first release."""
