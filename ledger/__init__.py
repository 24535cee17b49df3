"""The SQL ledger, results.tsv export and the MLflow sink."""
