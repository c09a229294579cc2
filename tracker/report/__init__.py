"""What a study shows: one attempt's charts, the study's rows, tables and page, and `tracker compare`; no MLflow."""
