"""What a run holds, as plain data: the record (and the outbox that keeps it), reading a kept one back checked
(`loading`), filling it from a measured attempt, writing its files."""
