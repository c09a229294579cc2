"""The tracking-store boundary, the only code importing MLflow: `connect`, `faults`, `write` (with `model_and_feeds`),
`summary` (a study's end), `kept_runs` (the outbox's runs), `read`, `registry` (a registered model's version, read)."""
