"""A run history: earlier sessions' results, the series of each test and metric in them, and their change points."""
