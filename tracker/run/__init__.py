"""What a run holds, as plain data: the record, filling it from a measured attempt, writing its files."""
