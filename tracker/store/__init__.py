"""The tracking-store boundary, the only code importing MLflow: `connect`, `write`, `read`, outbox `upload`."""
