"""The self-contained HTML report and the terminal table; imports neither pytest nor torch."""
